#include "loader/decode.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "format/npy.h"
#include "common/json.h"
#include "format/shard_reader.h"

namespace kiln::loader::detail {

void decode_unit(const Manifest& manifest, const DecodeOptions& options,
                 const std::atomic<bool>& abort, Unit* unit) {
  const UnitPlan& plan = unit->plan;
  const ManifestShard& sh = manifest.shards[plan.shard];
  std::string path = manifest.shard_path(sh);
  auto fail = [&](Status st) {
    // Name the shard once (the shard reader's own errors already do).
    if (st.to_string().find(path) == std::string::npos) {
      unit->status = std::move(st).prefixed("shard '" + path + "'");
    } else {
      unit->status = std::move(st);
    }
  };
  Result<std::string> checked = manifest.checked_shard_path(sh);
  if (!checked.is_ok()) return fail(std::move(checked).take_status());
  auto reader = ShardReader::open(path, Manifest::reader_options(sh, options.verify_checksums));
  if (!reader) return fail(std::move(reader).take_status());

  std::vector<int32_t> slot_of(sh.samples, -1);
  for (size_t i = 0; i < plan.members.size(); ++i) slot_of[plan.members[i]] = static_cast<int32_t>(i);
  std::vector<std::string> npy(plan.members.size());
  std::vector<std::string> keys(plan.members.size());
  if (options.sample_ids) unit->ids.assign(plan.members.size(), std::string());
  ShardSample sample;
  uint64_t index = 0;
  while (true) {
    if (abort.load(std::memory_order_relaxed)) {
      unit->status = Status::internal("loader stopped");
      return;
    }
    auto more = (*reader)->next(&sample);
    if (!more) return fail(std::move(more).take_status());
    if (!*more) break;
    if (index >= sh.samples) {
      return fail(Status::data("holds more samples than the manifest's " +
                               std::to_string(sh.samples)));
    }
    const int32_t slot = slot_of[index++];
    if (slot < 0) continue;
    keys[slot] = sample.key;
    for (auto& m : sample.members) {
      if (m.ext == "tokens.npy") npy[slot] = std::move(m.data);
    }
    if (!sample.find("tokens.npy")) {
      return fail(Status::data("member '" + sample.key + ".tokens.npy' is missing"));
    }
    if (options.sample_ids) {
      const ShardMember* js = sample.find("json");
      if (!js) return fail(Status::data("member '" + sample.key + ".json' is missing"));
      if (Status depth = check_json_depth(js->data); !depth.is_ok()) {
        return fail(std::move(depth).prefixed("member '" + sample.key + ".json'"));
      }
      try {
        auto j = nlohmann::json::parse(js->data);
        auto it = j.find("id");
        if (!j.is_object() || it == j.end() || !(it->is_string() || it->is_number())) {
          return fail(Status::data("member '" + sample.key +
                                   ".json': no \"id\" (string or number)"));
        }
        unit->ids[slot] = it->dump();
      } catch (const nlohmann::json::exception& e) {
        return fail(Status::data("member '" + sample.key + ".json' is not valid JSON: " +
                                 e.what()));
      }
    }
  }
  unit->tar_bytes = (*reader)->tar_bytes();
  if (index != sh.samples) {
    return fail(Status::data("holds " + std::to_string(index) + " samples, the manifest says " +
                             std::to_string(sh.samples)));
  }
  // Pack: widen to uint32, append eos after every document.
  const uint64_t vocab = manifest.tokenizer.vocab_size;
  std::vector<NpyView> views(npy.size());
  uint64_t total = 0;
  for (size_t i = 0; i < npy.size(); ++i) {
    auto v = npy_parse(npy[i]);
    if (!v) {
      return fail(std::move(v).take_status().prefixed("member '" + keys[i] + ".tokens.npy'"));
    }
    views[i] = *v;
    total += v->size + 1;
  }
  if (!views.empty() && plan.skip_tokens >= views[0].size + 1) {
    return fail(Status::config("the loader state's position (" +
                               std::to_string(plan.skip_tokens) + " tokens into '" + keys[0] +
                               "') is past that document's end; the data changed?"));
  }
  // (A recycled buffer keeps its old size: resize() then only zero-fills the growth.)
  unit->tokens.resize(total - (views.empty() ? 0 : plan.skip_tokens));
  unit->doc_start.resize(views.size() + 1);
  uint32_t* out = unit->tokens.data();
  uint64_t at = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    const NpyView& v = views[i];
    unit->doc_start[i] = at;
    const uint64_t from = i == 0 ? std::min<uint64_t>(plan.skip_tokens, v.size) : 0;
    uint32_t max_id = 0;
    if (v.dtype == NpyDtype::kU16) {
      const auto* p = reinterpret_cast<const unsigned char*>(v.data);
      for (uint64_t t = from; t < v.size; ++t) {
        const uint32_t id = static_cast<uint32_t>(p[2 * t]) | (static_cast<uint32_t>(p[2 * t + 1]) << 8);
        max_id = std::max(max_id, id);
        out[at++] = id;
      }
    } else {
      const auto* p = reinterpret_cast<const unsigned char*>(v.data);
      for (uint64_t t = from; t < v.size; ++t) {
        uint32_t id;
        std::memcpy(&id, p + 4 * t, 4);  // little-endian host (x86-64, aarch64)
        max_id = std::max(max_id, id);
        out[at++] = id;
      }
    }
    if (vocab > 0 && v.size > from && max_id >= vocab) {
      return fail(Status::data("member '" + keys[i] + ".tokens.npy' holds token id " +
                               std::to_string(max_id) + " >= vocab_size " + std::to_string(vocab)));
    }
    out[at++] = options.eos;
  }
  unit->doc_start[views.size()] = at;
  KILN_CHECK(at == unit->tokens.size());
}

}  // namespace kiln::loader::detail
