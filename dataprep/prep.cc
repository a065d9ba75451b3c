// The `kiln prep` driver: settings, inputs, resume state, the stage sequence, the final outputs.
#include "dataprep/prep.h"

#include <fmt/format.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <unordered_map>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"
#include "common/stop_signal.h"
#include "common/text.h"
#include "dataprep/append.h"
#include "dataprep/stages/stages.h"
#include "dataprep/stages/work_files.h"
#include "format/manifest.h"

namespace kiln::prep {
namespace fs = std::filesystem;
using namespace detail;  // the stages (stages/stages.h)

namespace {

Status stopped_by_signal(int sig, const std::string& stage) {
  return Status::internal("stopped by " + StopSignals::name(sig) + " after stage '" + stage +
                          "'; run the same command again to resume from there");
}

constexpr uint64_t kUnitBytes = uint64_t{256} << 20;
constexpr uint32_t kUnitFiles = 1024;

// Contiguous, size-balanced blocks of files per rank (global order is preserved by rank order).
std::vector<uint32_t> split_files(const std::vector<InputFile>& files, int size) {
  std::vector<uint32_t> begin(size + 1, static_cast<uint32_t>(files.size()));
  uint64_t total = 0;
  for (const auto& f : files) total += f.size + 1;
  begin[0] = 0;
  uint64_t acc = 0;
  int r = 1;
  for (uint32_t i = 0; i < files.size() && r < size; ++i) {
    // Rank r starts at the first file whose start offset reaches r/size of the bytes.
    while (r < size && acc >= total * static_cast<uint64_t>(r) / size) begin[r++] = i;
    acc += files[i].size + 1;
  }
  while (r < size) begin[r++] = static_cast<uint32_t>(files.size());
  for (int k = 1; k <= size; ++k) begin[k] = std::max(begin[k], begin[k - 1]);
  return begin;
}

std::vector<FileRun> make_units(const std::vector<InputFile>& files, uint32_t first, uint32_t last) {
  // Testing hook: KILN_PREP_UNIT_FILES=N caps the files per unit (more resume points).
  uint32_t max_files = kUnitFiles;
  if (const char* v = std::getenv("KILN_PREP_UNIT_FILES")) max_files = std::max(1, std::atoi(v));
  std::vector<FileRun> units;
  uint32_t start = first;
  uint64_t bytes = 0;
  for (uint32_t i = first; i < last; ++i) {
    bytes += files[i].size;
    if (bytes >= kUnitBytes || i + 1 - start >= max_files) {
      units.push_back({start, i + 1});
      start = i + 1;
      bytes = 0;
    }
  }
  if (start < last) units.push_back({start, last});
  return units;
}

// Settings that do not change the output bytes are left out of the fingerprint. It is taken of
// the config as given (the stages see only the parsed options).
std::string make_fingerprint(const Config& config, const Context& c, nlohmann::json* described) {
  YAML::Node cfg = YAML::Clone(config.root());
  cfg.remove("output");
  cfg.remove("threads");
  cfg.remove("memory");
  cfg.remove("keep_work");
  if (cfg["input"]) {
    cfg["input"].remove("paths");
    cfg["input"].remove("max_reject_fraction");
  }
  YAML::Emitter em;
  em << cfg;
  nlohmann::json fp;
  fp["kiln"] = KILN_VERSION;
  fp["ranks"] = c.size;
  fp["config"] = em.c_str();
  fp["files"] = nlohmann::json::array();
  for (const auto& f : c.files) fp["files"].push_back({f.path, f.size, f.mtime_ns});
  *described = fp;
  return hex64(xxh3_64(fp.dump()));
}

bool exists(const std::string& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

const char* const kOutputs[] = {
    "manifest.json", "stats.json",     "shards",          "dedup",
    "rejects",       "tokenizer.json", "tokenizer.model", "tokenizer_config.json"};

// "2", "3-4", "5-8", ... power-of-two buckets for the cluster-size histogram.
std::string size_bucket(uint64_t n) {
  if (n <= 2) return std::to_string(n);
  uint64_t hi = 2;
  while (hi < n) hi *= 2;
  return std::to_string(hi / 2 + 1) + "-" + std::to_string(hi);
}

// ---- the state of earlier runs ---------------------------------------------------------------

// After the dataset is complete the work folder is only a cache: failing to remove it loses
// nothing (a later run finds complete.json and finishes the cleanup), so it is a warning.
void remove_work_folder(const Context& c) {
  if (Status st = remove_all(c.rank_dir); !st.is_ok())
    KILN_LOG_WARN("could not remove the work folder: {}", st.to_string());
}

Result<nlohmann::json> load_marker(const Context& c, int stage) {
  return read_json_file(c.stage_marker(stage));
}

Status save_marker(Context& c, int stage, nlohmann::json marker, double seconds) {
  marker["stage"] = stage_name(stage);
  marker["seconds"] = seconds;
  c.timings[stage_name(stage)] = seconds;
  KILN_RETURN_IF_ERROR(write_json_file(c.stage_marker(stage), marker));
  crash_point((std::string("stage-") + stage_name(stage)).c_str());
  return Status::ok();
}

std::string encode_pairs(const std::vector<DocPair>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
}

// How far this rank's recorded state goes (every marker present and readable, in order).
int local_progress(const Context& c) {
  int done = kNone;
  for (int s = kScan; s <= kWrite; ++s) {
    auto m = load_marker(c, s);
    if (!m.is_ok()) break;
    done = s;
  }
  return done;
}

Status gather_file_stats(Context& c) {
  nlohmann::json mine = nlohmann::json::array();
  for (uint32_t f = c.my_first_file(); f < c.my_last_file(); ++f)
    mine.push_back(c.file_stats[f].to_json());
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> all,
                        comm::allgather_strings(*c.g, mine.dump()));
  for (int r = 0; r < c.size; ++r) {
    nlohmann::json j = nlohmann::json::parse(all[r], nullptr, false);
    uint32_t f = c.rank_file_begin[r];
    for (const auto& s : j) c.file_stats[f++] = FileStats::from_json(s);
  }
  c.file_base.assign(c.files.size(), 0);
  uint64_t base = 0;
  for (size_t f = 0; f < c.files.size(); ++f) {
    c.file_base[f] = base;
    base += c.file_stats[f].docs_in;
  }
  return Status::ok();
}

// A process killed inside an atomic write leaves "<file>.tmp.<pid>". Between the barriers no rank
// writes, so rank 0 clears them before anyone goes on: a resumed tree equals a clean run's.
Status clear_stale_temporaries(const Context& c) {
  auto& g = *c.g;
  KILN_RETURN_IF_ERROR(g.barrier());
  if (c.rank == 0) {
    KILN_ASSIGN_OR_RETURN(size_t stale, remove_stale_temporaries(c.out));
    if (stale > 0) KILN_LOG_INFO("removed {} temporary file(s) left by an interrupted run", stale);
  }
  return g.barrier();
}

Status write_rank_rejects(const Context& c) {
  std::string all;
  for (const FileRun& u : c.units) {
    KILN_ASSIGN_OR_RETURN(std::string part, read_file(c.unit_path(u, "rej")));
    all += part;
  }
  return write_file_atomic(c.out + "/rejects/rejects-" + rank_tag(c.rank) + ".jsonl", all);
}

Status check_reject_fraction(const Context& c) {
  FileStats total;
  for (const auto& s : c.file_stats) total.add(s);
  const uint64_t rejected = total.rejected_total();
  if (total.docs_in == 0 || rejected <= c.opt.max_reject_fraction * total.docs_in)
    return Status::ok();
  std::vector<uint32_t> order(c.files.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return c.file_stats[a].rejected_total() > c.file_stats[b].rejected_total();
  });
  std::string msg = fmt::format("{:.1f}%", 100.0 * rejected / total.docs_in) +
                    " of the input records (" + std::to_string(rejected) + " of " +
                    std::to_string(total.docs_in) +
                    ") were rejected, over input.max_reject_fraction = " +
                    fmt::format("{:g}", c.opt.max_reject_fraction) + ". Worst files:";
  for (size_t k = 0; k < order.size() && k < 5; ++k) {
    const FileStats& s = c.file_stats[order[k]];
    if (s.rejected_total() == 0) break;
    int worst = 0;
    for (int r = 1; r < kRejectReasonCount; ++r)
      if (s.rejected[r] > s.rejected[worst]) worst = r;
    msg += "\n  " + c.files[order[k]].path + ": " + std::to_string(s.rejected_total()) + " of " +
           std::to_string(s.docs_in) + " rejected (mostly " +
           reject_reason_name(static_cast<RejectReason>(worst)) + ")";
  }
  msg += "\nDetails are in " + c.out + "/rejects/. Raise the limit with --max-reject-fraction.";
  return Status::data(msg);
}

// ---- final outputs ---------------------------------------------------------------------------

struct Totals {
  FileStats in;
  uint64_t exact = 0, near = 0, docs_out = 0, bytes_out = 0, tokens_out = 0;
  std::map<std::string, DomainStats> domains;
  std::map<uint64_t, uint64_t> cluster_sizes;  // size -> clusters
  uint64_t clusters = 0, largest = 1;
};

Totals compute_totals(const Context& c, const std::vector<WriteResult>& results) {
  Totals t;
  for (const auto& s : c.file_stats) t.in.add(s);
  for (const RemovedEntry& e : c.removed) (e.exact ? t.exact : t.near) += 1;
  for (const WriteResult& w : results) {
    t.docs_out += w.docs_out;
    for (const auto& [name, d] : w.domains) {
      DomainStats& ds = t.domains[name];
      ds.docs += d.docs;
      ds.tokens += d.tokens;
      ds.bytes += d.bytes;
      for (const auto& [by, n] : d.domain_by) ds.domain_by[by] += n;
      ds.val_docs += d.val_docs;
      ds.val_tokens += d.val_tokens;
      t.bytes_out += d.bytes;
      t.tokens_out += d.tokens;
    }
  }
  std::map<uint64_t, uint64_t> members;  // kept -> removed count
  for (const RemovedEntry& e : c.removed) ++members[e.kept];
  for (const auto& [kept, n] : members) {
    ++t.cluster_sizes[n + 1];
    t.largest = std::max<uint64_t>(t.largest, n + 1);
  }
  t.clusters = members.size();
  return t;
}

// stats.json "filters": one entry per filter of the chain, in order: its documents and input
// bytes dropped (by rule), and the documents it edited with the bytes the edits removed.
nlohmann::ordered_json filter_stats(const Context& c, const FileStats& in) {
  const filter::FilterChain& chain = *c.opt.filters;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (size_t i = 0; i < chain.size(); ++i) {
    const FilterTally t = i < in.filters.size() ? in.filters[i] : FilterTally{};
    nlohmann::ordered_json f;
    f["filter"] = chain.label(i);
    f["docs"] = t.docs;
    f["bytes"] = t.bytes;
    nlohmann::ordered_json rules = nlohmann::ordered_json::object();
    for (const auto& [rule, n] : t.rules) rules[rule] = n;
    f["rules"] = rules;
    f["edited"] = t.edited;
    f["edited_bytes"] = t.edited_bytes;
    list.push_back(f);
  }
  return list;
}

nlohmann::ordered_json make_stats(const Context& c, const Totals& t) {
  nlohmann::ordered_json s;
  s["docs_in"] = t.in.docs_in;
  s["docs_out"] = t.docs_out;
  s["exact_dups"] = t.exact;
  s["near_dups"] = t.near;
  s["rejected"] = t.in.rejected_total();
  nlohmann::ordered_json reasons = nlohmann::ordered_json::object();
  for (int r = 0; r < kRejectReasonCount; ++r)
    reasons[reject_reason_name(static_cast<RejectReason>(r))] = t.in.rejected[r];
  s["rejected_by_reason"] = reasons;
  if (!c.opt.filters->empty()) s["filtered"] = t.in.filtered;
  s["repaired_utf8"] = t.in.repaired;
  s["bytes_in"] = t.in.input_bytes;
  s["bytes_out"] = t.bytes_out;
  s["tokens_out"] = t.tokens_out;
  s["files"] = c.files.size();
  s["ranks"] = c.size;
  nlohmann::ordered_json domains = nlohmann::ordered_json::object();
  for (const auto& [name, d] : t.domains) {
    nlohmann::ordered_json dj;
    dj["docs"] = d.docs;
    dj["tokens"] = d.tokens;
    dj["bytes"] = d.bytes;
    dj["domain_by"] = d.domain_by;
    if (c.opt.val_fraction > 0 || c.opt.val_min_docs > 0) {
      dj["val_docs"] = d.val_docs;  // of docs / tokens: the validation split
      dj["val_tokens"] = d.val_tokens;
    }
    domains[name] = dj;
  }
  s["domains"] = domains;
  if (!c.opt.filters->empty()) s["filters"] = filter_stats(c, t.in);
  nlohmann::ordered_json dd;
  dd["exact"] = c.opt.exact;
  dd["near"] = c.opt.near;
  dd["threshold"] = c.opt.threshold;
  dd["num_perm"] = c.opt.num_perm;
  dd["bands"] = c.opt.lsh.bands;
  dd["rows"] = c.opt.lsh.rows;
  dd["bands_rows_from"] = c.opt.lsh_explicit ? "config" : "threshold";
  dd["ngram"] = c.opt.ngram;
  dd["seed"] = c.opt.seed;
  dd["verify"] = c.opt.verify;
  dd["strip_punct"] = c.opt.strip_punct;
  nlohmann::ordered_json probs = nlohmann::ordered_json::object();
  for (double j : {0.5, 0.7, 0.8, 0.9, 0.95})
    probs[fmt::format("{:g}", j)] = std::round(lsh_candidate_probability(j, c.opt.lsh) * 1e6) / 1e6;
  dd["candidate_probability"] = probs;
  dd["candidate_pairs"] = c.dedup.candidate_pairs;
  dd["verified_pairs"] = c.dedup.verified_pairs;
  dd["spilled_bytes"] = c.dedup.spilled_bytes;
  if (!c.opt.against.empty()) {
    // Documents removed as copies of an earlier dataset's kept documents (of exact / near).
    uint64_t ext_exact = 0, ext_near = 0;
    for (const RemovedEntry& e : c.removed)
      if (is_external(e.kept)) (e.exact ? ext_exact : ext_near) += 1;
    dd["against"] = c.opt.against;
    dd["against_exact"] = ext_exact;
    dd["against_near"] = ext_near;
  }
  dd["clusters"] = t.clusters;
  dd["largest_cluster"] = t.largest;
  nlohmann::ordered_json hist = nlohmann::ordered_json::object();
  std::map<uint64_t, std::pair<std::string, uint64_t>> buckets;  // bucket start -> label, count
  for (const auto& [size, n] : t.cluster_sizes) {
    std::string label = size_bucket(size);
    uint64_t start = std::stoull(label.substr(0, label.find('-')));
    buckets[start].first = label;
    buckets[start].second += n;
  }
  for (const auto& [start, b] : buckets) hist[b.first] = b.second;
  dd["cluster_sizes"] = hist;
  s["dedup"] = dd;
  nlohmann::ordered_json tok;
  tok["path"] = c.tokenizer.path;
  tok["vocab_size"] = c.tokenizer.vocab_size;
  tok["eos_id"] = c.tokenizer.eos_id;
  s["tokenizer"] = tok;
  nlohmann::ordered_json tm = nlohmann::ordered_json::object();
  double total = 0;
  for (int st = kScan; st <= kWrite; ++st) {
    auto it = c.timings.find(stage_name(st));
    double v = it == c.timings.end() ? 0.0 : it->second;
    tm[stage_name(st)] = std::round(v * 1000) / 1000;
    total += v;
  }
  tm["total"] = std::round(total * 1000) / 1000;
  s["timings_s"] = tm;
  return s;
}

std::string make_summary(const nlohmann::ordered_json& s, const std::string& out,
                         const std::vector<std::string>& examples = {}) {
  auto u = [&](const char* k) { return json_integer_or(s, k, uint64_t{0}); };
  std::string text =
      "kiln prep: " + std::to_string(u("docs_in")) + " documents in, " +
      std::to_string(u("docs_out")) + " out (exact duplicates " + std::to_string(u("exact_dups")) +
      ", near duplicates " + std::to_string(u("near_dups")) + ", rejected " +
      std::to_string(u("rejected")) +
      (s.contains("filtered") ? ", filtered " + std::to_string(u("filtered")) : "") + ")\n";
  if (s.contains("filters") && s["filters"].is_array()) {
    for (const auto& f : s["filters"]) {
      text += "  filter " + f.value("filter", std::string()) + ": dropped " +
              std::to_string(json_integer_or(f, "docs", uint64_t{0})) + " docs (" +
              human_bytes(json_integer_or(f, "bytes", uint64_t{0})) + ")";
      std::string rules;
      if (f.contains("rules"))
        for (const auto& [rule, n] : f["rules"].items())
          rules += (rules.empty() ? "" : ", ") + rule + " " +
                   std::to_string(json_integer<uint64_t>(n, rule));
      if (!rules.empty()) text += ": " + rules;
      if (const auto e = json_integer_or(f, "edited", uint64_t{0}); e > 0)
        text += "; edited " + std::to_string(e) + " docs (" +
                std::to_string(json_integer_or(f, "edited_bytes", int64_t{0})) + " bytes removed)";
      text += "\n";
    }
  }
  if (u("rejected") > 0) {
    text += "  rejected:";
    for (const auto& [k, v] : s["rejected_by_reason"].items())
      if (const auto n = json_integer<uint64_t>(v, k); n > 0) text += " " + k + " " + std::to_string(n);
    text += "  (see " + out + "/rejects/)\n";
  }
  const auto& d = s["dedup"];
  LshParams p{json_integer_or(d, "bands", 0), json_integer_or(d, "rows", 0)};
  if (d.value("near", false)) {
    text += "  near-dup: Jaccard >= " + fmt::format("{:.2f}", d.value("threshold", 0.0)) + ", " +
            std::to_string(json_integer_or(d, "num_perm", 0)) + " permutations, " +
            std::to_string(json_integer_or(d, "ngram", 0)) + "-gram shingles; " + describe_lsh(p) +
            "\n";
    text += "  clusters: " + std::to_string(json_integer_or(d, "clusters", uint64_t{0})) + " (largest " +
            std::to_string(json_integer_or(d, "largest_cluster", uint64_t{0})) + "), candidate pairs " +
            std::to_string(json_integer_or(d, "candidate_pairs", uint64_t{0})) + ", verified " +
            std::to_string(json_integer_or(d, "verified_pairs", uint64_t{0})) + "\n";
  }
  for (const std::string& e : examples) text += "    e.g. " + e + "\n";
  text += "  domains:\n";
  for (const auto& [name, dj] : s["domains"].items()) {
    text += "    " + name + ": " + std::to_string(json_integer_or(dj, "docs", uint64_t{0})) + " docs, " +
            human_bytes(json_integer_or(dj, "bytes", uint64_t{0})) + ", " +
            std::to_string(json_integer_or(dj, "tokens", uint64_t{0})) + " tokens\n";
  }
  text += "  time:";
  for (const auto& [k, v] : s["timings_s"].items())
    text += " " + k + " " + fmt::format("{:.2f}s", v.get<double>());
  text += "\n  output: " + out + "/manifest.json, stats.json, dedup/removed.jsonl, rejects/, shards/\n";
  return text;
}

// OUT/dedup/index/index.json (and a copy of the domain rules file the index names): the
// earlier segments of the dataset appended to, then this run's.
Status write_index_meta(const Context& c, const std::vector<WriteResult>& results) {
  const std::string dir = c.out + "/dedup/index";
  nlohmann::json domains = {{"default", c.opt.domains.default_domain},
                            {"rules", ""},
                            {"model", c.opt.domains.model}};
  if (!c.opt.domains.rules.empty()) {
    KILN_ASSIGN_OR_RETURN(std::string rules, read_file(c.opt.domains.rules));
    KILN_RETURN_IF_ERROR(write_file_atomic(dir + "/domain_rules.yaml", rules));
    domains["rules"] = "domain_rules.yaml";
  }
  nlohmann::json segments = nlohmann::json::array();
  if (c.against_self) segments = c.against[0]->meta()["segments"];
  nlohmann::json runs = nlohmann::json::array();
  uint64_t docs = 0;
  for (const WriteResult& w : results) {
    if (w.index_run.is_null()) return Status::internal("a rank wrote no index run");
    runs.push_back(w.index_run);
    docs += json_integer_or(w.index_run, "docs", uint64_t{0});
  }
  segments.push_back({{"name", index_segment_name(c.index_segment)},
                      {"docs", docs},
                      {"runs", runs},
                      {"fingerprint", c.fingerprint}});
  // The output layout, which --append adopts (config keys; the latest run's values).
  nlohmann::json layout = {
      {"shards.compression", c.opt.compression == ShardCompression::kZstd ? "zstd" : "none"},
      {"shards.level", c.opt.level},
      {"shards.max_samples", c.opt.max_samples},
      {"shards.max_bytes", c.opt.max_bytes},
      {"split.val_fraction", c.opt.val_fraction},
      {"split.val_min_docs", c.opt.val_min_docs}};
  nlohmann::json extra = {{"domains", domains}, {"layout", layout}};
  return write_file_atomic(dir + "/index.json",
                           make_index_meta(dedup_settings(c.opt), extra, segments).dump(1) + "\n");
}

Status final_stage(Context& c, std::string* summary) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> blobs,
                        comm::allgather_strings(*c.g, c.written.to_json().dump()));
  std::vector<WriteResult> results;
  for (const auto& b : blobs) {
    nlohmann::json j = nlohmann::json::parse(b, nullptr, false);
    if (j.is_discarded()) return Status::internal("bad write result from a rank");
    results.push_back(WriteResult::from_json(j));
  }
  // Global shard numbering per domain, in rank order; ranks rename their own shards.
  struct Final {
    std::string path, domain;
    const WrittenShard* w;
  };
  std::vector<Final> finals;
  std::map<std::pair<std::string, bool>, uint64_t> next_index;  // (domain, val)
  std::set<std::pair<std::string, bool>> parts;  // (domain, val): training shards first
  for (const auto& w : results)
    for (const auto& s : w.shards) parts.insert({s.domain, s.val});
  Status st;
  for (const auto& [d, val] : parts) {
    for (int r = 0; r < c.size; ++r) {
      for (const WrittenShard& s : results[r].shards) {
        if (s.domain != d || s.val != val) continue;
        std::string path = s.path;
        if (c.size > 1) {
          path = "shards/" + d + "/" +
                 shard_file_name(val ? d + "-val" : d, next_index[{d, val}]++, c.opt.compression);
          if (r == c.rank && st.is_ok()) {
            std::string from = c.out + "/" + s.path, to = c.out + "/" + path;
            if (exists(from)) st = rename_durable(from, to);
            else if (!exists(to)) st = Status::io("shard missing before renaming").with_file(from);
          }
        }
        finals.push_back({path, d, &s});
      }
    }
  }
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, std::move(st)));
  if (c.rank == 0) {
    Totals t = compute_totals(c, results);
    uint64_t accounted = t.docs_out + t.exact + t.near + t.in.rejected_total() + t.in.filtered;
    if (accounted != t.in.docs_in)
      st = Status::internal("accounting mismatch: docs_in " + std::to_string(t.in.docs_in) +
                            " != docs_out + exact_dups + near_dups + rejected + filtered = " +
                            std::to_string(accounted));
    // removed.jsonl
    std::unordered_map<uint64_t, nlohmann::json> ids;
    for (const auto& w : results)
      for (const auto& [docid, id] : w.ids) ids[docid] = id;
    std::string removed;
    std::vector<std::string> examples;
    for (const RemovedEntry& e : c.removed) {
      nlohmann::ordered_json j;
      auto a = ids.find(e.docid), b = ids.find(e.kept);
      if (is_external(e.kept) && a != ids.end()) {
        // Kept by an earlier dataset: its id comes from that dataset's index.
        const DedupIndex& idx = *c.against.at(external_dataset(e.kept));
        auto id = idx.id_json(external_ref(e.kept));
        if (!id.is_ok()) {
          st = id.status();
          break;
        }
        nlohmann::json kept = nlohmann::json::parse(*id, nullptr, false);
        if (kept.is_discarded()) {
          st = Status::data("damaged id in the dedup index").with_file(idx.dataset_dir());
          break;
        }
        b = ids.emplace(e.kept, kept).first;
      }
      if (a == ids.end() || b == ids.end()) {
        st = Status::internal("missing id of a removed document");
        break;
      }
      j["id"] = a->second;
      j["kept"] = b->second;
      j["similarity"] = std::round(e.similarity * 1e4) / 1e4;
      if (is_external(e.kept) && !(c.against_self && external_dataset(e.kept) == 0))
        j["kept_dataset"] = c.opt.against.at(external_dataset(e.kept));
      if (!e.exact && examples.size() < 3)
        examples.push_back(
            a->second.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
            " is a near copy of " +
            b->second.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
            " (similarity " + fmt::format("{:.2f}", e.similarity) + ")");
      removed += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
    if (st.is_ok()) st = write_file_atomic(c.out + "/dedup/removed.jsonl", removed);
    nlohmann::ordered_json stats = make_stats(c, t);
    if (st.is_ok()) st = write_file_atomic(c.out + "/stats.json", stats.dump(2) + "\n");
    if (st.is_ok() && c.opt.index) st = write_index_meta(c, results);
    if (st.is_ok()) crash_point("final-removed");
    if (st.is_ok()) {
      Manifest m;
      m.tokenizer = c.tokenizer;
      for (const Final& f : finals) {
        ShardInfo info;
        info.path = c.out + "/" + f.path;
        info.samples = f.w->samples;
        info.tokens = f.w->tokens;
        info.bytes = f.w->bytes;
        info.xxh3 = f.w->xxh3;
        info.tar_bytes = f.w->tar_bytes;
        m.add_shard(info, f.domain, c.out, f.w->val);
      }
      st = write_manifest(c.out + "/manifest.json", m);
    }
    if (st.is_ok()) {
      nlohmann::json done = {{"fingerprint", c.fingerprint}};
      st = write_json_file(c.work + "/complete.json", done);
    }
    if (st.is_ok()) *summary = make_summary(stats, c.out, examples);
  }
  return comm::agree(*c.g, std::move(st));
}

// --dry-run-filters: OUT/stats.json with the scan's counts and the filters' decisions (the
// dropped documents are in rejects/ as in a full run); "dry_run_filters": true and no manifest.
Status write_filter_report(const Context& c, std::string* summary) {
  if (c.rank != 0) return Status::ok();
  FileStats in;
  for (const auto& s : c.file_stats) in.add(s);
  nlohmann::ordered_json s;
  s["dry_run_filters"] = true;
  s["docs_in"] = in.docs_in;
  s["docs_kept"] = in.valid;
  s["rejected"] = in.rejected_total();
  nlohmann::ordered_json reasons = nlohmann::ordered_json::object();
  for (int r = 0; r < kRejectReasonCount; ++r)
    reasons[reject_reason_name(static_cast<RejectReason>(r))] = in.rejected[r];
  s["rejected_by_reason"] = reasons;
  s["filtered"] = in.filtered;
  s["bytes_in"] = in.input_bytes;
  s["bytes_kept"] = in.text_bytes;
  s["filters"] = filter_stats(c, in);
  const double scan_s = c.timings.count("scan") ? c.timings.at("scan") : 0.0;
  s["timings_s"] = {{"scan", std::round(scan_s * 1000) / 1000}};
  KILN_RETURN_IF_ERROR(write_file_atomic(c.out + "/stats.json", s.dump(2) + "\n"));
  std::string text = "kiln prep --dry-run-filters: " + std::to_string(in.docs_in) +
                     " documents in, " + std::to_string(in.valid) + " kept by the filters, " +
                     std::to_string(in.filtered) + " filtered, " +
                     std::to_string(in.rejected_total()) + " rejected\n";
  for (const auto& f : s["filters"]) {
    text += "  filter " + f.value("filter", std::string()) + ": dropped " +
            std::to_string(json_integer_or(f, "docs", uint64_t{0})) + " docs (" +
            human_bytes(json_integer_or(f, "bytes", uint64_t{0})) + ")";
    std::string rules;
    for (const auto& [rule, n] : f["rules"].items())
      rules += (rules.empty() ? "" : ", ") + rule + " " +
               std::to_string(json_integer<uint64_t>(n, rule));
    if (!rules.empty()) text += ": " + rules;
    if (const auto e = json_integer_or(f, "edited", uint64_t{0}); e > 0)
      text += "; edited " + std::to_string(e) + " docs";
    text += "\n";
  }
  text += "  decisions: " + c.out + "/rejects/ (reason \"filtered\"), counts: " + c.out +
          "/stats.json; no shards written\n";
  *summary = text;
  return Status::ok();
}

// ---- the resumable stages --------------------------------------------------------------------
// run() does the stage's collective work and returns this rank's status for writing the marker
// fields it fills (the loop saves the marker and agrees on the result); resume() restores the
// stage's results from its marker. `done` is the last stage every rank has a marker for.

Status run_scan(Context& c, int, nlohmann::json*) {
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, scan_stage(c)));
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, load_filtered(c)));
  KILN_RETURN_IF_ERROR(gather_file_stats(c));
  return write_rank_rejects(c);
}
Status resume_scan(Context& c, const nlohmann::json&, int) {
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, check_units(c, /*verify=*/false)));
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, load_filtered(c)));
  return gather_file_stats(c);
}

Status run_exact(Context& c, int done, nlohmann::json* m) {
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, check_units(c, /*verify=*/done >= kScan)));
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, exact_stage(c)));
  nlohmann::json blob;
  KILN_RETURN_IF_ERROR(write_blob(c.rank_dir + "/exact.bin", encode_pairs(c.exact_dups), &blob));
  (*m)["blob"] = blob;
  (*m)["spilled_bytes"] = c.dedup.spilled_bytes;
  return Status::ok();
}
Status resume_exact(Context& c, const nlohmann::json& m, int) {
  auto bytes = read_blob(c.rank_dir + "/exact.bin", m.at("blob"));
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, bytes.is_ok() ? Status::ok() : bytes.status()));
  c.exact_dups.resize(bytes->size() / 16);
  // (memcpy from or to the null data() of an empty vector is undefined: UBSan, resuming a prep
  // whose corpus had no exact duplicates.)
  if (!c.exact_dups.empty()) std::memcpy(c.exact_dups.data(), bytes->data(), c.exact_dups.size() * 16);
  c.dedup.spilled_bytes = json_integer_or(m, "spilled_bytes", uint64_t{0});
  return Status::ok();
}

Status run_dedup(Context& c, int, nlohmann::json* m) {
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, dedup_stage(c)));
  nlohmann::json blob;
  std::string bytes(reinterpret_cast<const char*>(c.removed.data()),
                    c.removed.size() * sizeof(RemovedEntry));
  KILN_RETURN_IF_ERROR(write_blob(c.rank_dir + "/removed.bin", bytes, &blob));
  (*m)["blob"] = blob;
  (*m)["dedup"] = c.dedup.to_json();
  // Spill files are not needed any more; one left behind is removed by the next run.
  if (Status rm = remove_all(c.tmp_dir()); !rm.is_ok())
    KILN_LOG_WARN("could not remove the dedup spill folder: {}", rm.to_string());
  return Status::ok();
}
Status resume_dedup(Context& c, const nlohmann::json& m, int) {
  auto bytes = read_blob(c.rank_dir + "/removed.bin", m.at("blob"));
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, bytes.is_ok() ? Status::ok() : bytes.status()));
  c.removed.resize(bytes->size() / sizeof(RemovedEntry));
  if (!c.removed.empty())
    std::memcpy(c.removed.data(), bytes->data(), c.removed.size() * sizeof(RemovedEntry));
  c.dedup = DedupStats::from_json(m.at("dedup"));
  return Status::ok();
}

Status run_annotator(Context& c, int, nlohmann::json* m) {
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, annotator_stage(c, /*fresh=*/true)));
  (*m)["tokenizer"] = {{"path", c.tokenizer.path},
                       {"vocab_size", c.tokenizer.vocab_size},
                       {"eos_id", c.tokenizer.eos_id}};
  return Status::ok();
}
Status resume_annotator(Context& c, const nlohmann::json& m, int done) {
  const auto& t = m.at("tokenizer");
  c.tokenizer.path = t.value("path", std::string());
  c.tokenizer.vocab_size = json_integer_or(t, "vocab_size", uint64_t{0});
  c.tokenizer.eos_id = json_integer_or(t, "eos_id", int64_t{-1});
  // The write stage still to run needs the annotator itself.
  if (done < kWrite) KILN_RETURN_IF_ERROR(comm::agree(*c.g, annotator_stage(c, /*fresh=*/false)));
  return Status::ok();
}

Status run_write(Context& c, int, nlohmann::json* m) {
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, write_stage(c)));
  (*m)["result"] = c.written.to_json();
  return Status::ok();
}
Status resume_write(Context& c, const nlohmann::json& m, int) {
  c.written = WriteResult::from_json(m.at("result"));
  return Status::ok();
}

struct StageStep {
  Stage stage;
  Status (*run)(Context& c, int done, nlohmann::json* marker);
  Status (*resume)(Context& c, const nlohmann::json& marker, int done);
};
constexpr StageStep kStages[] = {{kScan, run_scan, resume_scan},
                                 {kExact, run_exact, resume_exact},
                                 {kDedup, run_dedup, resume_dedup},
                                 {kAnnotator, run_annotator, resume_annotator},
                                 {kWrite, run_write, resume_write}};

// dedup.against: opens every earlier dataset's index (refusing one built with other settings)
// and, unless the config says otherwise, takes the first one's tokenizer and domain rules so the
// new shards can be mixed with it.
Status open_against(Context& c, const PrepRunOptions& ro) {
  c.against_self = ro.against_self;
  c.key_base = ro.key_base;
  if (ro.against_self && c.opt.against.empty())
    return Status::internal("--append without the dataset in dedup.against");
  const DedupSettings mine = dedup_settings(c.opt);
  for (size_t i = 0; i < c.opt.against.size(); ++i) {
    const std::string& dir = c.opt.against[i];
    // An append to the dataset killed after its commit point: its journal decides every move, so
    // finish it before reading the dataset (as --append and kiln inspect do); refuse when that
    // cannot be done. (--append's own dataset was finished by its driver.)
    if (!(ro.against_self && i == 0)) {
      Status st;
      if (c.rank == 0) {
        auto done = finish_pending_append(dir);
        if (!done.is_ok())
          st = Status::usage(dir + " has an unfinished append (" + dir +
                             "/.kiln-append/commit.json) that could not be finished here: " +
                             done.status().to_string() + "; finish it with `kiln inspect " + dir +
                             "` where the dataset can be written, then run this again");
        else if (*done)
          KILN_LOG_INFO("{}: finished an interrupted append (its commit was decided) before "
                        "reading the dataset",
                        dir);
      }
      KILN_RETURN_IF_ERROR(comm::agree(*c.g, std::move(st)));
    }
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<DedupIndex> idx, DedupIndex::open(dir));
    KILN_RETURN_IF_ERROR(idx->settings().check_same(mine, dir));
    c.against.push_back(std::move(idx));
  }
  if (c.against.empty()) return Status::ok();
  if (c.against_self) {
    c.index_segment = c.against[0]->segments();
    if (c.index_segment >= (1u << 16)) return Status::usage(c.opt.against[0] + ": too many appends (65535)");
  }
  const DedupIndex& first = *c.against[0];
  const nlohmann::json& settings = first.meta()["settings"];
  if (c.opt.tokenizer.trains()) {
    auto m = read_manifest(first.dataset_dir());
    if (!m.is_ok()) return m.status();
    c.opt.tokenizer.path =
        m->tokenizer.path.empty() ? "none" : first.dataset_dir() + "/" + m->tokenizer.path;
    if (c.rank == 0)
      KILN_LOG_INFO("tokenizer: {} (of {})", c.opt.tokenizer.path, first.dataset_dir());
  } else if (c.against_self) {
    return Status::usage("--append uses the dataset's own tokenizer; do not give another "
                         "(tokenizer.path = " + c.opt.tokenizer.path + ")");
  }
  if (settings.contains("domains") && settings["domains"].is_object()) {
    const nlohmann::json& d = settings["domains"];
    const std::string rules = d.value("rules", std::string());
    std::string adopted;
    if (c.opt.domains.rules.empty() && !rules.empty()) {
      c.opt.domains.rules = first.dataset_dir() + "/dedup/index/" + rules;
      adopted += " rules " + c.opt.domains.rules;
    }
    if (c.opt.domains.default_domain == "web" && d.value("default", std::string("web")) != "web") {
      c.opt.domains.default_domain = d.value("default", std::string("web"));
      adopted += " default " + c.opt.domains.default_domain;
    }
    if (c.opt.domains.model.empty() && !d.value("model", std::string()).empty()) {
      c.opt.domains.model = d.value("model", std::string());
      adopted += " model " + c.opt.domains.model;
    }
    if (c.rank == 0 && !adopted.empty())
      KILN_LOG_INFO("domains:{} (of {})", adopted, first.dataset_dir());
  }
  return Status::ok();
}

// Loads every input the stages will need and that can be wrong - the domain rules, the tagger
// model, the tokenizer - before anything is written (the filters' models and lists were loaded
// with the options), so a bad one is refused with its key and leaves the output untouched. A
// loaded tokenizer's annotator is kept for the stages; when prep trains the tokenizer, the rules
// and the model are checked here and loaded again by the annotator stage.
// A file the config names that does not exist is a config error (exit 2), as for the filters'
// files; a file that exists but is damaged stays a data error (exit 3).
Status load_inputs(Context& c) {
  TokenizerOptions tokenizer = c.opt.tokenizer;
  if (tokenizer.trains()) tokenizer.path = "none";
  auto annotator = Annotator::create(c.opt.domains, tokenizer, {});
  if (!annotator.is_ok()) {
    Status st = std::move(annotator).take_status();
    if (st.code() == StatusCode::kNotFound) return Status::config(st.to_string());
    return st;
  }
  if (!c.opt.tokenizer.trains()) c.annotator = std::move(*annotator);
  return Status::ok();
}

}  // namespace

Result<PrepResult> run_prep(const Config& config, comm::ProcessGroup& g,
                            const PrepRunOptions& run_options) {
  const auto t_start = std::chrono::steady_clock::now();
  // SIGTERM / SIGINT / SIGUSR1: stop at the next safe point (a finished scan unit or stage), where
  // the same command resumes; a second signal ends the process at once.
  StopSignals stop_signals("prep after the current unit or stage");
  Context c;
  c.g = &g;
  c.rank = g.rank();
  c.size = g.size();
  KILN_ASSIGN_OR_RETURN(c.opt, prep_options_from_config(config));
  if (c.opt.output.empty()) return Status::usage("no output folder given (--output OUT)");
  if (c.opt.inputs.empty()) return Status::usage("no input given (--input PATH...)");
  c.out = c.opt.output;
  while (c.out.size() > 1 && c.out.back() == '/') c.out.pop_back();
  c.work = c.out + "/.kiln-prep";
  c.rank_dir = c.work + "/rank-" + rank_tag(c.rank);

  std::unique_ptr<tbb::global_control> threads;
  if (c.opt.threads > 0)
    threads = std::make_unique<tbb::global_control>(
        tbb::global_control::max_allowed_parallelism, static_cast<size_t>(c.opt.threads));

  // Inputs: every rank lists them and they must agree.
  auto files = discover_inputs(c.opt.inputs);
  KILN_RETURN_IF_ERROR(comm::agree(g, files.is_ok() ? Status::ok() : files.status()));
  c.files = std::move(*files);
  {
    // An output folder inside an input folder is not input (its rejects/ and removed.jsonl
    // would be read back on the next run).
    // A path that cannot be resolved stays as given: it then simply does not match (the error
    // codes only choose between the resolved and the given spelling).
    std::error_code ec;
    fs::path out_abs = fs::weakly_canonical(fs::absolute(c.out, ec), ec);
    std::string prefix = out_abs.string() + "/";
    std::vector<InputFile> kept;
    for (auto& f : c.files) {
      std::string abs = fs::weakly_canonical(fs::absolute(f.path, ec), ec).string();
      if (abs.rfind(prefix, 0) != 0) kept.push_back(std::move(f));
    }
    c.files = std::move(kept);
    if (c.files.empty()) return Status::usage("the inputs hold no files (outside --output)");
  }
  if (c.files.size() >= kMaxInputFiles)
    return Status::usage("too many input files (" + std::to_string(c.files.size()) +
                         "); at most " + std::to_string(kMaxInputFiles - 1));
  {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& f : c.files) list.push_back({f.path, f.size});
    uint64_t h = xxh3_64(list.dump());
    KILN_ASSIGN_OR_RETURN(uint64_t hmin, comm::allreduce_value<uint64_t>(g, h, comm::ReduceOp::kMin));
    KILN_ASSIGN_OR_RETURN(uint64_t hmax, comm::allreduce_value<uint64_t>(g, h, comm::ReduceOp::kMax));
    if (hmin != hmax) return Status::usage("ranks see different input files (is the input on a shared file system?)");
  }
  KILN_RETURN_IF_ERROR(open_against(c, run_options));
  c.rank_file_begin = split_files(c.files, c.size);
  c.units = make_units(c.files, c.my_first_file(), c.my_last_file());
  c.file_stats.assign(c.files.size(), FileStats{});
  c.layout = RecordLayout::make(c.opt.near, c.opt.lsh.bands, c.opt.num_perm);
  c.hasher = std::make_unique<MinHasher>(c.opt.num_perm, c.opt.seed);
  nlohmann::json fp_described;
  c.fingerprint = make_fingerprint(config, c, &fp_described);

  // ---- earlier runs in OUT ----
  PrepResult result;
  result.lsh = c.opt.lsh;
  if (std::find(run_options.done_fingerprints.begin(), run_options.done_fingerprints.end(),
                c.fingerprint) != run_options.done_fingerprints.end()) {
    result.already_complete = true;
    result.done_before = true;
    return result;
  }
  // What OUT holds, as every rank sees it (the ranks agree on the largest).
  enum Verdict : int64_t { kFreshOrResume = 0, kComplete = 1, kConflict = 2 };
  int64_t verdict = kFreshOrResume;
  std::string why;
  if (c.rank == 0) {
    auto complete = read_json_file(c.work + "/complete.json");
    bool have_outputs = false;
    for (const char* o : kOutputs) have_outputs |= exists(c.out + "/" + o);
    if (complete.is_ok() && complete->value("fingerprint", "") == c.fingerprint &&
        exists(c.out + "/manifest.json")) {
      verdict = kComplete;
    } else if (complete.is_ok() || (have_outputs && !exists(c.rank_dir + "/fingerprint.json"))) {
      verdict = kConflict;
      why = c.out + " already holds a dataset" +
            std::string(complete.is_ok() ? " made with other settings or inputs" : "");
    }
  }
  {
    auto fp = read_json_file(c.rank_dir + "/fingerprint.json");
    if (fp.is_ok() && fp->value("fingerprint", "") != c.fingerprint && verdict == kFreshOrResume) {
      verdict = kConflict;
      why = c.out + " holds an unfinished prep run with other settings or inputs";
    }
  }
  KILN_ASSIGN_OR_RETURN(int64_t v, comm::allreduce_value<int64_t>(g, verdict, comm::ReduceOp::kMax));
  KILN_RETURN_IF_ERROR(comm::bcast_string(g, &why, 0));
  if (v == kConflict && why.empty()) why = c.out + " holds an unfinished prep run with other settings or inputs";
  if (v == kComplete && run_options.overwrite) v = kConflict;
  if (v == kComplete) {
    if (c.rank == 0) {
      KILN_ASSIGN_OR_RETURN(std::string stats_text, read_file(c.out + "/stats.json"));
      nlohmann::ordered_json stats = nlohmann::ordered_json::parse(stats_text, nullptr, false);
      if (stats.is_discarded()) return Status::data("not valid JSON").with_file(c.out + "/stats.json");
      result.summary = make_summary(stats, c.out) + "  (already complete: nothing to do)\n";
      result.docs_in = json_integer_or(stats, "docs_in", uint64_t{0});
      result.docs_out = json_integer_or(stats, "docs_out", uint64_t{0});
      result.exact_dups = json_integer_or(stats, "exact_dups", uint64_t{0});
      result.near_dups = json_integer_or(stats, "near_dups", uint64_t{0});
      result.rejected = json_integer_or(stats, "rejected", uint64_t{0});
      result.filtered = json_integer_or(stats, "filtered", uint64_t{0});
    }
    result.already_complete = true;
    // Killed after the dataset was complete but before the work folder went: finish the cleanup.
    KILN_RETURN_IF_ERROR(clear_stale_temporaries(c));
    if (!c.opt.keep_work) remove_work_folder(c);
    return result;
  }
  // Nothing has been written yet: refuse a bad input now, before --overwrite removes anything.
  KILN_RETURN_IF_ERROR(comm::agree(g, load_inputs(c)));
  if (v == kConflict) {
    if (!run_options.overwrite)
      return Status::usage(why + "; rerun with --overwrite to replace it, or choose another --output");
    if (c.rank == 0) {
      KILN_LOG_INFO("--overwrite: removing the earlier output in {}", c.out);
      for (const char* o : kOutputs) KILN_RETURN_IF_ERROR(remove_all(c.out + "/" + o));
      KILN_RETURN_IF_ERROR(remove_all(c.work));
    }
    KILN_RETURN_IF_ERROR(g.barrier());
    KILN_RETURN_IF_ERROR(remove_all(c.rank_dir));
  }
  KILN_RETURN_IF_ERROR(make_dirs(c.rank_dir));
  KILN_RETURN_IF_ERROR(remove_all(c.tmp_dir()));
  fp_described["fingerprint"] = c.fingerprint;
  KILN_RETURN_IF_ERROR(write_json_file(c.rank_dir + "/fingerprint.json", fp_described));
  KILN_RETURN_IF_ERROR(make_dirs(c.out + "/rejects"));
  KILN_RETURN_IF_ERROR(make_dirs(c.out + "/dedup"));
  KILN_RETURN_IF_ERROR(clear_stale_temporaries(c));

  if (c.rank == 0) {
    KILN_LOG_INFO("prep: {} input files, {} rank(s), threads {}, memory budget {} MiB",
                  c.files.size(), c.size, tbb::this_task_arena::max_concurrency(),
                  c.opt.memory_bytes >> 20);
    if (c.opt.near)
      KILN_LOG_INFO("near-dup: Jaccard >= {:.2f}, {} permutations ({} kernel), {}-grams; {}",
                    c.opt.threshold, c.opt.num_perm, c.hasher->kernel(), c.opt.ngram,
                    describe_lsh(c.opt.lsh));
  }

  // ---- resume point ----
  int mine = local_progress(c);
  KILN_ASSIGN_OR_RETURN(int64_t done, comm::allreduce_value<int64_t>(g, mine, comm::ReduceOp::kMin));
  result.resumed = done > kNone;
  if (done > kNone && c.rank == 0)
    KILN_LOG_INFO("resuming: stages up to '{}' are already done", stage_name(static_cast<int>(done)));

  // Stages 1-5: each either resumes from its marker or runs and writes the marker.
  for (const StageStep& step : kStages) {
    if (done >= step.stage) {
      KILN_ASSIGN_OR_RETURN(nlohmann::json m, load_marker(c, step.stage));
      c.timings[stage_name(step.stage)] = m.value("seconds", 0.0);
      KILN_RETURN_IF_ERROR(step.resume(c, m, static_cast<int>(done)));
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      nlohmann::json m;
      Status st = step.run(c, static_cast<int>(done), &m);
      if (st.is_ok()) st = save_marker(c, step.stage, m, seconds_since(t0));
      KILN_RETURN_IF_ERROR(comm::agree(g, std::move(st)));
    }
    if (step.stage == kScan) KILN_RETURN_IF_ERROR(check_reject_fraction(c));
    if (step.stage == kScan && run_options.filters_only) {
      // --dry-run-filters: the decisions (rejects/ and stats.json), no dedup, no shards.
      KILN_RETURN_IF_ERROR(comm::agree(g, write_filter_report(c, &result.summary)));
      KILN_RETURN_IF_ERROR(g.barrier());
      if (!c.opt.keep_work) remove_work_folder(c);
      FileStats in;
      for (const auto& fs_ : c.file_stats) in.add(fs_);
      result.docs_in = in.docs_in;
      result.rejected = in.rejected_total();
      result.filtered = in.filtered;
      result.docs_out = in.valid;
      return result;
    }
    // A safe point: this stage's marker is on disk on every rank. Every rank stops here when any
    // rank got a stop signal.
    KILN_ASSIGN_OR_RETURN(int64_t sig, comm::allreduce_value<int64_t>(
                                           g, StopSignals::requested(), comm::ReduceOp::kMax));
    if (sig) return stopped_by_signal(static_cast<int>(sig), stage_name(step.stage));
  }

  // Stage 6: manifest, stats, removed list (rank 0), shard renumbering (every rank).
  KILN_RETURN_IF_ERROR(final_stage(c, &result.summary));
  KILN_RETURN_IF_ERROR(g.barrier());
  crash_point("final-cleanup");
  if (!c.opt.keep_work) remove_work_folder(c);

  // Totals for the caller (identical on every rank).
  FileStats in;
  for (const auto& s : c.file_stats) in.add(s);
  result.docs_in = in.docs_in;
  result.rejected = in.rejected_total();
  for (int r = 0; r < kRejectReasonCount; ++r)
    if (in.rejected[r]) result.rejected_by_reason[reject_reason_name(static_cast<RejectReason>(r))] = in.rejected[r];
  for (const RemovedEntry& e : c.removed) (e.exact ? result.exact_dups : result.near_dups) += 1;
  result.filtered = in.filtered;
  result.docs_out =
      result.docs_in - result.rejected - result.filtered - result.exact_dups - result.near_dups;
  if (c.rank == 0)
    KILN_LOG_INFO("prep finished in {:.1f}s", seconds_since(t_start));
  return result;
}

}  // namespace kiln::prep
