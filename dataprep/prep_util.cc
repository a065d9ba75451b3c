// Small helpers of the prep pipeline: records, JSON state files, blobs, batching input files.
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"
#include "dataprep/prep_internal.h"

namespace kiln::prep::detail {
namespace fs = std::filesystem;

const char* stage_name(int stage) {
  switch (stage) {
    case kScan: return "scan";
    case kExact: return "exact";
    case kDedup: return "dedup";
    case kAnnotator: return "annotate";
    case kWrite: return "write";
    case kFinal: return "final";
    default: return "none";
  }
}

void FilterTally::add(const FilterTally& o) {
  docs += o.docs;
  bytes += o.bytes;
  edited += o.edited;
  edited_bytes += o.edited_bytes;
  for (const auto& [rule, n] : o.rules) rules[rule] += n;
}

void FileStats::add(const FileStats& o) {
  docs_in += o.docs_in;
  valid += o.valid;
  text_bytes += o.text_bytes;
  input_bytes += o.input_bytes;
  repaired += o.repaired;
  filtered += o.filtered;
  if (filters.size() < o.filters.size()) filters.resize(o.filters.size());
  for (size_t i = 0; i < o.filters.size(); ++i) filters[i].add(o.filters[i]);
  for (int i = 0; i < kRejectReasonCount; ++i) rejected[i] += o.rejected[i];
}

nlohmann::json FileStats::to_json() const {
  nlohmann::json j;
  j["docs_in"] = docs_in;
  j["valid"] = valid;
  j["text_bytes"] = text_bytes;
  j["repaired"] = repaired;
  j["rejected"] = rejected;
  if (input_bytes != text_bytes || filtered > 0 || !filters.empty()) {
    j["input_bytes"] = input_bytes;
    j["filtered"] = filtered;
    nlohmann::json fl = nlohmann::json::array();
    for (const FilterTally& t : filters)
      fl.push_back({{"docs", t.docs},
                    {"bytes", t.bytes},
                    {"edited", t.edited},
                    {"edited_bytes", t.edited_bytes},
                    {"rules", t.rules}});
    j["filters"] = fl;
  }
  return j;
}

FileStats FileStats::from_json(const nlohmann::json& j) {
  FileStats s;
  s.docs_in = json_integer_at<uint64_t>(j, "docs_in");
  s.valid = json_integer_at<uint64_t>(j, "valid");
  s.text_bytes = json_integer_at<uint64_t>(j, "text_bytes");
  s.repaired = json_integer_at<uint64_t>(j, "repaired");
  s.input_bytes =
      j.contains("input_bytes") ? json_integer_at<uint64_t>(j, "input_bytes") : s.text_bytes;
  if (j.contains("filtered")) s.filtered = json_integer_at<uint64_t>(j, "filtered");
  if (j.contains("filters") && j["filters"].is_array()) {
    for (const auto& f : j["filters"]) {
      FilterTally t;
      t.docs = json_integer_at<uint64_t>(f, "docs");
      t.bytes = json_integer_at<uint64_t>(f, "bytes");
      t.edited = json_integer_at<uint64_t>(f, "edited");
      t.edited_bytes = json_integer_at<int64_t>(f, "edited_bytes");
      if (f.contains("rules") && f["rules"].is_object())
        for (const auto& [rule, n] : f["rules"].items())
          t.rules[rule] = json_integer<uint64_t>(n, rule);
      s.filters.push_back(std::move(t));
    }
  }
  auto r = json_integers<uint64_t>(j.at("rejected"), "rejected");
  for (size_t i = 0; i < r.size() && i < s.rejected.size(); ++i) s.rejected[i] = r[i];
  return s;
}

RecordLayout RecordLayout::make(bool near, int bands, int num_perm) {
  RecordLayout l;
  l.bands = near ? bands : 0;
  l.num_perm = near ? num_perm : 0;
  l.keys_offset = 32;
  l.sig_offset = l.keys_offset + 8 * static_cast<size_t>(l.bands);
  l.bytes = l.sig_offset + 8 * static_cast<size_t>(l.num_perm);
  return l;
}

uint64_t RecordView::load64(size_t off) const {
  uint64_t v;
  std::memcpy(&v, p + off, 8);
  return v;
}
uint32_t RecordView::load32(size_t off) const {
  uint32_t v;
  std::memcpy(&v, p + off, 4);
  return v;
}

nlohmann::json DedupStats::to_json() const {
  return {{"candidate_pairs", candidate_pairs},
          {"verified_pairs", verified_pairs},
          {"spilled_bytes", spilled_bytes}};
}
DedupStats DedupStats::from_json(const nlohmann::json& j) {
  DedupStats d;
  d.candidate_pairs = json_integer_or(j, "candidate_pairs", uint64_t{0});
  d.verified_pairs = json_integer_or(j, "verified_pairs", uint64_t{0});
  d.spilled_bytes = json_integer_or(j, "spilled_bytes", uint64_t{0});
  return d;
}

nlohmann::json WriteResult::to_json() const {
  nlohmann::json j;
  j["docs_out"] = docs_out;
  j["shards"] = nlohmann::json::array();
  for (const auto& s : shards)
    j["shards"].push_back({{"path", s.path}, {"domain", s.domain}, {"samples", s.samples},
                           {"tokens", s.tokens}, {"bytes", s.bytes}, {"xxh3", hex64(s.xxh3)},
                           {"tar_bytes", s.tar_bytes}, {"val", s.val}});
  j["domains"] = nlohmann::json::object();
  for (const auto& [name, d] : domains)
    j["domains"][name] = {{"docs", d.docs}, {"tokens", d.tokens}, {"bytes", d.bytes},
                          {"domain_by", d.domain_by}, {"val_docs", d.val_docs},
                          {"val_tokens", d.val_tokens}};
  j["ids"] = nlohmann::json::array();
  for (const auto& [docid, id] : ids) j["ids"].push_back({docid, id});
  j["index_run"] = index_run;
  return j;
}

WriteResult WriteResult::from_json(const nlohmann::json& j) {
  WriteResult w;
  w.docs_out = json_integer_at<uint64_t>(j, "docs_out");
  if (j.contains("index_run")) w.index_run = j["index_run"];
  for (const auto& s : j.at("shards")) {
    WrittenShard ws;
    ws.path = s.at("path").get<std::string>();
    ws.domain = s.at("domain").get<std::string>();
    ws.samples = json_integer_at<uint64_t>(s, "samples");
    ws.tokens = json_integer_at<uint64_t>(s, "tokens");
    ws.bytes = json_integer_at<uint64_t>(s, "bytes");
    auto h = parse_hex64(s.at("xxh3").get<std::string>());
    ws.xxh3 = h.is_ok() ? *h : 0;
    ws.val = s.value("val", false);
    ws.tar_bytes = json_integer_or(s, "tar_bytes", uint64_t{0});
    w.shards.push_back(ws);
  }
  for (const auto& [name, d] : j.at("domains").items()) {
    DomainStats ds;
    ds.docs = json_integer_at<uint64_t>(d, "docs");
    ds.tokens = json_integer_at<uint64_t>(d, "tokens");
    ds.bytes = json_integer_at<uint64_t>(d, "bytes");
    ds.domain_by = json_integer_map<uint64_t>(d.at("domain_by"), "domain_by");
    ds.val_docs = json_integer_or(d, "val_docs", uint64_t{0});
    ds.val_tokens = json_integer_or(d, "val_tokens", uint64_t{0});
    w.domains[name] = ds;
  }
  for (const auto& p : j.at("ids")) w.ids.emplace_back(json_integer<uint64_t>(p.at(0), "ids"), p.at(1));
  return w;
}

uint32_t Context::file_owner(uint32_t fid) const {
  // rank_file_begin is non-decreasing; the owner is the last rank whose begin <= fid.
  auto it = std::upper_bound(rank_file_begin.begin(), rank_file_begin.end() - 1, fid);
  return static_cast<uint32_t>(it - rank_file_begin.begin()) - 1;
}

std::string Context::unit_path(const FileRun& u, const char* ext) const {
  char name[64];
  std::snprintf(name, sizeof name, "/units/u-%08u.%s", u.first, ext);
  return rank_dir + name;
}

std::string Context::stage_marker(int stage) const {
  return rank_dir + "/stage-" + std::to_string(stage) + "-" + stage_name(stage) + ".json";
}

void Context::refilter(Document* doc) const {
  const filter::FilterChain& chain = *opt.filters;
  if (!chain.rewrites() && !chain.annotates()) return;
  const filter::ChainOutcome o = chain.replay_kept(&doc->text, doc->url);
  if (!o.annotations.language.empty()) {
    if (!doc->carried.is_object()) doc->carried = nlohmann::json::object();
    doc->carried["language"] = o.annotations.language;
    doc->carried["language_score"] = std::round(o.annotations.language_score * 1e4) / 1e4;
  }
}

bool Context::is_removed(uint64_t docid) const {
  auto it = std::lower_bound(removed.begin(), removed.end(), docid,
                             [](const RemovedEntry& e, uint64_t d) { return e.docid < d; });
  return it != removed.end() && it->docid == docid;
}

bool Context::is_exact_dup(uint64_t docid) const {
  auto it = std::lower_bound(exact_dups.begin(), exact_dups.end(), docid,
                             [](const DocPair& e, uint64_t d) {
                               return e.first < d;
                             });
  return it != exact_dups.end() && it->first == docid;
}

void crash_point(const char* name) {
  static const std::string spec = [] {
    const char* v = std::getenv("KILN_PREP_CRASH_AT");
    return std::string(v ? v : "");
  }();
  if (spec.empty()) return;
  std::string want = spec;
  uint64_t nth = 1;
  if (auto colon = spec.rfind(':'); colon != std::string::npos) {
    want = spec.substr(0, colon);
    nth = std::strtoull(spec.c_str() + colon + 1, nullptr, 10);
  }
  if (want != name) return;
  static std::atomic<uint64_t> hits{0};
  // KILN_PREP_CRASH_SIGNAL=N sends signal N instead (the stop-signal tests use SIGTERM).
  static const int sig = [] {
    const char* v = std::getenv("KILN_PREP_CRASH_SIGNAL");
    return v ? std::atoi(v) : SIGKILL;
  }();
  if (hits.fetch_add(1) + 1 == nth) ::raise(sig);
}

Status make_dirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return Status::io("cannot create folder: " + ec.message()).with_file(path);
  return Status::ok();
}

Status remove_all(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return Status::io("cannot remove: " + ec.message()).with_file(path);
  return Status::ok();
}

std::string rank_tag(int rank) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%05d", rank);
  return buf;
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::data("not valid JSON").with_file(path);
  return j;
}

Status write_json_file(const std::string& path, const nlohmann::json& j) {
  return write_file_atomic(path, j.dump(1) + "\n");
}

Status write_blob(const std::string& path, const std::string& bytes, nlohmann::json* info) {
  KILN_RETURN_IF_ERROR(write_file_atomic(path, bytes));
  (*info)["bytes"] = bytes.size();
  (*info)["xxh3"] = hex64(xxh3_64(bytes));
  return Status::ok();
}

Result<std::string> read_blob(const std::string& path, const nlohmann::json& info) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  if (!info.contains("bytes") || !info.contains("xxh3") ||
      !info["bytes"].is_number_unsigned() || bytes.size() != info["bytes"].get<uint64_t>() ||
      hex64(xxh3_64(bytes)) != info["xxh3"].get<std::string>())
    return Status::data("work file does not match its recorded checksum").with_file(path);
  return bytes;
}

// ---- FileBatcher --------------------------------------------------------------------------

namespace {
constexpr size_t kBatchBytes = size_t{4} << 20;
constexpr size_t kBatchItems = 4096;

bool blank_line(std::string_view s) {
  for (char ch : s)
    if (!(ch == ' ' || (ch >= 0x09 && ch <= 0x0d))) return false;
  return true;
}
}  // namespace

Result<std::unique_ptr<FileBatcher>> FileBatcher::open(const Context& c, uint32_t fid) {
  const InputFile& f = c.files[fid];
  std::unique_ptr<FileBatcher> b(new FileBatcher());
  b->fid_ = fid;
  b->kind_ = f.kind;
  KILN_ASSIGN_OR_RETURN(b->reader_, LineReader::open(f.path, f.compression, c.opt.max_line_bytes));
  return b;
}

Result<bool> FileBatcher::next(RawBatch* b) {
  b->fid = fid_;
  b->data.clear();
  b->items.clear();
  if (done_) return false;
  LineEvent ev;
  if (kind_ == InputKind::kText) {
    KILN_RETURN_IF_ERROR(reader_->read_all(&ev));
    done_ = true;
    RawItem it;
    it.ordinal = ordinal_++;
    it.line = 0;
    it.kind = ev.kind == LineEventKind::kEnd ? LineEventKind::kLine : ev.kind;
    it.detail = ev.detail;
    if (ev.kind == LineEventKind::kLine) {
      it.offset = 0;
      it.length = ev.text.size();
      b->data.assign(ev.text);
    } else if (ev.kind == LineEventKind::kTooLong) {
      it.length = ev.length;
    }
    b->items.push_back(std::move(it));
    b->data.reserve(b->data.size() + 64);
    return true;
  }
  while (b->data.size() < kBatchBytes && b->items.size() < kBatchItems) {
    KILN_RETURN_IF_ERROR(reader_->next(&ev));
    if (ev.kind == LineEventKind::kEnd) {
      done_ = true;
      break;
    }
    if (ev.kind == LineEventKind::kLine && blank_line(ev.text)) continue;
    RawItem it;
    it.ordinal = ordinal_++;
    it.line = ev.line;
    it.kind = ev.kind;
    if (ev.kind == LineEventKind::kLine) {
      it.offset = b->data.size();
      it.length = ev.text.size();
      b->data.append(ev.text);
    } else if (ev.kind == LineEventKind::kTooLong) {
      it.length = ev.length;
    } else {  // truncated / corrupt: the file ends here
      it.detail = ev.detail;
      b->items.push_back(std::move(it));
      done_ = true;
      break;
    }
    b->items.push_back(std::move(it));
  }
  b->data.reserve(b->data.size() + 64);  // in-place JSON parsing reads past the last line
  return !b->items.empty();
}

ParseResult parse_item(const Context& c, const RawBatch& b, const RawItem& it, bool want_fields,
                       Document* doc, bool copy_text) {
  const InputFile& f = c.files[b.fid];
  doc->file = f.path;
  doc->line = it.line;
  doc->index = c.file_base.empty() ? 0 : c.file_base[b.fid] + it.ordinal;
  ParseOptions po;
  po.repair_utf8 = c.opt.repair_utf8;
  po.want_fields = want_fields;
  po.copy_text = copy_text;
  po.input_padded = b.data.capacity() >= b.data.size() + 64;
  po.chat = c.opt.chat.resolved.get();
  po.chat_unavailable = c.opt.chat.unavailable;
  ParseResult r;
  switch (it.kind) {
    case LineEventKind::kLine:
      if (f.kind == InputKind::kText) return parse_text_document(b.text(it), f.id_base, po, doc);
      return parse_jsonl_line(b.text(it), f.id_base, it.line, po, doc);
    case LineEventKind::kTooLong:
      r.reason = RejectReason::kTooLong;
      r.detail = std::to_string(it.length) + " bytes, over input.max_line_bytes = " +
                 std::to_string(c.opt.max_line_bytes);
      return r;
    case LineEventKind::kTruncated:
      r.reason = RejectReason::kTruncatedFile;
      r.detail = "the compressed input ends early (truncated file); the rest is lost";
      return r;
    case LineEventKind::kCorrupt:
      r.reason = RejectReason::kCorruptFile;
      r.detail = "the compressed input cannot be decoded: " + it.detail;
      return r;
    case LineEventKind::kEnd:
      break;
  }
  r.reason = RejectReason::kInvalidJson;
  r.detail = "internal: unexpected end event";
  return r;
}

}  // namespace kiln::prep::detail
