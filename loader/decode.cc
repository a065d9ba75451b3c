#include "loader/decode.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "format/npy.h"
#include "common/json.h"
#include "format/shard_reader.h"

namespace kiln::loader::detail {

namespace {

// A unit being filled from the shard: its members' .tokens.npy and keys, in visiting order.
struct Fill {
  Unit* unit;
  std::vector<std::string> npy, keys;
  std::vector<std::string> mask;  // <key>.mask.npy, empty for documents without one
};

// Widens the members' tokens into unit->tokens (eos after each document, the first skip_tokens
// of the first one dropped). A kData / kConfig naming the member, without the shard.
Status pack(const Manifest& manifest, const DecodeOptions& options, Fill& f) {
  Unit* unit = f.unit;
  const UnitPlan& plan = unit->plan;
  const uint64_t vocab = manifest.tokenizer.vocab_size;
  std::vector<NpyView> views(f.npy.size());
  uint64_t total = 0;
  for (size_t i = 0; i < f.npy.size(); ++i) {
    auto v = npy_parse(f.npy[i]);
    if (!v) return std::move(v).take_status().prefixed("member '" + f.keys[i] + ".tokens.npy'");
    views[i] = *v;
    total += v->size + 1;
  }
  if (!views.empty() && plan.skip_tokens >= views[0].size + 1) {
    return Status::config("the loader state's position (" + std::to_string(plan.skip_tokens) +
                          " tokens into '" + f.keys[0] +
                          "') is past that document's end; the data changed?");
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
        const uint32_t id =
            static_cast<uint32_t>(p[2 * t]) | (static_cast<uint32_t>(p[2 * t + 1]) << 8);
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
      return Status::data("member '" + f.keys[i] + ".tokens.npy' holds token id " +
                          std::to_string(max_id) + " >= vocab_size " + std::to_string(vocab));
    }
    out[at++] = options.eos;
  }
  unit->doc_start[views.size()] = at;
  KILN_CHECK(at == unit->tokens.size());
  // Loss masks: only when some document has one (plain datasets keep an empty Unit::loss).
  unit->loss.clear();
  bool any_mask = false;
  for (const auto& m : f.mask) any_mask |= !m.empty();
  if (!any_mask) return Status::ok();
  unit->loss.assign(unit->tokens.size(), 1);
  for (size_t i = 0; i < views.size(); ++i) {
    if (f.mask[i].empty()) continue;
    auto mv = npy_parse(f.mask[i]);
    if (!mv) return std::move(mv).take_status().prefixed("member '" + f.keys[i] + ".mask.npy'");
    if (mv->dtype != NpyDtype::kU8 || mv->size != views[i].size)
      return Status::data(
          "member '" + f.keys[i] + ".mask.npy' must be uint8 with one entry per token (" +
          std::to_string(views[i].size) + " tokens, " + std::to_string(mv->size) + " entries)");
    const uint64_t from = i == 0 ? std::min<uint64_t>(plan.skip_tokens, views[i].size) : 0;
    uint64_t o = unit->doc_start[i];
    for (uint64_t t = from; t < mv->size; ++t) unit->loss[o++] = mv->at(t) ? 1 : 0;
    unit->loss[o] = 0;  // the eos after a conversation is not a target
  }
  return Status::ok();
}

}  // namespace

void decode_unit(const Manifest& manifest, const DecodeOptions& options,
                 const std::atomic<bool>& abort, Unit* unit, const std::vector<Unit*>& siblings) {
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

  // Which unit and slot each tar-order sample goes to (-1: none). Siblings (other streams' parts
  // of the same shard and epoch) are disjoint from the unit and from each other.
  std::vector<Fill> fills;
  fills.push_back({unit, {}, {}, {}});
  for (Unit* u : siblings) {
    KILN_CHECK(u->plan.shard == plan.shard, "a sibling unit of another shard");
    fills.push_back({u, {}, {}, {}});
  }
  std::vector<std::pair<int32_t, int32_t>> slot_of(sh.samples, {-1, -1});
  for (size_t f = 0; f < fills.size(); ++f) {
    const UnitPlan& fp = fills[f].unit->plan;
    fills[f].npy.resize(fp.members.size());
    fills[f].keys.resize(fp.members.size());
    fills[f].mask.assign(fp.members.size(), std::string());
    if (options.sample_ids) fills[f].unit->ids.assign(fp.members.size(), std::string());
    for (size_t i = 0; i < fp.members.size(); ++i) {
      KILN_CHECK(fp.members[i] < sh.samples && slot_of[fp.members[i]].first < 0,
                 "overlapping units of one shard");
      slot_of[fp.members[i]] = {static_cast<int32_t>(f), static_cast<int32_t>(i)};
    }
  }
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
    const auto [f, slot] = slot_of[index++];
    if (f < 0) continue;
    Fill& fill = fills[f];
    fill.keys[slot] = sample.key;
    for (auto& m : sample.members) {
      if (m.ext == "tokens.npy")
        fill.npy[slot] = std::move(m.data);
      else if (m.ext == "mask.npy")
        fill.mask[slot] = std::move(m.data);
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
        fill.unit->ids[slot] = it->dump();
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
  if (Status st = pack(manifest, options, fills[0]); !st.is_ok()) return fail(std::move(st));
  // A sibling that does not pack keeps its status; the loader drops it (its stream decodes the
  // shard itself later and meets the error there).
  for (size_t f = 1; f < fills.size(); ++f) {
    if (Status st = pack(manifest, options, fills[f]); !st.is_ok())
      fills[f].unit->status = std::move(st);
  }
}

}  // namespace kiln::loader::detail
