#include "dataprep/dedup/dedup_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/json.h"
#include "dataprep/dedup/external_sort.h"

namespace kiln::prep {
namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little, "index files are little-endian");

namespace {

constexpr size_t kBlock = 1024;  // records per sparse-index entry

struct ExactRec {
  uint64_t lo, hi, ref;
  bool operator<(const ExactRec& o) const {
    if (lo != o.lo) return lo < o.lo;
    if (hi != o.hi) return hi < o.hi;
    return ref < o.ref;
  }
};
struct BandRec {
  uint64_t key, ref;
  bool operator<(const BandRec& o) const { return key != o.key ? key < o.key : ref < o.ref; }
};
struct ExactKey {
  uint64_t lo, hi;
  bool operator<(const ExactKey& o) const { return lo != o.lo ? lo < o.lo : hi < o.hi; }
};

// A read-only memory map of a whole file (nothing mapped when empty).
class MappedFile {
 public:
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  Status open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::from_errno("open", path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      Status s = Status::from_errno("stat", path);
      ::close(fd);
      return s;
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        Status s = Status::from_errno("mmap", path);
        ::close(fd);
        return s;
      }
      data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    return Status::ok();
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

const char* bool_text(bool b) { return b ? "true" : "false"; }

// Writes a sorted run: the records to `stem + ext` and the key of every kBlock-th record to
// `stem + sparse_ext` (the sparse index the reader searches first). Records must come sorted.
template <typename Rec, typename Key>
class SortedRunWriter {
 public:
  Status open(const std::string& path) { return out_.open(path); }
  Status add(const Rec& r, const Key& key) {
    if (count_ % kBlock == 0) sparse_.append(reinterpret_cast<const char*>(&key), sizeof key);
    buf_.append(reinterpret_cast<const char*>(&r), sizeof r);
    ++count_;
    if (buf_.size() >= (size_t{4} << 20)) {
      KILN_RETURN_IF_ERROR(out_.write(buf_));
      buf_.clear();
    }
    return Status::ok();
  }
  // Commits the records, then writes the sparse index; returns the record count.
  Result<uint64_t> finish(const std::string& sparse_path) {
    KILN_RETURN_IF_ERROR(out_.write(buf_));
    KILN_RETURN_IF_ERROR(out_.commit());
    KILN_RETURN_IF_ERROR(write_file_atomic(sparse_path, sparse_));
    return count_;
  }

 private:
  AtomicFile out_;
  std::string buf_, sparse_;
  uint64_t count_ = 0;
};

}  // namespace

// ---- settings --------------------------------------------------------------------------------

nlohmann::json DedupSettings::to_json() const {
  return {{"exact", exact},       {"near", near},   {"threshold", threshold},
          {"num_perm", num_perm}, {"bands", bands}, {"rows", rows},
          {"ngram", ngram},       {"seed", seed},   {"strip_punct", strip_punct},
          {"normalisation", normalisation}};
}

Result<DedupSettings> DedupSettings::from_json(const nlohmann::json& j, const std::string& origin) {
  DedupSettings s;
  try {
    s.exact = j.at("exact").get<bool>();
    s.near = j.at("near").get<bool>();
    s.threshold = j.at("threshold").get<double>();
    s.num_perm = json_integer_at<int>(j, "num_perm");
    s.bands = json_integer_at<int>(j, "bands");
    s.rows = json_integer_at<int>(j, "rows");
    s.ngram = json_integer_at<int>(j, "ngram");
    s.seed = json_integer_at<uint64_t>(j, "seed");
    s.strip_punct = j.at("strip_punct").get<bool>();
    s.normalisation = j.at("normalisation").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("bad dedup settings: ") + e.what()).with_file(origin);
  }
  if (s.num_perm < 0 || s.bands < 0 || s.rows < 0 || s.bands * s.rows > s.num_perm)
    return Status::data("bad dedup settings (num_perm/bands/rows)").with_file(origin);
  return s;
}

Status DedupSettings::check_same(const DedupSettings& mine, const std::string& name) const {
  auto differ = [&](const char* key, const std::string& theirs, const std::string& ours) {
    return Status::usage(std::string(key) + ": the dedup index of " + name + " was built with " +
                         theirs + ", this run uses " + ours +
                         "; run with the same setting (or prepare without --against/--append)");
  };
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  if (normalisation != mine.normalisation)
    return differ("normalisation", normalisation, mine.normalisation);
  if (exact != mine.exact) return differ("dedup.exact", bool_text(exact), bool_text(mine.exact));
  if (near != mine.near) return differ("dedup.near", bool_text(near), bool_text(mine.near));
  if (strip_punct != mine.strip_punct)
    return differ("dedup.strip_punct", bool_text(strip_punct), bool_text(mine.strip_punct));
  if (!near) return Status::ok();  // the MinHash settings matter only for near dedup
  if (num_perm != mine.num_perm)
    return differ("dedup.num_perm", std::to_string(num_perm), std::to_string(mine.num_perm));
  if (seed != mine.seed) return differ("dedup.seed", std::to_string(seed), std::to_string(mine.seed));
  if (ngram != mine.ngram)
    return differ("dedup.ngram", std::to_string(ngram), std::to_string(mine.ngram));
  if (bands != mine.bands)
    return differ("dedup.bands", std::to_string(bands), std::to_string(mine.bands));
  if (rows != mine.rows) return differ("dedup.rows", std::to_string(rows), std::to_string(mine.rows));
  if (std::fabs(threshold - mine.threshold) > 1e-12)
    return differ("dedup.threshold", num(threshold), num(mine.threshold));
  return Status::ok();
}

nlohmann::json IndexRunInfo::to_json() const {
  nlohmann::json j = {{"rank", rank},   {"first", first}, {"docs", docs},
                      {"exact", exact}, {"bands", bands}};
  if (links) j["kept"] = kept;
  return j;
}

IndexRunInfo IndexRunInfo::from_json(const nlohmann::json& j) {
  IndexRunInfo r;
  r.rank = json_integer_at<int>(j, "rank");
  r.first = json_integer_at<uint64_t>(j, "first");
  r.docs = json_integer_at<uint64_t>(j, "docs");
  r.exact = json_integer_at<uint64_t>(j, "exact");
  r.bands = json_integer_at<uint64_t>(j, "bands");
  r.links = j.contains("kept");  // a format-1 run: every entry is a kept document
  r.kept = r.links ? json_integer_at<uint64_t>(j, "kept") : r.docs;
  return r;
}

std::string index_segment_name(uint32_t segment) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "seg-%06u", segment);
  return buf;
}

std::string index_run_stem(const std::string& index_dir, uint32_t segment, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/run-%05d", rank);
  return index_dir + "/" + index_segment_name(segment) + buf;
}

nlohmann::json make_index_meta(const DedupSettings& s, const nlohmann::json& extra,
                               const nlohmann::json& segments) {
  nlohmann::json settings = s.to_json();
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) settings[k] = v;
  return {{"format", kDedupIndexFormat}, {"settings", settings}, {"segments", segments}};
}

// ---- writer ----------------------------------------------------------------------------------

struct IndexRunWriter::Impl {
  std::string stem;
  int num_perm = 0, bands = 0;
  ExternalSorter<ExactRec> exact;
  ExternalSorter<BandRec> band;
  AtomicFile sigs, ids, idoff, links;
  bool opened = false;
  uint64_t docs = 0, kept = 0, id_bytes = 0;
  std::string sig_buf, off_buf, id_buf, link_buf;
  std::vector<std::pair<uint64_t, uint64_t>> late_links;  // (ref, link) from set_link
  Status status;

  Impl(std::string s, int np, int b, const std::string& tmp, size_t mem)
      : stem(std::move(s)), num_perm(np), bands(b), exact(tmp, "index-exact", mem / 2),
        band(tmp, "index-bands", mem / 2) {}

  Status open() {
    if (opened) return Status::ok();
    KILN_RETURN_IF_ERROR(sigs.open(stem + ".sigs"));
    KILN_RETURN_IF_ERROR(ids.open(stem + ".ids"));
    KILN_RETURN_IF_ERROR(idoff.open(stem + ".idoff"));
    KILN_RETURN_IF_ERROR(links.open(stem + ".kept"));
    opened = true;
    return Status::ok();
  }
  Status flush(bool all) {
    const size_t kFlush = size_t{4} << 20;
    if (all || sig_buf.size() >= kFlush) {
      KILN_RETURN_IF_ERROR(sigs.write(sig_buf));
      sig_buf.clear();
    }
    if (all || id_buf.size() >= kFlush) {
      KILN_RETURN_IF_ERROR(ids.write(id_buf));
      id_buf.clear();
    }
    if (all || off_buf.size() >= kFlush) {
      KILN_RETURN_IF_ERROR(idoff.write(off_buf));
      off_buf.clear();
    }
    if (all || link_buf.size() >= kFlush) {
      KILN_RETURN_IF_ERROR(this->links.write(link_buf));
      link_buf.clear();
    }
    return Status::ok();
  }
};

IndexRunWriter::IndexRunWriter(std::string index_dir, uint32_t segment, int rank, int num_perm,
                               int bands, std::string tmp_dir, size_t memory_bytes)
    : impl_(std::make_unique<Impl>(index_run_stem(index_dir, segment, rank), num_perm, bands,
                                   tmp_dir, memory_bytes)) {}

IndexRunWriter::~IndexRunWriter() = default;

Status IndexRunWriter::add_doc(uint64_t ref, uint64_t link, uint64_t lo, uint64_t hi,
                               const uint64_t* keys, const uint64_t* sig,
                               std::string_view id_json) {
  Impl& m = *impl_;
  KILN_RETURN_IF_ERROR(m.open());
  if (link == ref) {
    KILN_RETURN_IF_ERROR(m.exact.add({lo, hi, ref}));
    ++m.kept;
  }
  m.link_buf.append(reinterpret_cast<const char*>(&link), 8);
  if (keys)
    for (int b = 0; b < m.bands; ++b) KILN_RETURN_IF_ERROR(m.band.add({keys[b], ref}));
  if (m.num_perm > 0) {
    if (sig) {
      m.sig_buf.append(reinterpret_cast<const char*>(sig), 8 * static_cast<size_t>(m.num_perm));
    } else {
      const uint64_t empty = ~uint64_t{0};
      for (int k = 0; k < m.num_perm; ++k) m.sig_buf.append(reinterpret_cast<const char*>(&empty), 8);
    }
  }
  m.off_buf.append(reinterpret_cast<const char*>(&m.id_bytes), 8);
  m.id_buf.append(id_json);
  m.id_buf.push_back('\n');
  m.id_bytes += id_json.size() + 1;
  ++m.docs;
  return m.flush(false);
}

Status IndexRunWriter::set_link(uint64_t ref, uint64_t link) {
  impl_->late_links.emplace_back(ref, link);
  return Status::ok();
}

Status IndexRunWriter::add_exact(uint64_t lo, uint64_t hi, uint64_t ref) {
  return impl_->exact.add({lo, hi, ref});
}

Result<IndexRunInfo> IndexRunWriter::finish(uint64_t first_ordinal) {
  Impl& m = *impl_;
  KILN_RETURN_IF_ERROR(m.open());
  m.off_buf.append(reinterpret_cast<const char*>(&m.id_bytes), 8);
  KILN_RETURN_IF_ERROR(m.flush(true));
  // Links that were not known when their entry was written (kept on another rank).
  if (!m.late_links.empty()) {
    std::FILE* f = m.links.stream();
    for (const auto& [ref, link] : m.late_links) {
      const uint64_t k = ref_ordinal(ref) - first_ordinal;
      if (ref_ordinal(ref) < first_ordinal || k >= m.docs)
        return Status::internal("index: a link for an entry outside the run");
      if (std::fseek(f, static_cast<long>(8 * k), SEEK_SET) != 0 || std::fwrite(&link, 8, 1, f) != 1)
        return Status::io("cannot write an index link").with_file(m.links.temp_path());
    }
    if (std::fseek(f, 0, SEEK_END) != 0)
      return Status::io("cannot seek in an index file").with_file(m.links.temp_path());
  }
  KILN_RETURN_IF_ERROR(m.sigs.commit());
  KILN_RETURN_IF_ERROR(m.ids.commit());
  KILN_RETURN_IF_ERROR(m.idoff.commit());
  KILN_RETURN_IF_ERROR(m.links.commit());
  IndexRunInfo info;
  info.first = first_ordinal;
  info.docs = m.docs;
  info.kept = m.kept;
  // Sorted records plus the first key of every block.
  {
    SortedRunWriter<ExactRec, ExactKey> out;
    KILN_RETURN_IF_ERROR(out.open(m.stem + ".exact"));
    bool have = false;
    ExactKey last{};
    KILN_RETURN_IF_ERROR(m.exact.merge([&](const ExactRec& r) -> Status {
      if (have && r.lo == last.lo && r.hi == last.hi) return Status::ok();  // one ref per hash
      have = true;
      last = {r.lo, r.hi};
      return out.add(r, last);
    }));
    KILN_ASSIGN_OR_RETURN(info.exact, out.finish(m.stem + ".xidx"));
  }
  {
    SortedRunWriter<BandRec, uint64_t> out;
    KILN_RETURN_IF_ERROR(out.open(m.stem + ".bands"));
    KILN_RETURN_IF_ERROR(m.band.merge([&](const BandRec& r) { return out.add(r, r.key); }));
    KILN_ASSIGN_OR_RETURN(info.bands, out.finish(m.stem + ".bidx"));
  }
  return info;
}

// ---- reader ----------------------------------------------------------------------------------

struct DedupIndex::Run {
  IndexRunInfo info;
  MappedFile exact, bands, sigs, ids, idoff, links;
  std::vector<ExactKey> exact_sparse;
  std::vector<uint64_t> band_sparse;

  const ExactRec* exact_recs() const { return reinterpret_cast<const ExactRec*>(exact.data()); }
  const BandRec* band_recs() const { return reinterpret_cast<const BandRec*>(bands.data()); }

  // [begin, end) of the records that can hold the first record >= key: the block before the
  // first block whose first key is >= key, through that block.
  template <typename Key>
  static std::pair<size_t, size_t> window(const std::vector<Key>& sparse, const Key& key,
                                          size_t n) {
    size_t b = static_cast<size_t>(std::lower_bound(sparse.begin(), sparse.end(), key) -
                                   sparse.begin());
    size_t start = b == 0 ? 0 : b - 1;
    return {start * kBlock, std::min(n, (b + 1) * kBlock)};
  }
};

DedupIndex::~DedupIndex() = default;

Result<std::unique_ptr<DedupIndex>> DedupIndex::open(const std::string& dataset_dir) {
  std::string dir = dataset_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string index_dir = dir + "/dedup/index";
  const std::string meta_path = index_dir + "/index.json";
  std::error_code ec;
  if (!fs::exists(meta_path, ec))
    return Status::usage(dir + " has no dedup index (" + meta_path +
                         "); it was prepared without one (dedup.index false, or by an older kiln): "
                         "prepare it again to deduplicate against it");
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(meta_path));
  std::unique_ptr<DedupIndex> idx(new DedupIndex());
  idx->dataset_dir_ = dir;
  idx->meta_ = nlohmann::json::parse(text, nullptr, false);
  const nlohmann::json& m = idx->meta_;
  const std::string format = m.is_object() ? m.value("format", "") : "";
  if (format != kDedupIndexFormat && format != kDedupIndexFormatV1)
    return Status::data("not a kiln dedup index (format '" + format + "'; this kiln reads " +
                        kDedupIndexFormatV1 + " and " + kDedupIndexFormat +
                        "): prepare the dataset again with this kiln")
        .with_file(meta_path);
  if (!m.contains("settings") || !m.contains("segments") || !m["segments"].is_array())
    return Status::data("index.json lacks settings or segments").with_file(meta_path);
  KILN_ASSIGN_OR_RETURN(idx->settings_, DedupSettings::from_json(m["settings"], meta_path));
  // Without near dedup no signatures are stored.
  const size_t sig_bytes = idx->settings_.near ? 8 * static_cast<size_t>(idx->settings_.num_perm) : 0;
  try {
    uint32_t seg = 0;
    for (const auto& sj : m["segments"]) {
      if (sj.at("name").get<std::string>() != index_segment_name(seg))
        return Status::data("segment " + std::to_string(seg) + " is misnamed").with_file(meta_path);
      auto& runs = idx->segments_.emplace_back();
      for (const auto& rj : sj.at("runs")) {
        auto run = std::make_unique<Run>();
        run->info = IndexRunInfo::from_json(rj);
        const std::string stem = index_run_stem(index_dir, seg, run->info.rank);
        KILN_RETURN_IF_ERROR(run->exact.open(stem + ".exact"));
        KILN_RETURN_IF_ERROR(run->bands.open(stem + ".bands"));
        KILN_RETURN_IF_ERROR(run->sigs.open(stem + ".sigs"));
        KILN_RETURN_IF_ERROR(run->ids.open(stem + ".ids"));
        KILN_RETURN_IF_ERROR(run->idoff.open(stem + ".idoff"));
        const IndexRunInfo& i = run->info;
        if (i.links) KILN_RETURN_IF_ERROR(run->links.open(stem + ".kept"));
        if ((i.links && run->links.size() != i.docs * 8) || i.kept > i.docs ||
            run->exact.size() != i.exact * sizeof(ExactRec) ||
            run->bands.size() != i.bands * sizeof(BandRec) ||
            run->sigs.size() != i.docs * sig_bytes || run->idoff.size() != (i.docs + 1) * 8)
          return Status::data("index run files do not match index.json (damaged index)")
              .with_file(stem + ".*");
        KILN_ASSIGN_OR_RETURN(std::string xs, read_file(stem + ".xidx"));
        KILN_ASSIGN_OR_RETURN(std::string bs, read_file(stem + ".bidx"));
        if (xs.size() != (i.exact + kBlock - 1) / kBlock * 16 ||
            bs.size() != (i.bands + kBlock - 1) / kBlock * 8)
          return Status::data("sparse index does not match its records").with_file(stem + ".xidx");
        run->exact_sparse.resize(xs.size() / 16);
        if (!xs.empty()) std::memcpy(run->exact_sparse.data(), xs.data(), xs.size());
        run->band_sparse.resize(bs.size() / 8);
        if (!bs.empty()) std::memcpy(run->band_sparse.data(), bs.data(), bs.size());
        runs.push_back(std::move(run));
      }
      std::sort(runs.begin(), runs.end(),
                [](const auto& a, const auto& b) { return a->info.first < b->info.first; });
      ++seg;
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("bad index.json: ") + e.what()).with_file(meta_path);
  }
  return idx;
}

uint32_t DedupIndex::segments() const { return static_cast<uint32_t>(segments_.size()); }

uint64_t DedupIndex::kept_docs() const {
  uint64_t n = 0;
  for (const auto& seg : segments_)
    for (const auto& r : seg) n += r->info.kept;
  return n;
}

uint64_t DedupIndex::entries() const {
  uint64_t n = 0;
  for (const auto& seg : segments_)
    for (const auto& r : seg) n += r->info.docs;
  return n;
}

void DedupIndex::find_exact(uint64_t lo, uint64_t hi, std::vector<uint64_t>* refs) const {
  refs->clear();
  const ExactKey key{lo, hi};
  for (const auto& seg : segments_) {
    for (const auto& run : seg) {
      const size_t n = run->info.exact;
      if (n == 0) continue;
      auto [a, b] = Run::window(run->exact_sparse, key, n);
      const ExactRec* recs = run->exact_recs();
      const ExactRec* it = std::lower_bound(recs + a, recs + b, key, [](const ExactRec& r, const ExactKey& k) {
        return r.lo != k.lo ? r.lo < k.lo : r.hi < k.hi;
      });
      if (it != recs + n && it->lo == lo && it->hi == hi) refs->push_back(it->ref);
    }
  }
}

void DedupIndex::find_band(uint64_t key, std::vector<uint64_t>* refs) const {
  refs->clear();
  for (const auto& seg : segments_) {
    for (const auto& run : seg) {
      const size_t n = run->info.bands;
      if (n == 0) continue;
      auto [a, b] = Run::window(run->band_sparse, key, n);
      const BandRec* recs = run->band_recs();
      const BandRec* it = std::lower_bound(
          recs + a, recs + b, key, [](const BandRec& r, uint64_t k) { return r.key < k; });
      for (; it != recs + n && it->key == key; ++it) refs->push_back(it->ref);
    }
  }
  std::sort(refs->begin(), refs->end());
  refs->erase(std::unique(refs->begin(), refs->end()), refs->end());
}

const DedupIndex::Run* DedupIndex::run_of(uint64_t ref) const {
  const uint32_t seg = ref_segment(ref);
  const uint64_t ord = ref_ordinal(ref);
  if (seg >= segments_.size()) return nullptr;
  for (const auto& r : segments_[seg])
    if (ord >= r->info.first && ord < r->info.first + r->info.docs) return r.get();
  return nullptr;
}

Result<uint64_t> DedupIndex::kept_ref(uint64_t ref) const {
  const Run* r = run_of(ref);
  if (!r) return Status::data("index ref " + std::to_string(ref) + " is outside the index")
                  .with_file(dataset_dir_ + "/dedup/index");
  if (!r->info.links) return ref;
  uint64_t link;
  std::memcpy(&link, r->links.data() + 8 * (ref_ordinal(ref) - r->info.first), 8);
  // A link goes to an earlier (or the same) entry of the index, which is itself kept.
  if (link > ref || !run_of(link))
    return Status::data("index link of ref " + std::to_string(ref) + " is damaged")
        .with_file(dataset_dir_ + "/dedup/index");
  return link;
}

Status DedupIndex::check_links() const {
  for (uint32_t seg = 0; seg < segments_.size(); ++seg) {
    for (const auto& run : segments_[seg]) {
      const IndexRunInfo& i = run->info;
      uint64_t kept = 0;
      for (uint64_t k = 0; k < i.docs; ++k) {
        const uint64_t ref = make_ref(seg, i.first + k);
        KILN_ASSIGN_OR_RETURN(uint64_t link, kept_ref(ref));
        if (link == ref) {
          ++kept;
          continue;
        }
        KILN_ASSIGN_OR_RETURN(uint64_t again, kept_ref(link));
        if (again != link)
          return Status::data("index entry " + std::to_string(ref) + " links to " +
                              std::to_string(link) + ", which is not a kept document")
              .with_file(index_run_stem(dataset_dir_ + "/dedup/index", seg, i.rank) + ".kept");
      }
      if (kept != i.kept)
        return Status::data("index run holds " + std::to_string(kept) +
                            " kept documents, index.json says " + std::to_string(i.kept))
            .with_file(index_run_stem(dataset_dir_ + "/dedup/index", seg, i.rank) + ".kept");
    }
  }
  return Status::ok();
}

Status DedupIndex::signature(uint64_t ref, uint64_t* sig) const {
  if (!settings_.near)
    return Status::internal("the dedup index of " + dataset_dir_ + " holds no signatures");
  const Run* r = run_of(ref);
  if (!r) return Status::data("index ref " + std::to_string(ref) + " is outside the index")
                  .with_file(dataset_dir_ + "/dedup/index");
  const size_t np = static_cast<size_t>(settings_.num_perm);
  std::memcpy(sig, r->sigs.data() + (ref_ordinal(ref) - r->info.first) * np * 8, np * 8);
  return Status::ok();
}

Result<std::string> DedupIndex::id_json(uint64_t ref) const {
  const Run* r = run_of(ref);
  if (!r) return Status::data("index ref " + std::to_string(ref) + " is outside the index")
                  .with_file(dataset_dir_ + "/dedup/index");
  const uint64_t k = ref_ordinal(ref) - r->info.first;
  uint64_t a, b;
  std::memcpy(&a, r->idoff.data() + 8 * k, 8);
  std::memcpy(&b, r->idoff.data() + 8 * (k + 1), 8);
  if (a > b || b > r->ids.size() || b == a)
    return Status::data("index id offsets are damaged").with_file(dataset_dir_ + "/dedup/index");
  return std::string(reinterpret_cast<const char*>(r->ids.data()) + a, b - a - 1);
}

}  // namespace kiln::prep
