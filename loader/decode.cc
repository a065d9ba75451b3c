#include "loader/decode.h"

#include <simdjson.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/json.h"
#include "format/npy.h"
#include "format/shard_reader.h"

namespace kiln::loader::detail {

namespace {

// A unit being filled from the shard: its members' .tokens.npy and keys, in visiting order.
struct Fill {
  Unit* unit;
  std::vector<std::string> npy, keys;
  std::vector<std::string> mask;  // <key>.mask.npy, empty for documents without one
};

// Stores the members' tokens into the unit (eos after each document, the first skip_tokens of
// the first one dropped): 16 bits wide when every member is uint16 and eos fits, else 32. A kData
// / kConfig naming the member, without the shard.
template <typename T>
Status pack_as(const DecodeOptions& options, uint64_t vocab, const std::vector<NpyView>& views,
               const Fill& f, uint64_t total, std::vector<T>* tokens) {
  Unit* unit = f.unit;
  const UnitPlan& plan = unit->plan;
  // (A recycled buffer keeps its old size: resize() then only zero-fills the growth.)
  tokens->resize(total);
  unit->doc_start.resize(views.size() + 1);
  T* out = tokens->data();
  uint64_t at = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    const NpyView& v = views[i];
    unit->doc_start[i] = at;
    const uint64_t from = i == 0 ? std::min<uint64_t>(plan.skip_tokens, v.size) : 0;
    const uint64_t n = v.size - from;
    uint32_t max_id = 0;
    T* dst = out + at;
    if (sizeof(T) == 2) {
      // uint16 ids: the bytes as they are (little-endian host: x86-64, aarch64), then their max.
      std::memcpy(dst, v.data + 2 * from, 2 * n);
      uint16_t m = 0;
      for (uint64_t t = 0; t < n; ++t) m = std::max<uint16_t>(m, static_cast<uint16_t>(dst[t]));
      max_id = m;
    } else if (v.dtype == NpyDtype::kU16) {
      const auto* p = reinterpret_cast<const unsigned char*>(v.data) + 2 * from;
      for (uint64_t t = 0; t < n; ++t) {
        const uint32_t id =
            static_cast<uint32_t>(p[2 * t]) | (static_cast<uint32_t>(p[2 * t + 1]) << 8);
        max_id = std::max(max_id, id);
        dst[t] = static_cast<T>(id);
      }
    } else {
      std::memcpy(dst, v.data + 4 * from, 4 * n);  // little-endian host (x86-64, aarch64)
      for (uint64_t t = 0; t < n; ++t) max_id = std::max<uint32_t>(max_id, dst[t]);
    }
    at += n;
    if (vocab > 0 && n > 0 && max_id >= vocab) {
      return Status::data("member '" + f.keys[i] + ".tokens.npy' holds token id " +
                          std::to_string(max_id) + " >= vocab_size " + std::to_string(vocab));
    }
    out[at++] = static_cast<T>(options.eos);
  }
  unit->doc_start[views.size()] = at;
  KILN_CHECK(at == tokens->size());
  return Status::ok();
}

Status pack(const Manifest& manifest, const DecodeOptions& options, Fill& f) {
  Unit* unit = f.unit;
  const UnitPlan& plan = unit->plan;
  std::vector<NpyView> views(f.npy.size());
  uint64_t total = 0;
  bool narrow = options.eos <= UINT16_MAX;
  for (size_t i = 0; i < f.npy.size(); ++i) {
    auto v = npy_parse(f.npy[i]);
    if (!v) return std::move(v).take_status().prefixed("member '" + f.keys[i] + ".tokens.npy'");
    views[i] = *v;
    total += v->size + 1;
    narrow = narrow && v->dtype == NpyDtype::kU16;
  }
  if (!views.empty() && plan.skip_tokens >= views[0].size + 1) {
    return Status::config("the loader state's position (" + std::to_string(plan.skip_tokens) +
                          " tokens into '" + f.keys[0] +
                          "') is past that document's end; the data changed?");
  }
  total -= views.empty() ? 0 : std::min<uint64_t>(plan.skip_tokens, views[0].size);
  const uint64_t vocab = manifest.tokenizer.vocab_size;
  unit->narrow = narrow;
  // A recycled buffer of the other width is let go (a dataset's shards are all of one dtype).
  Status packed;
  if (narrow) {
    std::vector<uint32_t>().swap(unit->tokens);
    packed = pack_as<uint16_t>(options, vocab, views, f, total, &unit->tokens16);
  } else {
    std::vector<uint16_t>().swap(unit->tokens16);
    packed = pack_as<uint32_t>(options, vocab, views, f, total, &unit->tokens);
  }
  if (!packed.is_ok()) return packed;
  // Loss masks: only when some document has one (plain datasets keep an empty Unit::loss).
  unit->loss.clear();
  bool any_mask = false;
  for (const auto& m : f.mask) any_mask |= !m.empty();
  if (!any_mask) return Status::ok();
  unit->loss.assign(unit->size(), 1);
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

// A thread's simdjson parser and padded copy (the ids' fast path below).
struct IdParser {
  IdParser() {
    if (parser.allocate(4096, kMaxJsonDepth) != simdjson::SUCCESS) std::abort();
  }
  simdjson::dom::parser parser;
  std::string padded;
};

// The id as nlohmann::json's dump() writes it, found with simdjson, for the ids kiln prep writes
// (an object with one "id": a string without quotes, backslashes or control bytes, or an integer);
// false for anything else, which goes through nlohmann::json itself.
bool fast_sample_id(std::string_view json, std::string* id) {
  thread_local IdParser p;
  const size_t first = json.find("\"id\"");
  if (first == std::string_view::npos || json.find("\"id\"", first + 1) != std::string_view::npos) {
    return false;  // no id, or maybe two (nlohmann keeps the last one)
  }
  p.padded.resize(json.size() + simdjson::SIMDJSON_PADDING);
  std::memcpy(p.padded.data(), json.data(), json.size());
  std::memset(p.padded.data() + json.size(), 0, simdjson::SIMDJSON_PADDING);
  simdjson::dom::element root;
  if (p.parser.parse(p.padded.data(), json.size(), false).get(root) != simdjson::SUCCESS) {
    return false;
  }
  simdjson::dom::object obj;
  simdjson::dom::element v;
  if (root.get_object().get(obj) != simdjson::SUCCESS || obj["id"].get(v) != simdjson::SUCCESS) {
    return false;
  }
  std::string_view sv;
  int64_t i = 0;
  uint64_t u = 0;
  if (v.get_string().get(sv) == simdjson::SUCCESS) {
    for (unsigned char c : sv) {
      if (c < 0x20 || c == '"' || c == '\\') return false;  // escaped by dump(): its own path
    }
    id->assign(1, '"');
    id->append(sv);
    id->push_back('"');
    return true;
  }
  if (v.get_int64().get(i) == simdjson::SUCCESS) {
    *id = std::to_string(i);
    return true;
  }
  if (v.get_uint64().get(u) == simdjson::SUCCESS) {
    *id = std::to_string(u);
    return true;
  }
  return false;
}

// The "id" of a sample's .json as raw JSON text (a string or a number, as nlohmann::json dumps
// it), into *id.
Status sample_id(const std::string& key, const std::string& json, std::string* id) {
  if (json.size() < 4096 && fast_sample_id(json, id)) return Status::ok();
  if (Status depth = check_json_depth(json); !depth.is_ok()) {
    return std::move(depth).prefixed("member '" + key + ".json'");
  }
  try {
    auto j = nlohmann::json::parse(json);
    auto it = j.find("id");
    if (!j.is_object() || it == j.end() || !(it->is_string() || it->is_number())) {
      return Status::data("member '" + key + ".json': no \"id\" (string or number)");
    }
    *id = it->dump();
  } catch (const nlohmann::json::exception& e) {
    return Status::data("member '" + key + ".json' is not valid JSON: " + e.what());
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
  // Only the planned samples' .tokens.npy, .mask.npy (and .json for ids) are copied out of the
  // stream.
  ShardReaderOptions ro = Manifest::reader_options(sh, options.verify_checksums);
  ro.want = [&](uint64_t i, std::string_view ext) {
    if (i >= slot_of.size()) return true;  // past the manifest's count: an error below
    if (slot_of[i].first < 0) return false;
    return ext == "tokens.npy" || ext == "mask.npy" || (options.sample_ids && ext == "json");
  };
  auto reader = ShardReader::open(path, std::move(ro));
  if (!reader) return fail(std::move(reader).take_status());
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
      if (Status st = sample_id(sample.key, js->data, &fill.unit->ids[slot]); !st.is_ok()) {
        return fail(std::move(st));
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
