// LoaderState serialisation and merging; Batch helpers.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/hash.h"
#include "common/json.h"
#include "loader/loader.h"

namespace kiln::loader {

namespace {

constexpr const char* kStateFormat = "kiln-loader-state/2";

using nlohmann::json;

Status bad(const std::string& origin, const std::string& key, const std::string& what) {
  Status st = Status::config("loader state: " + what).with_key(key);
  if (!origin.empty()) st.with_file(origin);
  return st;
}

}  // namespace

std::vector<int32_t> Batch::doc_starts(int64_t i) const {
  std::vector<int32_t> out;
  for (const DocSpan& s : docs[i]) {
    if (s.doc_offset == 0) out.push_back(static_cast<int32_t>(s.seq_offset));
  }
  return out;
}

std::string LoaderState::to_json() const {
  json j = json::object();
  j["format"] = kStateFormat;
  j["dataset"] = hex64(dataset);
  j["seed"] = seed;
  j["partitions"] = partitions;
  j["global_batch"] = global_batch;
  j["world"] = world;
  j["micro_batch"] = micro_batch;
  j["step"] = step;
  j["micro"] = micro;
  j["skipped_shards"] = skipped_shards;
  json hist = json::array();
  for (const auto& h : weights_history) {
    json w = json::object();
    for (const auto& [name, value] : h.weights) w[name] = value;
    hist.push_back({{"step", h.step}, {"weights", w}});
  }
  j["weights_history"] = hist;
  json ranks_json = json::array();
  for (const auto& r : cursors) {
    json doms = json::object();
    for (const auto& [name, c] : r.domains) {
      json pending = json::array();
      for (const auto& iv : c.pending) {
        pending.push_back({iv.epoch, iv.begin, iv.end, iv.skip_tokens});
      }
      doms[name] = {{"next_epoch", c.next_epoch}, {"sequences", c.sequences},
                    {"pending", pending}};
    }
    ranks_json.push_back({{"partition", r.partition}, {"domains", doms}});
  }
  j["cursors"] = ranks_json;
  return j.dump();
}

Result<LoaderState> LoaderState::from_json(std::string_view text, const std::string& origin) {
  json j;
  try {
    j = parse_untrusted_json_or_throw(text);
  } catch (const json::exception& e) {
    return bad(origin, "", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return bad(origin, "", "expected a JSON object");
  LoaderState s;
  // Typed field access with the key named on error.
  auto need = [&](const json& obj, const char* key, const std::string& path) -> Result<json> {
    auto it = obj.find(key);
    if (it == obj.end()) return bad(origin, path, "missing");
    return *it;
  };
  auto as_u64 = [&](const json& v, const std::string& path) -> Result<uint64_t> {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      return bad(origin, path, "expected a non-negative integer");
    }
    return v.get<uint64_t>();
  };
  try {
    KILN_ASSIGN_OR_RETURN(json fmt, need(j, "format", "format"));
    if (!fmt.is_string() || fmt.get<std::string>() != kStateFormat) {
      if (fmt.is_string() && fmt.get<std::string>() == "kiln-loader-state/1") {
        return bad(origin, "format",
                   "a kiln-loader-state/1 position (per physical rank) cannot continue in the "
                   "global-batch order of kiln-loader-state/2; start the data afresh");
      }
      return bad(origin, "format", std::string("expected \"") + kStateFormat + "\"");
    }
    KILN_ASSIGN_OR_RETURN(json ds, need(j, "dataset", "dataset"));
    if (!ds.is_string()) return bad(origin, "dataset", "expected 16 hex digits");
    auto fp = parse_hex64(ds.get<std::string>());
    if (!fp) return bad(origin, "dataset", "expected 16 hex digits");
    s.dataset = *fp;
    KILN_ASSIGN_OR_RETURN(json v, need(j, "seed", "seed"));
    KILN_ASSIGN_OR_RETURN(s.seed, as_u64(v, "seed"));
    auto bounded = [&](const char* key, uint64_t lo, uint64_t hi) -> Result<uint64_t> {
      KILN_ASSIGN_OR_RETURN(json x, need(j, key, key));
      KILN_ASSIGN_OR_RETURN(uint64_t n, as_u64(x, key));
      if (n < lo || n > hi) return bad(origin, key, "out of range");
      return n;
    };
    KILN_ASSIGN_OR_RETURN(uint64_t parts, bounded("partitions", 1, 1u << 24));
    s.partitions = static_cast<int64_t>(parts);
    KILN_ASSIGN_OR_RETURN(uint64_t gb, bounded("global_batch", 1, 1ull << 40));
    s.global_batch = static_cast<int64_t>(gb);
    if (s.global_batch % s.partitions != 0) {
      return bad(origin, "partitions", "does not divide global_batch");
    }
    KILN_ASSIGN_OR_RETURN(uint64_t world, bounded("world", 1, 1u << 24));
    s.world = static_cast<int>(world);
    KILN_ASSIGN_OR_RETURN(uint64_t mb, bounded("micro_batch", 1, 1u << 20));
    s.micro_batch = static_cast<int64_t>(mb);
    KILN_ASSIGN_OR_RETURN(uint64_t step, bounded("step", 0, 1ull << 62));
    s.step = static_cast<int64_t>(step);
    KILN_ASSIGN_OR_RETURN(uint64_t micro, bounded("micro", 0, 1ull << 40));
    s.micro = static_cast<int64_t>(micro);
    if (auto it = j.find("skipped_shards"); it != j.end()) {
      KILN_ASSIGN_OR_RETURN(s.skipped_shards, as_u64(*it, "skipped_shards"));
    }
    KILN_ASSIGN_OR_RETURN(json hist, need(j, "weights_history", "weights_history"));
    if (!hist.is_array()) return bad(origin, "weights_history", "expected an array");
    int64_t prev_step = -1;
    for (size_t i = 0; i < hist.size(); ++i) {
      const std::string path = "weights_history[" + std::to_string(i) + "]";
      if (!hist[i].is_object()) return bad(origin, path, "expected an object");
      WeightChange wc;
      KILN_ASSIGN_OR_RETURN(v, need(hist[i], "step", path + ".step"));
      KILN_ASSIGN_OR_RETURN(uint64_t st, as_u64(v, path + ".step"));
      wc.step = static_cast<int64_t>(st);
      if (wc.step <= prev_step) return bad(origin, path + ".step", "steps must increase");
      prev_step = wc.step;
      KILN_ASSIGN_OR_RETURN(v, need(hist[i], "weights", path + ".weights"));
      if (!v.is_object()) return bad(origin, path + ".weights", "expected an object");
      for (const auto& [name, w] : v.items()) {
        if (!w.is_number() || !std::isfinite(w.get<double>()) || w.get<double>() < 0) {
          return bad(origin, path + ".weights." + name, "expected a non-negative number");
        }
        wc.weights.set(name, w.get<double>());
      }
      s.weights_history.push_back(std::move(wc));
    }
    KILN_ASSIGN_OR_RETURN(json ranks_json, need(j, "cursors", "cursors"));
    if (!ranks_json.is_array() || ranks_json.empty()) {
      return bad(origin, "cursors", "expected a non-empty array");
    }
    for (size_t i = 0; i < ranks_json.size(); ++i) {
      const std::string path = "cursors[" + std::to_string(i) + "]";
      const json& rj = ranks_json[i];
      if (!rj.is_object()) return bad(origin, path, "expected an object");
      PartitionCursor rc;
      KILN_ASSIGN_OR_RETURN(v, need(rj, "partition", path + ".partition"));
      KILN_ASSIGN_OR_RETURN(uint64_t part, as_u64(v, path + ".partition"));
      if (part >= parts) return bad(origin, path + ".partition", "not below partitions");
      rc.partition = static_cast<int64_t>(part);
      KILN_ASSIGN_OR_RETURN(json doms, need(rj, "domains", path + ".domains"));
      if (!doms.is_object()) return bad(origin, path + ".domains", "expected an object");
      for (const auto& [name, dj] : doms.items()) {
        const std::string dpath = path + ".domains." + name;
        if (!dj.is_object()) return bad(origin, dpath, "expected an object");
        DomainCursor c;
        KILN_ASSIGN_OR_RETURN(v, need(dj, "next_epoch", dpath + ".next_epoch"));
        KILN_ASSIGN_OR_RETURN(c.next_epoch, as_u64(v, dpath + ".next_epoch"));
        KILN_ASSIGN_OR_RETURN(v, need(dj, "sequences", dpath + ".sequences"));
        KILN_ASSIGN_OR_RETURN(c.sequences, as_u64(v, dpath + ".sequences"));
        KILN_ASSIGN_OR_RETURN(json pending, need(dj, "pending", dpath + ".pending"));
        if (!pending.is_array()) return bad(origin, dpath + ".pending", "expected an array");
        for (size_t k = 0; k < pending.size(); ++k) {
          const std::string ppath = dpath + ".pending[" + std::to_string(k) + "]";
          const json& pj = pending[k];
          if (!pj.is_array() || pj.size() != 4) {
            return bad(origin, ppath, "expected [epoch, begin, end, skip_tokens]");
          }
          Interval iv;
          KILN_ASSIGN_OR_RETURN(iv.epoch, as_u64(pj[0], ppath));
          KILN_ASSIGN_OR_RETURN(iv.begin, as_u64(pj[1], ppath));
          KILN_ASSIGN_OR_RETURN(iv.end, as_u64(pj[2], ppath));
          KILN_ASSIGN_OR_RETURN(iv.skip_tokens, as_u64(pj[3], ppath));
          if (iv.begin > iv.end) return bad(origin, ppath, "begin is past end");
          c.pending.push_back(iv);
        }
        rc.domains[name] = std::move(c);
      }
      s.cursors.push_back(std::move(rc));
    }
  } catch (const json::exception& e) {
    return bad(origin, "", std::string("malformed: ") + e.what());
  }
  std::set<int64_t> seen;
  for (const auto& r : s.cursors) {
    if (!seen.insert(r.partition).second) {
      return bad(origin, "cursors", "partition " + std::to_string(r.partition) + " appears twice");
    }
  }
  return s;
}

Result<LoaderState> LoaderState::merge(const std::vector<LoaderState>& per_rank) {
  if (per_rank.empty()) return Status::config("loader state merge: no states given");
  LoaderState out = per_rank.front();
  out.cursors.clear();
  out.skipped_shards = 0;
  for (const LoaderState& s : per_rank) {
    auto mismatch = [&](const char* what) {
      return Status::config(std::string("loader state merge: states differ in '") + what +
                            "' (they must come from the same run and step)")
          .with_key(what);
    };
    if (s.dataset != out.dataset) return mismatch("dataset");
    if (s.seed != out.seed) return mismatch("seed");
    if (s.partitions != out.partitions) return mismatch("partitions");
    if (s.global_batch != out.global_batch) return mismatch("global_batch");
    if (s.world != out.world) return mismatch("world");
    if (s.step != out.step) return mismatch("step");
    if (s.micro != out.micro) return mismatch("micro");
    if (s.weights_history.size() != out.weights_history.size()) return mismatch("weights_history");
    for (size_t i = 0; i < s.weights_history.size(); ++i) {
      if (s.weights_history[i].step != out.weights_history[i].step ||
          s.weights_history[i].weights != out.weights_history[i].weights) {
        return mismatch("weights_history");
      }
    }
    out.skipped_shards += s.skipped_shards;
    for (const auto& r : s.cursors) out.cursors.push_back(r);
  }
  std::sort(
      out.cursors.begin(), out.cursors.end(),
      [](const PartitionCursor& a, const PartitionCursor& b) { return a.partition < b.partition; });
  for (size_t i = 0; i < out.cursors.size(); ++i) {
    if (i > 0 && out.cursors[i].partition == out.cursors[i - 1].partition) {
      return Status::config("loader state merge: partition " +
                            std::to_string(out.cursors[i].partition) +
                            " given twice (the same rank's state twice?)");
    }
  }
  return out;
}

}  // namespace kiln::loader
