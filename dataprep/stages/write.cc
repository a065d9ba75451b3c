// Stage 5 (write): the kept documents of this rank, annotated (domain, tokens), into per-domain
// shards (and the validation split), with this rank's run of the dedup index.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/hash.h"
#include "common/json.h"
#include "common/progress.h"
#include "dataprep/stages/batch_pipeline.h"
#include "dataprep/stages/index_builder.h"
#include "dataprep/stages/sample_metadata.h"
#include "dataprep/stages/stages.h"
#include "dataprep/stages/work_files.h"
#include "format/npy.h"
#include "format/shard_writer.h"

namespace kiln::prep::detail {
namespace fs = std::filesystem;
namespace {

std::string sample_key(uint64_t global_index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%012llu", static_cast<unsigned long long>(global_index));
  return buf;
}

// One document ready for its shard.
struct OutSample {
  std::string domain, domain_by;
  ShardSample sample;
  uint64_t tokens = 0, bytes = 0;
  uint64_t split_hash = 0;  // hash of the input id: decides the validation split
  bool val = false;         // goes to the domain's validation shards
  uint64_t docid = 0;
};

// The validation split (PrepOptions::val_fraction / val_min_docs), decided in document order by
// the serial write stage: a document whose id hash falls below the fraction is held out at once;
// the val_min_docs smallest-hash documents of each domain among the rest wait in a bounded heap
// (the others go to training as they are pushed out) until finish() knows the domain's size and
// tops its validation slice up to min(val_min_docs, docs / 2). Deterministic: it depends on the
// ids and the seed only (per rank under mpirun, so the minimum then holds per rank).
class ValSplitter {
 public:
  explicit ValSplitter(const PrepOptions& opt)
      : cut_(sample_cut(opt.val_fraction)), min_docs_(opt.val_min_docs) {}
  bool enabled() const { return cut_ > 0 || min_docs_ > 0; }

  // Hands documents on to `emit` (train or val decided) in a deterministic order.
  template <typename Emit>
  Status add(OutSample&& o, Emit&& emit) {
    Domain& d = domains_[o.domain];
    ++d.docs;
    if (cut_ > 0 && o.split_hash < cut_) {
      ++d.val;
      o.val = true;
      return emit(std::move(o));
    }
    if (min_docs_ == 0) return emit(std::move(o));
    d.heap.push_back(std::move(o));
    std::push_heap(d.heap.begin(), d.heap.end(), before);
    if (d.heap.size() <= min_docs_) return Status::ok();
    std::pop_heap(d.heap.begin(), d.heap.end(), before);
    OutSample out = std::move(d.heap.back());
    d.heap.pop_back();
    return emit(std::move(out));
  }

  template <typename Emit>
  Status finish(Emit&& emit) {
    for (auto& [name, d] : domains_) {
      std::sort(d.heap.begin(), d.heap.end(), before);
      const uint64_t target = std::min<uint64_t>(min_docs_, d.docs / 2);
      uint64_t need = target > d.val ? target - d.val : 0;
      for (OutSample& o : d.heap) {
        o.val = need > 0;
        need -= need > 0;
        KILN_RETURN_IF_ERROR(emit(std::move(o)));
      }
      d.heap.clear();
    }
    return Status::ok();
  }

 private:
  static bool before(const OutSample& a, const OutSample& b) {
    return a.split_hash != b.split_hash ? a.split_hash < b.split_hash : a.sample.key < b.sample.key;
  }
  struct Domain {
    uint64_t docs = 0, val = 0;
    std::vector<OutSample> heap;  // max-heap by `before`: the smallest hashes not yet held out
  };
  uint64_t cut_;
  uint64_t min_docs_;
  std::map<std::string, Domain> domains_;
};

// Per-domain shard series "shards/<domain>/<prefix>-NNNNNN<ext>", written by the shard module's
// RollingShardWriter (several shards at once; the bytes do not depend on the thread count). The
// prefix is "<domain>" for training shards and "<domain>-val" for validation shards; with several
// ranks "-rRRRRR" is appended and the final stage renumbers the shards.
class DomainShards {
 public:
  explicit DomainShards(const Context& c) : c_(c), pool_(std::make_shared<ShardWritePool>()) {}

  // Called by one thread, in the samples' order.
  Status add(OutSample&& o) {
    const std::pair<std::string, bool> key{o.domain, o.val};
    auto it = writers_.find(key);
    if (it == writers_.end()) {
      const std::string stem = o.val ? o.domain + "-val" : o.domain;
      RollingShardWriter::Options wo;
      wo.dir = c_.out + "/shards/" + o.domain;
      wo.prefix = c_.size == 1 ? stem : stem + "-r" + rank_tag(c_.rank);
      wo.compression = c_.opt.compression;
      wo.zstd_level = c_.opt.level;
      wo.max_samples = c_.opt.max_samples;
      wo.max_tar_bytes = c_.opt.max_bytes;
      it = writers_.emplace(key, std::make_unique<RollingShardWriter>(wo, pool_)).first;
    }
    return it->second->add(std::move(o.sample), o.tokens);
  }

  // Closes every shard; returns them in (domain, training before validation, index) order.
  Result<std::vector<WrittenShard>> finish() {
    std::vector<WrittenShard> out;
    for (auto& [key, writer] : writers_) {
      KILN_ASSIGN_OR_RETURN(std::vector<ShardInfo> infos, writer->finish());
      for (const ShardInfo& info : infos) {
        WrittenShard w;
        w.path = fs::path(info.path).lexically_relative(c_.out).generic_string();
        w.domain = key.first;
        w.val = key.second;
        w.samples = info.samples;
        w.tokens = info.tokens;
        w.bytes = info.bytes;
        w.xxh3 = info.xxh3;
        w.tar_bytes = info.tar_bytes;
        out.push_back(std::move(w));
      }
    }
    return out;
  }

 private:
  const Context& c_;
  std::shared_ptr<ShardWritePool> pool_;
  // By (domain, val): a domain's training series, then its validation series.
  std::map<std::pair<std::string, bool>, std::unique_ptr<RollingShardWriter>> writers_;
};

}  // namespace

Status write_stage(Context& c) {
  // Start this rank's shards afresh (a killed attempt may have left some).
  const std::string shards_root = c.out + "/shards";
  const std::string my_tag = "-r" + rank_tag(c.rank) + "-";
  std::error_code ec;
  if (c.size == 1) {
    KILN_RETURN_IF_ERROR(remove_all(shards_root));
  } else if (fs::exists(shards_root, ec)) {  // an unreadable folder is found by the listing below
    for (const auto& dir : fs::directory_iterator(shards_root, ec)) {
      if (!dir.is_directory()) continue;
      for (const auto& f : fs::directory_iterator(dir.path(), ec)) {
        if (f.path().filename().string().find(my_tag) == std::string::npos) continue;
        if (!fs::remove(f.path(), ec) && ec)
          return Status::io("cannot remove an earlier attempt's shard: " + ec.message())
              .with_file(f.path().string());
      }
      if (ec) break;
    }
    if (ec) return Status::io("cannot list the shards: " + ec.message()).with_file(shards_root);
  }
  // Documents whose ids removed.jsonl needs: removed ones and their kept representatives.
  std::vector<uint64_t> wanted;
  const uint64_t my_lo = make_docid(c.my_first_file(), 0), my_hi = make_docid(c.my_last_file(), 0);
  for (const RemovedEntry& e : c.removed) {
    if (e.docid >= my_lo && e.docid < my_hi) wanted.push_back(e.docid);
    if (e.kept >= my_lo && e.kept < my_hi) wanted.push_back(e.kept);
  }
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());

  const NpyDtype token_dtype =
      c.tokenizer.vocab_size > 0 ? npy_token_dtype(c.tokenizer.vocab_size) : NpyDtype::kU32;
  using Out = OutSample;
  struct Work {
    RawBatch raw;
    std::vector<Out> outs;
    std::vector<std::pair<uint64_t, nlohmann::json>> ids;
    std::vector<std::pair<uint64_t, std::string>> index_docs;  // (docid, input id as JSON text)
  };
  uint64_t to_write = 0;
  for (uint32_t f = c.my_first_file(); f < c.my_last_file(); ++f) to_write += c.file_stats[f].valid;
  uint64_t my_removed = 0;
  for (const RemovedEntry& e : c.removed) my_removed += e.docid >= my_lo && e.docid < my_hi;
  to_write -= std::min(to_write, my_removed);
  std::unique_ptr<Progress> progress;
  if (c.rank == 0) progress = std::make_unique<Progress>("write", to_write, "docs");

  WriteResult res;
  if (c.opt.index) {
    KILN_RETURN_IF_ERROR(make_dirs(c.out + "/dedup/index/" + index_segment_name(c.index_segment)));
    KILN_RETURN_IF_ERROR(make_dirs(c.tmp_dir()));
  }
  IndexBuilder index(c);
  // The index entries among the removed documents (index_entry()), sorted.
  std::vector<uint64_t> removed_entries;
  if (index.enabled())
    for (const RemovedEntry& e : c.removed)
      if (e.docid >= my_lo && e.docid < my_hi && index_entry(c, e))
        removed_entries.push_back(e.docid);
  auto id_json = [](const Document& doc) {
    return doc.id_is_number ? doc.id
                            : nlohmann::json(doc.id).dump(-1, ' ', false,
                                                          nlohmann::json::error_handler_t::replace);
  };
  DomainShards sink(c);
  ValSplitter splitter(c.opt);
  const uint64_t split_seed = c.opt.seed ^ 0x76616c2d73706c74ull;
  auto emit = [&](Out&& o) -> Status {
    if (o.val) {
      DomainStats& ds = res.domains[o.domain];
      ++ds.val_docs;
      ds.val_tokens += o.tokens;
    }
    return sink.add(std::move(o));
  };
  const InputView in = c.inputs();
  Status st = pass_over_files<Work>(
      in, c.my_first_file(), c.my_last_file(),
      [&](Work& w) -> Status {
        Document doc;
        for (const RawItem& it : w.raw.items) {
          const uint64_t docid = make_docid(w.raw.fid, it.ordinal);
          if (c.is_filtered(docid)) continue;  // dropped by a quality filter (in rejects/)
          const bool removed = c.is_removed(docid);
          const bool want_id = std::binary_search(wanted.begin(), wanted.end(), docid);
          if (removed && !want_id) continue;
          if (!parse_item(in, w.raw, it, /*want_fields=*/!removed, &doc).ok) continue;
          if (want_id)  // a numeric input id stays a number in removed.jsonl
            w.ids.emplace_back(
                docid, doc.id_is_number ? nlohmann::json::parse(doc.id) : nlohmann::json(doc.id));
          if (removed) {
            if (std::binary_search(removed_entries.begin(), removed_entries.end(), docid))
              w.index_docs.emplace_back(docid, id_json(doc));
            continue;
          }
          if (index.enabled()) w.index_docs.emplace_back(docid, id_json(doc));
          if (doc.chat) {
            // A chat sample's text is its rendered template, its loss ranges byte offsets into
            // it: the filters' annotations apply, their edits (c4 lines, PII masks) do not.
            std::string rendered = doc.text;
            c.refilter(&doc);
            doc.text = std::move(rendered);
          } else {
            c.refilter(&doc);  // edits (c4, pii, regex) and annotations (language) of the filters
          }
          doc.domain.clear();
          doc.domain_by.clear();
          doc.tokens.clear();
          KILN_RETURN_IF_ERROR(c.annotator->annotate(doc));
          if (!is_valid_domain_name(doc.domain))
            return Status::internal("annotator gave an invalid domain '" + doc.domain +
                                    "' for document " + doc.id);
          Out o;
          o.domain = doc.domain;
          o.domain_by = doc.domain_by;
          o.tokens = doc.tokens.size();
          o.bytes = doc.text.size();
          o.sample.key = sample_key(c.key_base + doc.index);
          o.docid = docid;
          o.split_hash = xxh3_64(doc.id.data(), doc.id.size(), split_seed);
          std::string meta = sample_metadata(doc);
          o.sample.members.push_back({"txt", std::move(doc.text)});
          o.sample.members.push_back({"json", std::move(meta)});
          if (!doc.tokens.empty())
            o.sample.members.push_back({"tokens.npy", npy_encode(doc.tokens, token_dtype)});
          if (doc.chat && !doc.loss_mask.empty())  // 1 per token the loss counts (FORMATS.md)
            o.sample.members.push_back(
                {"mask.npy", npy_encode(std::span<const uint8_t>(doc.loss_mask))});
          w.outs.push_back(std::move(o));
        }
        return Status::ok();
      },
      [&](Work& w) -> Status {
        for (const auto& [docid, id] : w.index_docs) KILN_RETURN_IF_ERROR(index.add(docid, id));
        for (Out& o : w.outs) {
          DomainStats& ds = res.domains[o.domain];
          ++ds.docs;
          ds.tokens += o.tokens;
          ds.bytes += o.bytes;
          ++ds.domain_by[o.domain_by];
          ++res.docs_out;
          KILN_RETURN_IF_ERROR(splitter.enabled() ? splitter.add(std::move(o), emit)
                                                  : sink.add(std::move(o)));
          crash_point("write-doc");
        }
        if (progress) progress->add(w.outs.size());
        for (auto& id : w.ids) res.ids.push_back(std::move(id));
        return Status::ok();
      });
  if (progress) progress->finish();
  if (st.is_ok()) st = splitter.finish(emit);
  if (st.is_ok()) {
    auto shards = sink.finish();
    if (shards.is_ok())
      res.shards = std::move(*shards);
    else
      st = std::move(shards).take_status();
  }
  // The index exchanges refs between ranks: every rank gets there, or none does.
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, std::move(st)));
  KILN_ASSIGN_OR_RETURN(res.index_run, index.finish());
  c.written = std::move(res);
  return Status::ok();
}

}  // namespace kiln::prep::detail
