#include "loader/pack.h"

#include <algorithm>
#include <cstring>

#include "loader/order.h"

namespace kiln::loader::detail {

int choose_domain(const std::vector<double>& weights, uint64_t seed, uint64_t index) {
  const double u = mix_uniform(seed, index);
  double acc = 0;
  int last = -1;
  for (size_t d = 0; d < weights.size(); ++d) {
    if (weights[d] <= 0) continue;
    last = static_cast<int>(d);
    acc += weights[d];
    if (u < acc) return last;
  }
  return last;
}

FillResult fill_row(const UnitFetch& fetch, std::shared_ptr<const Unit>* current, Pos* pos,
                    int64_t width, uint32_t* dst, std::vector<DocSpan>* spans, Status* error,
                    uint8_t* loss) {
  Pos& p = *pos;
  int64_t filled = 0;
  while (filled < width) {
    auto& u = *current;
    if (!u || u->plan.seq != p.unit) {
      u = fetch(p.unit);
      if (!u) return FillResult::kAbandoned;
    }
    if (!u->status.is_ok()) {
      *error = u->status;
      return FillResult::kFailed;
    }
    if (p.doc >= u->docs()) {
      ++p.unit;
      p.doc = p.tok = 0;
      continue;
    }
    const uint64_t begin = u->doc_start[p.doc] + p.tok;
    const uint64_t end = u->doc_start[p.doc + 1];
    const uint64_t take = std::min<uint64_t>(end - begin, width - filled);
    u->copy_tokens(begin, take, dst + filled);
    if (loss && u->loss.empty())
      std::memset(loss + filled, 1, take);
    else if (loss)
      std::memcpy(loss + filled, u->loss.data() + begin, take);
    DocSpan s;
    s.shard = u->plan.shard;
    s.member = u->plan.members[p.doc];
    s.epoch = u->plan.epoch;
    s.doc_offset = static_cast<uint32_t>((p.doc == 0 ? u->plan.skip_tokens : 0) + p.tok);
    s.length = static_cast<uint32_t>(take);
    s.seq_offset = static_cast<uint32_t>(filled);
    s.ends = begin + take == end;
    if (!u->ids.empty()) s.id = u->ids[p.doc];
    spans->push_back(std::move(s));
    filled += static_cast<int64_t>(take);
    p.tok += take;
    if (begin + take == end) {
      ++p.doc;
      p.tok = 0;
    }
  }
  return FillResult::kFilled;
}

}  // namespace kiln::loader::detail
