// Stage 1 (scan): read + validate every input record of this rank's files, normalise, hash
// (exact 128-bit), shingle and MinHash the valid ones, and write per-unit tables (one record per
// valid document) and reject lists. A unit is done when its marker (with the tables' checksums)
// exists, so a killed scan resumes at unit granularity.
#include <tbb/parallel_for.h>
#include <tbb/parallel_for_each.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <tuple>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"
#include "common/progress.h"
#include "common/stop_signal.h"
#include "common/tsan.h"
#include "dataprep/dedup/normalise.h"
#include "dataprep/dedup/shingle.h"
#include "dataprep/stages/batch_pipeline.h"
#include "dataprep/stages/stages.h"
#include "dataprep/stages/work_files.h"

namespace kiln::prep::detail {
namespace {

struct ScanWork {
  RawBatch raw;
  std::string table;
  std::string rejects;
  std::string filtered;  // u64 docids the quality filters dropped, in order
  FileStats stats;
};

void append_raw(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}

std::string reject_line(const std::string& file, uint64_t line, RejectReason reason,
                        const std::string& detail, std::string_view excerpt) {
  nlohmann::json j;
  j["file"] = file;
  j["line"] = line;
  j["reason"] = reject_reason_name(reason);
  j["detail"] = detail;
  if (!excerpt.empty()) j["excerpt"] = std::string(excerpt.substr(0, 200));
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// The rejects/ line of a document a quality filter dropped: like a reject, with the filter's
// measurement (docs/PREP.md "Quality filters").
std::string filtered_line(const Context& c, const std::string& file, uint64_t line,
                          const Document& doc, const filter::ChainOutcome& o,
                          std::string_view text) {
  const filter::FilterChain& chain = *c.opt.filters;
  nlohmann::json j;
  j["file"] = file;
  j["line"] = line;
  j["reason"] = "filtered";
  j["id"] =
      doc.id_is_number ? nlohmann::json::parse(doc.id, nullptr, false) : nlohmann::json(doc.id);
  j["filter"] = chain.label(o.dropped_by);
  j["rule"] = o.drop.rule;
  j["value"] = o.drop.value;
  j["threshold"] = o.drop.threshold;
  j["detail"] = chain.describe(o);
  if (!text.empty()) j["excerpt"] = std::string(text.substr(0, 200));
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

struct Scratch {
  Document doc;
  std::string text;  // the text the filters work on
  std::string norm;
  std::vector<uint64_t> shingles;
  std::vector<uint64_t> sig;
  std::vector<uint64_t> keys;
};

void process_batch(const Context& c, ScanWork* w) {
  thread_local Scratch s;
  const RecordLayout& L = c.layout;
  const NormaliseOptions nopt{c.opt.strip_punct};
  s.sig.resize(L.num_perm);
  s.keys.resize(L.bands);
  w->table.reserve(w->raw.items.size() * L.bytes);
  const filter::FilterChain& chain = *c.opt.filters;
  if (!chain.empty()) w->stats.filters.resize(chain.size());
  const InputView in = c.inputs();
  for (const RawItem& it : w->raw.items) {
    ++w->stats.docs_in;
    ParseResult pr =
        parse_item(in, w->raw, it, /*want_fields=*/chain.needs_url(), &s.doc, /*copy_text=*/false);
    const uint64_t this_docid = make_docid(w->raw.fid, it.ordinal);
    if (!pr.ok) {
      ++w->stats.rejected[static_cast<int>(pr.reason)];
      std::string_view excerpt = it.kind == LineEventKind::kLine ? w->raw.text(it) : "";
      w->rejects += reject_line(c.files[w->raw.fid].path, it.line, pr.reason, pr.detail, excerpt);
      continue;
    }
    const uint64_t docid = make_docid(w->raw.fid, it.ordinal);
    w->stats.input_bytes += pr.text.size();
    std::string_view text = pr.text;
    if (!chain.empty()) {
      // The quality filters, in the scan pass: what they drop never reaches the table.
      s.text.assign(pr.text);
      const filter::FilterInput in{
          s.doc.url, !c.url_dups.empty() &&
                         std::binary_search(c.url_dups.begin(), c.url_dups.end(), this_docid)};
      const filter::ChainOutcome o = chain.run(&s.text, in);
      if (!o.keep) {
        ++w->stats.filtered;
        FilterTally& t = w->stats.filters[o.dropped_by];
        ++t.docs;
        t.bytes += pr.text.size();
        ++t.rules[o.drop.rule];
        w->rejects += filtered_line(c, c.files[w->raw.fid].path, it.line, s.doc, o, pr.text);
        append_raw(&w->filtered, &docid, 8);
        continue;
      }
      if (o.edited_mask != 0) {
        // (per filter, the edit of the last editing filter is attributed the byte change of the
        // whole chain; the counts of edited documents are per filter)
        for (size_t i = 0; i < chain.size() && i < 64; ++i)
          if (o.edited_mask >> i & 1) ++w->stats.filters[i].edited;
        const int last = 63 - __builtin_clzll(o.edited_mask);
        w->stats.filters[last].edited_bytes +=
            static_cast<int64_t>(pr.text.size()) - static_cast<int64_t>(s.text.size());
      }
      text = s.text;
    }
    ++w->stats.valid;
    w->stats.text_bytes += text.size();
    w->stats.repaired += pr.repaired;
    normalise_for_dedup(text, nopt, &s.norm);
    Hash128 h = xxh3_128(s.norm);
    uint32_t text_bytes = static_cast<uint32_t>(std::min<size_t>(text.size(), UINT32_MAX));
    uint32_t flags = 0;
    if (L.num_perm > 0) {
      shingle_hashes(s.norm, c.opt.ngram, &s.shingles);
      if (!s.shingles.empty()) {
        c.hasher->signature(s.shingles.data(), s.shingles.size(), s.sig.data());
        lsh_band_keys(s.sig.data(), c.opt.lsh, s.keys.data());
        flags |= kFlagHasSig;
      } else {
        std::fill(s.sig.begin(), s.sig.end(), kEmptySlot);
        std::fill(s.keys.begin(), s.keys.end(), 0);
      }
    }
    append_raw(&w->table, &docid, 8);
    append_raw(&w->table, &h.lo, 8);
    append_raw(&w->table, &h.hi, 8);
    append_raw(&w->table, &text_bytes, 4);
    append_raw(&w->table, &flags, 4);
    if (L.bands > 0) append_raw(&w->table, s.keys.data(), 8 * s.keys.size());
    if (L.num_perm > 0) append_raw(&w->table, s.sig.data(), 8 * s.sig.size());
  }
}

struct UnitOutput {
  AtomicFile table, rejects, filtered;
  Xxh3Stream table_hash, rejects_hash, filtered_hash;
  uint64_t table_bytes = 0, rejects_bytes = 0, filtered_bytes = 0;
  Status write(const std::string& tbl, const std::string& rej, const std::string& flt) {
    if (!flt.empty()) {
      KILN_RETURN_IF_ERROR(filtered.write(flt));
      filtered_hash.update(flt);
      filtered_bytes += flt.size();
    }
    if (!tbl.empty()) {
      KILN_RETURN_IF_ERROR(table.write(tbl));
      table_hash.update(tbl);
      table_bytes += tbl.size();
    }
    if (!rej.empty()) {
      KILN_RETURN_IF_ERROR(rejects.write(rej));
      rejects_hash.update(rej);
      rejects_bytes += rej.size();
    }
    return Status::ok();
  }
};

Status scan_file(const Context& c, uint32_t fid, UnitOutput* out, FileStats* stats,
                 Progress* progress) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<FileBatcher> batcher, FileBatcher::open(c.inputs(), fid));
  uint64_t reported = 0;
  return run_batch_pipeline<ScanWork>(
      [&](ScanWork& w) -> Result<bool> {
        auto more = batcher->next(&w.raw);
        if (progress) {
          const uint64_t now = batcher->disk_bytes();
          progress->add((now >> 20) - (reported >> 20));
          reported = now;
        }
        return more;
      },
      [&](ScanWork& w) {
        process_batch(c, &w);
        return Status::ok();
      },
      [&](ScanWork& w) {
        KILN_RETURN_IF_ERROR(out->write(w.table, w.rejects, w.filtered));
        stats->add(w.stats);
        crash_point("scan-batch");
        return Status::ok();
      });
}

Status scan_unit(const Context& c, const FileRun& u, Progress* progress) {
  UnitOutput out;
  KILN_RETURN_IF_ERROR(out.table.open(c.unit_path(u, "tbl")));
  KILN_RETURN_IF_ERROR(out.rejects.open(c.unit_path(u, "rej")));
  KILN_RETURN_IF_ERROR(out.filtered.open(c.unit_path(u, "flt")));
  nlohmann::json marker;
  marker["first"] = u.first;
  marker["last"] = u.last;
  marker["files"] = nlohmann::json::array();
  for (uint32_t fid = u.first; fid < u.last; ++fid) {
    FileStats st;
    KILN_RETURN_IF_ERROR(scan_file(c, fid, &out, &st, progress));
    marker["files"].push_back(st.to_json());
  }
  KILN_RETURN_IF_ERROR(out.table.commit());
  KILN_RETURN_IF_ERROR(out.rejects.commit());
  KILN_RETURN_IF_ERROR(out.filtered.commit());
  marker["table"] = {{"bytes", out.table_bytes}, {"xxh3", hex64(out.table_hash.digest())}};
  marker["rejects"] = {{"bytes", out.rejects_bytes}, {"xxh3", hex64(out.rejects_hash.digest())}};
  marker["filtered"] = {{"bytes", out.filtered_bytes}, {"xxh3", hex64(out.filtered_hash.digest())}};
  KILN_RETURN_IF_ERROR(write_json_file(c.unit_path(u, "done"), marker));
  crash_point("scan-unit");
  return Status::ok();
}

// Loads a unit's marker into c.file_stats when the unit is complete (and, with verify, its files
// match their checksums). Returns false when the unit must be scanned again.
bool load_unit(Context& c, const FileRun& u, bool verify) {
  auto marker = read_json_file(c.unit_path(u, "done"));
  if (!marker.is_ok()) return false;
  const nlohmann::json& m = *marker;
  try {
    if (json_integer_at<uint32_t>(m, "first") != u.first ||
        json_integer_at<uint32_t>(m, "last") != u.last)
      return false;
    for (const char* part : {"table", "rejects", "filtered"}) {
      const std::string p = part;
      std::string path = c.unit_path(u, p == "table" ? "tbl" : p == "rejects" ? "rej" : "flt");
      std::error_code ec;
      uint64_t size = std::filesystem::file_size(path, ec);
      if (ec || size != json_integer_at<uint64_t>(m.at(part), "bytes")) return false;
      if (verify) {
        auto h = xxh3_file(path);
        if (!h.is_ok() || hex64(*h) != m.at(part).at("xxh3").get<std::string>()) {
          KILN_LOG_WARN("work file {} does not match its checksum; scanning it again", path);
          return false;
        }
      }
    }
    const auto& files = m.at("files");
    if (files.size() != u.last - u.first) return false;
    for (uint32_t fid = u.first; fid < u.last; ++fid)
      c.file_stats[fid] = FileStats::from_json(files.at(fid - u.first));
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return true;
}

// URL dedup (the url filter's dedup): the documents of this rank whose normalised URL an
// earlier valid document of the run has (keep the first, in the global document order), into
// c.url_dups. Collective: every rank reads its files' URLs, sends (URL hash, docid) to the rank
// owning the hash, owners keep the smallest docid of each hash and send the others back. Run at
// every scan (a resumed scan recomputes the same set), so nothing is stored.
Status find_url_duplicates(Context& c) {
  struct Entry {
    uint64_t lo, hi, docid;
  };
  const uint32_t first = c.my_first_file(), last = c.my_last_file();
  std::vector<std::vector<Entry>> per_file(last - first);
  Status status;
  std::mutex mu;
  const InputView in = c.inputs();
  const tsan::ForkJoin fork_join;
  tbb::parallel_for(first, last, fork_join.task([&](uint32_t fid) {
    auto fail = [&](Status st) {
      std::lock_guard lock(mu);
      if (status.is_ok()) status = std::move(st);
    };
    auto batcher = FileBatcher::open(c.inputs(), fid);
    if (!batcher.is_ok()) return fail(std::move(batcher).take_status());
    RawBatch b;
    Document doc;
    while (true) {
      auto more = (*batcher)->next(&b);
      if (!more.is_ok()) return fail(std::move(more).take_status());
      if (!*more) break;
      for (const RawItem& it : b.items) {
        ParseResult pr = parse_item(in, b, it, /*want_fields=*/true, &doc, /*copy_text=*/false);
        if (!pr.ok || doc.url.empty()) continue;
        const std::string key = filter::url_dedup_key(doc.url);
        if (key.empty()) continue;
        const Hash128 h = xxh3_128(key);
        per_file[fid - first].push_back({h.lo, h.hi, make_docid(fid, it.ordinal)});
      }
    }
  }));
  fork_join.join();
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, std::move(status)));
  std::vector<std::vector<Entry>> to_owner(c.size);
  for (const auto& v : per_file)
    for (const Entry& e : v) to_owner[e.lo % c.size].push_back(e);
  per_file.clear();
  KILN_ASSIGN_OR_RETURN(std::vector<Entry> mine, comm::alltoallv(*c.g, to_owner));
  to_owner.clear();
  std::sort(mine.begin(), mine.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.lo, a.hi, a.docid) < std::tie(b.lo, b.hi, b.docid);
  });
  std::vector<std::vector<uint64_t>> back(c.size);
  for (size_t i = 1; i < mine.size(); ++i)
    if (mine[i].lo == mine[i - 1].lo && mine[i].hi == mine[i - 1].hi)
      back[c.file_owner(docid_file(mine[i].docid))].push_back(mine[i].docid);
  KILN_ASSIGN_OR_RETURN(c.url_dups, comm::alltoallv(*c.g, back));
  std::sort(c.url_dups.begin(), c.url_dups.end());
  return Status::ok();
}

}  // namespace

Status load_filtered(Context& c) {
  c.filtered.clear();
  for (const FileRun& u : c.units) {
    KILN_ASSIGN_OR_RETURN(std::string bytes, read_file(c.unit_path(u, "flt")));
    if (bytes.size() % 8 != 0)
      return Status::data("damaged work file").with_file(c.unit_path(u, "flt"));
    const size_t n = bytes.size() / 8, at = c.filtered.size();
    c.filtered.resize(at + n);
    if (n > 0) std::memcpy(c.filtered.data() + at, bytes.data(), bytes.size());
  }
  if (!std::is_sorted(c.filtered.begin(), c.filtered.end()))
    return Status::internal("the filtered documents are out of order");
  return Status::ok();
}

Status check_units(Context& c, bool verify_checksums) {
  for (const FileRun& u : c.units) {
    if (!load_unit(c, u, verify_checksums))
      return Status::data("a scan work file is missing or damaged (" + c.unit_path(u, "tbl") +
                          "); rerun with --overwrite to start again");
  }
  return Status::ok();
}

Status scan_stage(Context& c) {
  KILN_RETURN_IF_ERROR(make_dirs(c.rank_dir + "/units"));
  if (c.opt.filters->url_dedup()) KILN_RETURN_IF_ERROR(find_url_duplicates(c));
  std::vector<FileRun> pending;
  uint64_t pending_bytes = 0;
  for (const FileRun& u : c.units) {
    if (load_unit(c, u, /*verify=*/true)) continue;
    pending.push_back(u);
    for (uint32_t f = u.first; f < u.last; ++f) pending_bytes += c.files[f].size;
  }
  if (pending.size() < c.units.size() && c.rank == 0)
    KILN_LOG_INFO("scan: {} of {} input units already done (resuming)",
                  c.units.size() - pending.size(), c.units.size());
  std::unique_ptr<Progress> progress;
  if (c.rank == 0 && !pending.empty())
    progress = std::make_unique<Progress>("scan", pending_bytes >> 20, "MiB");
  Status status;
  std::mutex mu;
  const tsan::ForkJoin fork_join;
  tbb::parallel_for_each(pending.begin(), pending.end(), fork_join.task([&](const FileRun& u) {
    {
      std::lock_guard lock(mu);
      if (!status.is_ok()) return;
      // A stop signal: finished units keep their markers; the rest are scanned on the rerun.
      if (int sig = StopSignals::requested()) {
        status = Status::internal("stopped by " + StopSignals::name(sig) +
                                  " during the scan; run the same command again to resume (" +
                                  "finished input units are kept)");
        return;
      }
    }
    Status st;
    tbb::this_task_arena::isolate([&] { st = scan_unit(c, u, progress.get()); });
    if (!st.is_ok()) {
      std::lock_guard lock(mu);
      if (status.is_ok()) status = std::move(st);
    }
  }));
  fork_join.join();
  if (progress) progress->finish();
  KILN_RETURN_IF_ERROR(status);
  // Every unit is done: load the stats of the ones just written.
  for (const FileRun& u : pending)
    if (!load_unit(c, u, /*verify=*/false))
      return Status::internal("unit marker missing right after the scan")
          .with_file(c.unit_path(u, "done"));
  return Status::ok();
}

}  // namespace kiln::prep::detail
