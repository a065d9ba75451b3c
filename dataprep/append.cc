#include "dataprep/append.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/atomic_file.h"
#include "common/log.h"
#include "dataprep/dedup/dedup_index.h"
#include "dataprep/prep_config.h"
#include "dataprep/stages/work_files.h"
#include "format/manifest.h"

namespace kiln::prep {
namespace fs = std::filesystem;
using namespace detail;  // the work-folder helpers (stages/work_files.h)
namespace {

using ojson = nlohmann::ordered_json;

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}
std::string append_dir(const std::string& dataset) { return dataset + "/.kiln-append"; }
std::string journal_path(const std::string& dataset) { return append_dir(dataset) + "/commit.json"; }

bool exists(const std::string& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// Settings left at their defaults are taken from the index: the dedup settings (others must
// agree; checked later by run_prep, which names the setting) and the output layout (shards.*,
// split.*: another value given is used, and said). `adopted` gets "key=value" for every value
// taken that differs from the default, and notes.
Status adopt_index_settings(Config* config, const DedupIndex& index, const std::string& dataset,
                            std::vector<std::string>* adopted) {
  KILN_ASSIGN_OR_RETURN(Config defaults, Config::load(kPrepDefaultsYaml, "", {}));
  const DedupSettings& s = index.settings();
  auto is_default = [&](const char* key) {
    return YAML::Dump(config->node(key)) == YAML::Dump(defaults.node(key));
  };
  // Equal as numbers when both are ("0" and "0.0"), else as text.
  auto same = [](const std::string& a, const std::string& b) {
    char *ea = nullptr, *eb = nullptr;
    const double x = std::strtod(a.c_str(), &ea), y = std::strtod(b.c_str(), &eb);
    if (!a.empty() && !b.empty() && *ea == 0 && *eb == 0) return x == y;
    return a == b;
  };
  auto adopt = [&](const char* key, const std::string& value) -> Status {
    if (!is_default(key)) return Status::ok();
    if (!same(value, YAML::Dump(defaults.node(key))))
      adopted->push_back(std::string(key) + "=" + value);
    return config->set(key, value);
  };
  auto number = [](double v) {  // the shortest text that reads back as v
    char buf[64];
    for (int digits = 15; digits <= 17; ++digits) {
      std::snprintf(buf, sizeof buf, "%.*g", digits, v);
      if (std::strtod(buf, nullptr) == v) break;
    }
    return std::string(buf);
  };
  KILN_RETURN_IF_ERROR(adopt("dedup.exact", s.exact ? "true" : "false"));
  KILN_RETURN_IF_ERROR(adopt("dedup.near", s.near ? "true" : "false"));
  KILN_RETURN_IF_ERROR(adopt("dedup.strip_punct", s.strip_punct ? "true" : "false"));
  KILN_RETURN_IF_ERROR(adopt("dedup.threshold", number(s.threshold)));
  KILN_RETURN_IF_ERROR(adopt("dedup.num_perm", std::to_string(s.num_perm)));
  KILN_RETURN_IF_ERROR(adopt("dedup.ngram", std::to_string(s.ngram)));
  KILN_RETURN_IF_ERROR(adopt("dedup.seed", std::to_string(s.seed)));
  if (is_default("dedup.bands") && is_default("dedup.rows") && s.near) {
    KILN_ASSIGN_OR_RETURN(PrepOptions o, prep_options_from_config(*config));
    if (o.lsh.bands != s.bands || o.lsh.rows != s.rows) {
      KILN_RETURN_IF_ERROR(config->set("dedup.bands", std::to_string(s.bands)));
      KILN_RETURN_IF_ERROR(config->set("dedup.rows", std::to_string(s.rows)));
      adopted->push_back("dedup.bands=" + std::to_string(s.bands));
      adopted->push_back("dedup.rows=" + std::to_string(s.rows));
    }
  }
  // The layout: recorded by this kiln in index.json; an older index has none (then only the
  // shard compression can be told, from the shards' names).
  const nlohmann::json& settings = index.meta()["settings"];
  nlohmann::json layout = settings.contains("layout") && settings["layout"].is_object()
                              ? settings["layout"]
                              : nlohmann::json::object();
  if (layout.empty()) {
    KILN_ASSIGN_OR_RETURN(Manifest m, read_manifest(dataset + "/manifest.json"));
    if (!m.shards.empty()) {
      auto comp = shard_compression_for_path(m.shards.front().path);
      if (comp.is_ok())
        layout["shards.compression"] = *comp == ShardCompression::kZstd ? "zstd" : "none";
    }
    adopted->push_back("(the dataset's index records no shards.* / split.* settings: it was "
                       "made by an older kiln; this run's are used" +
                       std::string(layout.empty() ? "" : ", but for the shards' compression") + ")");
  }
  for (const auto& [key, v] : layout.items()) {
    if (key.rfind("shards.", 0) != 0 && key.rfind("split.", 0) != 0) continue;
    const std::string value = v.is_string()             ? v.get<std::string>()
                              : v.is_number_float()      ? number(v.get<double>())
                                                         : v.dump();
    if (!is_default(key.c_str())) {
      if (!same(YAML::Dump(config->node(key)), value))
        adopted->push_back("(" + key + "=" + YAML::Dump(config->node(key)) +
                           " as given; the dataset has " + value + ")");
      continue;
    }
    KILN_RETURN_IF_ERROR(adopt(key.c_str(), value));
  }
  return Status::ok();
}

uint64_t u64(const ojson& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

// Adds the counters of `add` into `into` (objects of counters are added key by key).
void add_counters(ojson* into, const ojson& add) {
  for (const auto& [k, v] : add.items()) {
    if (v.is_number_unsigned()) (*into)[k] = u64(*into, k.c_str()) + v.get<uint64_t>();
    else if (v.is_object()) {
      if (!into->contains(k) || !(*into)[k].is_object()) (*into)[k] = ojson::object();
      add_counters(&(*into)[k], v);
    }
  }
}

// stats.json of the appended dataset: counters added, settings and timings of the append.
ojson merge_stats(const ojson& old_stats, const ojson& add) {
  ojson s = add;
  for (const char* k : {"docs_in", "docs_out", "exact_dups", "near_dups", "rejected",
                        "repaired_utf8", "bytes_in", "bytes_out", "tokens_out", "files"})
    s[k] = u64(old_stats, k) + u64(add, k);
  ojson reasons = old_stats.value("rejected_by_reason", ojson::object());
  add_counters(&reasons, add.value("rejected_by_reason", ojson::object()));
  s["rejected_by_reason"] = reasons;
  ojson domains = old_stats.value("domains", ojson::object());
  add_counters(&domains, add.value("domains", ojson::object()));
  s["domains"] = domains;
  if (old_stats.contains("dedup") && add.contains("dedup")) {
    const ojson& od = old_stats["dedup"];
    ojson& d = s["dedup"];
    for (const char* k : {"candidate_pairs", "verified_pairs", "spilled_bytes", "clusters"})
      d[k] = u64(od, k) + u64(d, k);
    d["largest_cluster"] = std::max(u64(od, "largest_cluster"), u64(d, "largest_cluster"));
    ojson sizes = od.value("cluster_sizes", ojson::object());
    add_counters(&sizes, d.value("cluster_sizes", ojson::object()));
    d["cluster_sizes"] = sizes;
    // The dataset itself was the append's first `against`: keep only the others.
    if (d.contains("against") && d["against"].is_array() && !d["against"].empty()) {
      ojson rest = ojson::array();
      for (size_t i = 1; i < d["against"].size(); ++i) rest.push_back(d["against"][i]);
      d["against"] = rest;
    }
    for (const char* k : {"against_exact", "against_near"})
      if (od.contains(k) || d.contains(k)) d[k] = u64(od, k) + u64(d, k);
  }
  // Quality filters (docs/PREP.md "Quality filters"): counts added, per filter by its label.
  if (old_stats.contains("filtered") || add.contains("filtered"))
    s["filtered"] = u64(old_stats, "filtered") + u64(add, "filtered");
  if (old_stats.contains("filters") || add.contains("filters")) {
    ojson merged = ojson::array();
    for (const ojson* from : {&old_stats, &add}) {
      if (!from->contains("filters") || !(*from)["filters"].is_array()) continue;
      for (const ojson& f : (*from)["filters"]) {
        if (!f.is_object()) continue;
        ojson* into = nullptr;
        for (ojson& m : merged)
          if (m.value("filter", std::string()) == f.value("filter", std::string())) into = &m;
        if (!into) {
          merged.push_back(f);
          continue;
        }
        for (const char* k : {"docs", "bytes", "edited"}) (*into)[k] = u64(*into, k) + u64(f, k);
        (*into)["edited_bytes"] =
            into->value("edited_bytes", int64_t{0}) + f.value("edited_bytes", int64_t{0});
        ojson rules = into->value("rules", ojson::object());
        add_counters(&rules, f.value("rules", ojson::object()));
        (*into)["rules"] = rules;
      }
    }
    s["filters"] = merged;
  }
  s["appends"] = u64(old_stats, "appends") + 1;
  return s;
}

Result<ojson> read_ojson(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path));
  ojson j = ojson::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::data("not a JSON object").with_file(path);
  return j;
}

// Runs the journal's moves that have not happened yet, in order.
Status apply_moves(const nlohmann::json& moves) {
  for (const auto& mv : moves) {
    const std::string from = mv.at(0).get<std::string>(), to = mv.at(1).get<std::string>();
    if (exists(from)) {
      std::error_code ec;
      fs::create_directories(fs::path(to).parent_path(), ec);
      if (ec) return Status::io("cannot create " + fs::path(to).parent_path().string() + ": " + ec.message());
      if (fs::is_directory(from, ec) && exists(to)) KILN_RETURN_IF_ERROR(remove_all(to));
      KILN_RETURN_IF_ERROR(rename_durable(from, to));
      crash_point("append-move");
    } else if (!exists(to)) {
      return Status::data("the append journal names " + from + ", which is gone, and " + to +
                          " does not exist either (damaged dataset)");
    }
  }
  return Status::ok();
}

// Step 1-3 of the commit (rank 0).
Status commit_append(const std::string& dataset, const std::string& stage, uint32_t segment) {
  KILN_ASSIGN_OR_RETURN(Manifest old_m, read_manifest(dataset + "/manifest.json"));
  KILN_ASSIGN_OR_RETURN(Manifest add_m, read_manifest(stage + "/manifest.json"));
  KILN_ASSIGN_OR_RETURN(ojson old_stats, read_ojson(dataset + "/stats.json"));
  KILN_ASSIGN_OR_RETURN(ojson add_stats, read_ojson(stage + "/stats.json"));
  KILN_ASSIGN_OR_RETURN(std::string old_removed, read_file(dataset + "/dedup/removed.jsonl"));
  KILN_ASSIGN_OR_RETURN(std::string add_removed, read_file(stage + "/dedup/removed.jsonl"));

  nlohmann::json moves = nlohmann::json::array();
  Manifest m = old_m;
  std::set<std::string> taken;
  std::map<std::pair<std::string, bool>, uint64_t> next;  // (domain, val) -> next index
  for (const ManifestShard& s : old_m.shards) {
    taken.insert(s.path);
    ++next[{s.domain, s.val}];
  }
  for (const ManifestShard& s : add_m.shards) {
    KILN_ASSIGN_OR_RETURN(ShardCompression comp, shard_compression_for_path(s.path));
    std::string path;
    do {
      uint64_t k = next[{s.domain, s.val}]++;
      path = "shards/" + s.domain + "/" + shard_file_name(s.val ? s.domain + "-val" : s.domain, k, comp);
    } while (taken.count(path));
    taken.insert(path);
    moves.push_back({stage + "/" + s.path, dataset + "/" + path});
    ShardInfo info;
    info.path = dataset + "/" + path;
    info.samples = s.samples;
    info.tokens = s.tokens;
    info.bytes = s.bytes;
    info.xxh3 = s.xxh3;
    m.add_shard(info, s.domain, dataset, s.val);
  }
  std::error_code ec;
  if (exists(stage + "/rejects")) {
    std::vector<std::string> names;
    for (const auto& f : fs::directory_iterator(stage + "/rejects", ec))
      names.push_back(f.path().filename().string());
    if (ec) return Status::io("cannot list " + stage + "/rejects: " + ec.message());
    std::sort(names.begin(), names.end());
    char tag[32];
    std::snprintf(tag, sizeof tag, "append-%06u-", segment);
    for (const auto& n : names)
      moves.push_back({stage + "/rejects/" + n, dataset + "/rejects/" + tag + n});
  }
  const std::string seg = index_segment_name(segment);
  if (exists(stage + "/dedup/index/" + seg)) {
    moves.push_back({stage + "/dedup/index/" + seg, dataset + "/dedup/index/" + seg});
    if (exists(stage + "/dedup/index/domain_rules.yaml"))
      moves.push_back({stage + "/dedup/index/domain_rules.yaml",
                       dataset + "/dedup/index/domain_rules.yaml"});
    moves.push_back({stage + "/dedup/index/index.json", dataset + "/dedup/index/index.json"});
  }
  const std::string commit = append_dir(dataset) + "/commit";
  KILN_RETURN_IF_ERROR(make_dirs(commit));
  KILN_RETURN_IF_ERROR(write_file_atomic(commit + "/removed.jsonl", old_removed + add_removed));
  KILN_RETURN_IF_ERROR(
      write_file_atomic(commit + "/stats.json", merge_stats(old_stats, add_stats).dump(2) + "\n"));
  KILN_RETURN_IF_ERROR(write_manifest(commit + "/manifest.json", m));
  moves.push_back({commit + "/removed.jsonl", dataset + "/dedup/removed.jsonl"});
  moves.push_back({commit + "/stats.json", dataset + "/stats.json"});
  moves.push_back({commit + "/manifest.json", dataset + "/manifest.json"});  // last: the loader's view
  crash_point("append-staged");
  KILN_RETURN_IF_ERROR(write_file_atomic(journal_path(dataset), nlohmann::json({{"moves", moves}}).dump(1) + "\n"));
  crash_point("append-journal");
  KILN_ASSIGN_OR_RETURN(bool done, finish_pending_append(dataset));
  if (!done) return Status::internal("the append journal vanished");
  return Status::ok();
}

}  // namespace

Result<bool> finish_pending_append(const std::string& dataset_in) {
  const std::string dataset = strip_slashes(dataset_in);
  const std::string journal = journal_path(dataset);
  if (!exists(journal)) return false;
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(journal));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("moves") || !j["moves"].is_array())
    return Status::data("damaged append journal").with_file(journal);
  try {
    KILN_RETURN_IF_ERROR(apply_moves(j["moves"]));
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("damaged append journal: ") + e.what()).with_file(journal);
  }
  if (std::remove(journal.c_str()) != 0) return Status::from_errno("remove", journal);
  KILN_RETURN_IF_ERROR(fsync_dir(append_dir(dataset)));
  crash_point("append-finished");
  // What is left is the stage's work folder: no longer needed.
  if (Status st = remove_all(append_dir(dataset)); !st.is_ok())
    KILN_LOG_WARN("could not remove {}: {}", append_dir(dataset), st.to_string());
  return true;
}

Result<PrepResult> append_prep(Config config, const std::string& dataset_in,
                               comm::ProcessGroup& g, const PrepRunOptions& options) {
  const std::string dataset = strip_slashes(dataset_in);
  KILN_ASSIGN_OR_RETURN(std::string output, config.get<std::string>("output"));
  if (!output.empty())
    return Status::usage("--append writes into the dataset itself; give no --output");
  if (!exists(dataset + "/manifest.json"))
    return Status::usage("--append " + dataset + ": not a prepared dataset (no manifest.json)");
  // An earlier append killed after its commit point: finish it first.
  Status st;
  if (g.rank() == 0) {
    auto done = finish_pending_append(dataset);
    if (!done.is_ok()) st = done.status();
    else if (*done) KILN_LOG_INFO("finished an interrupted append to {}", dataset);
  }
  KILN_RETURN_IF_ERROR(comm::agree(g, std::move(st)));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<DedupIndex> index, DedupIndex::open(dataset));
  std::vector<std::string> adopted;
  KILN_RETURN_IF_ERROR(adopt_index_settings(&config, *index, dataset, &adopted));
  std::string adopted_line = "settings taken from " + dataset + " (where left at the default): ";
  if (adopted.empty()) adopted_line = dataset + " was made with the default settings";
  for (size_t i = 0; i < adopted.size(); ++i) adopted_line += (i ? ", " : "") + adopted[i];
  if (g.rank() == 0) KILN_LOG_INFO("--append: {}", adopted_line);
  KILN_ASSIGN_OR_RETURN(ojson stats, read_ojson(dataset + "/stats.json"));

  const std::string stage = append_dir(dataset) + "/stage";
  KILN_RETURN_IF_ERROR(config.set_node("output", YAML::Node(stage)));
  YAML::Node against(YAML::NodeType::Sequence);
  against.push_back(dataset);
  for (const auto& p : config.node("dedup.against")) against.push_back(p.as<std::string>());
  KILN_RETURN_IF_ERROR(config.set_node("dedup.against", against));
  KILN_RETURN_IF_ERROR(config.set("dedup.index", "true"));
  PrepRunOptions ro = options;
  ro.against_self = true;
  ro.key_base = u64(stats, "docs_in");
  for (const auto& seg : index->meta()["segments"])
    if (seg.contains("fingerprint")) ro.done_fingerprints.push_back(seg["fingerprint"]);
  KILN_ASSIGN_OR_RETURN(PrepResult r, run_prep(config, g, ro));
  if (r.done_before) {
    // The same input and settings were appended before (this rerun found its segment); a kill
    // after the commit may have left the stage behind.
    if (g.rank() == 0) st = remove_all(append_dir(dataset));
    KILN_RETURN_IF_ERROR(comm::agree(g, std::move(st)));
    r.summary = "kiln prep --append: this input was already appended to " + dataset +
                "; nothing to do\n";
    return r;
  }
  if (g.rank() == 0) st = commit_append(dataset, stage, index->segments());
  KILN_RETURN_IF_ERROR(comm::agree(g, std::move(st)));
  if (g.rank() == 0) {
    // The summary speaks of the stage: say where the documents went.
    std::string s;
    size_t at = 0;
    while (at < r.summary.size()) {
      size_t nl = r.summary.find('\n', at);
      std::string line = r.summary.substr(at, nl == std::string::npos ? std::string::npos : nl - at + 1);
      if (line.find("  output: ") != 0) s += line;
      at = nl == std::string::npos ? r.summary.size() : nl + 1;
    }
    s += "  appended to " + dataset + " (index segment " + index_segment_name(index->segments()) + ")\n";
    s += "  " + adopted_line + "\n";
    r.summary = s;
  }
  return r;
}

}  // namespace kiln::prep
