// The index run of this rank (dataprep/dedup/dedup_index.h): built during the write stage from
// the scan tables (hashes, band keys, signatures) and the ids the write stage parses anyway, so
// it costs one more pass over the tables and no re-reading of text. Its entries are the kept
// documents and the near duplicates removed for a document of this same dataset
// (index_entry()), each linked to the document its cluster kept.
#include "dataprep/stages/index_builder.h"

#include <algorithm>
#include <cstring>

#include "dataprep/stages/stages.h"
#include "dataprep/stages/work_files.h"

namespace kiln::prep::detail {

bool index_entry(const Context& c, const RemovedEntry& e) {
  if (e.exact) return false;  // exact duplicates never reach an LSH bucket
  // Kept by this run, or by an earlier segment of the dataset appended to. (Kept by another
  // dataset: the link could not be followed from this dataset's index alone.)
  return !is_external(e.kept) || (c.against_self && external_dataset(e.kept) == 0);
}

IndexBuilder::IndexBuilder(Context& c) : c_(c), enabled_(c.opt.index) {
  if (!enabled_) return;
  // Ordinals run over the segment's entries in input order: this rank starts after the entries
  // of the ranks before it (valid documents minus removed ones plus the removed entries).
  std::vector<uint64_t> removed_in_file(c.files.size(), 0);
  for (const RemovedEntry& e : c.removed)
    if (!index_entry(c, e)) ++removed_in_file[docid_file(e.docid)];
  for (uint32_t f = 0; f < c.my_first_file(); ++f)
    first_ += c.file_stats[f].valid - removed_in_file[f];
  writer_ = std::make_unique<IndexRunWriter>(
      c.out + "/dedup/index", c.index_segment, c.rank, c.opt.near ? c.layout.num_perm : 0,
      c.opt.near ? c.layout.bands : 0, c.tmp_dir(), c.opt.memory_bytes / 2);
  scan_ = std::make_unique<TableScanner>(c.layout, c.table_paths());
  const uint64_t lo = make_docid(c.my_first_file(), 0), hi = make_docid(c.my_last_file(), 0);
  for (const RemovedEntry& e : c.removed)
    if (!is_external(e.kept) && e.kept >= lo && e.kept < hi) reps_.push_back(e.kept);
  std::sort(reps_.begin(), reps_.end());
  reps_.erase(std::unique(reps_.begin(), reps_.end()), reps_.end());
}

IndexBuilder::~IndexBuilder() = default;

// Reads table records up to `docid`; every record before it is a removed document.
Status IndexBuilder::advance_to(uint64_t docid, bool* found) {
  *found = false;
  for (;;) {
    const uint8_t* p = scan_->next();
    if (!p) {
      KILN_RETURN_IF_ERROR(scan_->status());
      if (docid == ~uint64_t{0}) return Status::ok();
      return Status::internal("index: kept document missing from the scan table");
    }
    RecordView v{p};
    const uint64_t d = v.docid();
    if (d == docid) {
      const RecordLayout& L = c_.layout;
      const bool has_sig = c_.opt.near && (v.flags() & kFlagHasSig);
      std::vector<uint64_t> keys, sig;
      if (has_sig) {
        keys.resize(L.bands);
        sig.resize(L.num_perm);
        for (int b = 0; b < L.bands; ++b) keys[b] = v.key(L, b);
        std::memcpy(sig.data(), v.sig_bytes(L), 8 * sig.size());
      }
      last_lo_ = v.hash_lo();
      last_hi_ = v.hash_hi();
      last_keys_ = std::move(keys);
      last_sig_ = std::move(sig);
      *found = true;
      return Status::ok();
    }
    if (d > docid) return Status::internal("index: kept document missing from the scan table");
    // A removed document: its exact hash points at the document its cluster kept.
    auto it = std::lower_bound(c_.removed.begin(), c_.removed.end(), d,
                               [](const RemovedEntry& e, uint64_t x) { return e.docid < x; });
    if (it == c_.removed.end() || it->docid != d)
      return Status::internal("index: a document is neither written nor removed");
    if (index_entry(c_, *it))
      return Status::internal("index: an index entry was not handed to the index");
    const uint64_t kept = it->kept;
    // Kept by another dataset: not in this index. (By an earlier segment of this same dataset,
    // --append: ref_of_kept points there.)
    if (is_external(kept) && !(c_.against_self && external_dataset(kept) == 0)) continue;
    KILN_ASSIGN_OR_RETURN(uint64_t link, ref_of_kept(kept));
    if (link != IndexRunWriter::kLinkLater)
      KILN_RETURN_IF_ERROR(writer_->add_exact(v.hash_lo(), v.hash_hi(), link));
    else
      pending_.push_back({v.hash_lo(), v.hash_hi(), kept});
  }
}

Status IndexBuilder::add(uint64_t docid, std::string_view id_json) {
  if (!enabled_) return Status::ok();
  bool found = false;
  KILN_RETURN_IF_ERROR(advance_to(docid, &found));
  const uint64_t ref = make_ref(c_.index_segment, first_ + next_ordinal_++);
  uint64_t link = ref;
  auto it = std::lower_bound(c_.removed.begin(), c_.removed.end(), docid,
                             [](const RemovedEntry& e, uint64_t x) { return e.docid < x; });
  const bool removed = it != c_.removed.end() && it->docid == docid;
  if (removed) {
    if (!index_entry(c_, *it)) return Status::internal("index: a removed document is not an entry");
    KILN_ASSIGN_OR_RETURN(link, ref_of_kept(it->kept));
    if (link == IndexRunWriter::kLinkLater) pending_links_.push_back({ref, it->kept});
  }
  KILN_RETURN_IF_ERROR(writer_->add_doc(ref, link, last_lo_, last_hi_,
                                        last_keys_.empty() ? nullptr : last_keys_.data(),
                                        last_sig_.empty() ? nullptr : last_sig_.data(), id_json));
  if (removed) {
    // Its exact hash points at the kept document, as a non-entry's does.
    if (link != IndexRunWriter::kLinkLater)
      KILN_RETURN_IF_ERROR(writer_->add_exact(last_lo_, last_hi_, link));
    else
      pending_.push_back({last_lo_, last_hi_, it->kept});
  } else if (std::binary_search(reps_.begin(), reps_.end(), docid)) {
    my_reps_.emplace_back(docid, ref);  // docid order: stays sorted
  }
  return Status::ok();
}

// The ref of the kept document `kept` (a docid of this run or an external one of the dataset
// appended to), or kLinkLater when another rank wrote it.
Result<uint64_t> IndexBuilder::ref_of_kept(uint64_t kept) const {
  const uint64_t ext_mask = (uint64_t{1} << 56) - 1;
  if (is_external(kept)) {
    if (c_.against_self && external_dataset(kept) == 0) return kept & ext_mask;
    return Status::internal("index: a link to another dataset");
  }
  auto r = std::lower_bound(my_reps_.begin(), my_reps_.end(), std::make_pair(kept, uint64_t{0}));
  if (r != my_reps_.end() && r->first == kept) return r->second;
  return IndexRunWriter::kLinkLater;
}

Result<nlohmann::json> IndexBuilder::finish() {
  if (!enabled_) return nlohmann::json();
  bool found = false;
  KILN_RETURN_IF_ERROR(advance_to(~uint64_t{0}, &found));
  // Removed documents whose kept document lives on another rank.
  struct DocRef {
    uint64_t docid, ref;
  };
  // Every rank offers the refs of its documents that some removed entry keeps.
  std::vector<DocRef> offer;
  for (const auto& [docid, ref] : my_reps_) offer.push_back({docid, ref});
  KILN_ASSIGN_OR_RETURN(std::vector<DocRef> all, comm::allgatherv(*c_.g, offer));
  std::sort(all.begin(), all.end(),
            [](const DocRef& a, const DocRef& b) { return a.docid < b.docid; });
  for (const Pending& p : pending_) {
    auto it = std::lower_bound(all.begin(), all.end(), p.kept,
                               [](const DocRef& a, uint64_t d) { return a.docid < d; });
    if (it == all.end() || it->docid != p.kept)
      return Status::internal("index: the kept document of a removed one has no ref");
    KILN_RETURN_IF_ERROR(writer_->add_exact(p.lo, p.hi, it->ref));
  }
  for (const PendingLink& p : pending_links_) {
    auto it = std::lower_bound(all.begin(), all.end(), p.kept,
                               [](const DocRef& a, uint64_t d) { return a.docid < d; });
    if (it == all.end() || it->docid != p.kept)
      return Status::internal("index: the kept document of a removed entry has no ref");
    KILN_RETURN_IF_ERROR(writer_->set_link(p.ref, it->ref));
  }
  std::vector<Pending>().swap(pending_);
  std::vector<PendingLink>().swap(pending_links_);
  KILN_ASSIGN_OR_RETURN(IndexRunInfo info, writer_->finish(first_));
  info.rank = c_.rank;
  return info.to_json();
}

}  // namespace kiln::prep::detail
