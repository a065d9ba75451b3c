// Stage 4 (annotate): build the annotator (domain rules, model, tokenizer), training its
// tokenizer on a uniform sample of kept documents when the config asks for one. A loaded
// tokenizer was already built and checked by the driver before anything was written (run_prep).
#include <cstring>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"
#include "dataprep/stages/batch_pipeline.h"
#include "dataprep/stages/stages.h"
#include "dataprep/stages/work_files.h"

namespace kiln::prep::detail {
namespace {

// Kept texts sampled uniformly (by a hash of their global index) up to tokenizer.train_bytes,
// gathered on rank 0 in global order. Other ranks get an empty vector.
Result<std::vector<std::string>> sample_training_texts(const Context& c) {
  const uint64_t train_bytes = c.opt.tokenizer.train_bytes;
  uint64_t kept_bytes = 0;
  for (uint32_t f = c.my_first_file(); f < c.my_last_file(); ++f)
    kept_bytes += c.file_stats[f].text_bytes;
  KILN_ASSIGN_OR_RETURN(uint64_t total,
                        comm::allreduce_value<uint64_t>(*c.g, kept_bytes, comm::ReduceOp::kSum));
  // Removed documents are skipped, so aim the rate at the kept share of the bytes.
  double kept_share = 1.0;
  uint64_t docs_valid = 0;
  for (const auto& s : c.file_stats) docs_valid += s.valid;
  if (docs_valid > 0) kept_share = 1.0 - static_cast<double>(c.removed.size()) / docs_valid;
  double expected = static_cast<double>(total) * std::max(kept_share, 1e-9);
  const uint64_t cut = sample_cut(expected > 0 ? train_bytes / expected : 1.0);
  const uint64_t seed = c.opt.seed ^ 0x746f6b656e697aull;
  struct Work {
    RawBatch raw;
    std::string blob;  // u64 length + bytes per chosen text
  };
  std::string mine;
  const InputView in = c.inputs();
  Status st = pass_over_files<Work>(
      in, c.my_first_file(), c.my_last_file(),
      [&](Work& w) {
        Document doc;
        for (const RawItem& it : w.raw.items) {
          uint64_t docid = make_docid(w.raw.fid, it.ordinal);
          uint64_t gi = c.global_index(docid);
          if (xxh3_64(&gi, sizeof gi, seed) > cut || c.is_removed(docid) || c.is_filtered(docid))
            continue;
          if (!parse_item(in, w.raw, it, false, &doc).ok) continue;
          c.refilter(&doc);  // the tokenizer learns the text the shards will hold
          uint64_t n = doc.text.size();
          w.blob.append(reinterpret_cast<const char*>(&n), 8);
          w.blob.append(doc.text);
        }
        return Status::ok();
      },
      [&](Work& w) {
        mine += w.blob;
        return Status::ok();
      });
  KILN_RETURN_IF_ERROR(comm::agree(*c.g, std::move(st)));
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> blobs, comm::gather_strings(*c.g, mine, 0));
  std::vector<std::string> texts;
  for (const std::string& b : blobs) {
    size_t at = 0;
    while (at + 8 <= b.size()) {
      uint64_t n;
      std::memcpy(&n, b.data() + at, 8);
      at += 8;
      texts.emplace_back(b.substr(at, n));
      at += n;
    }
  }
  return texts;
}

std::string tokenizer_entry_json(const ManifestTokenizer& t) {
  nlohmann::json j = {{"path", t.path}, {"vocab_size", t.vocab_size}, {"eos_id", t.eos_id}};
  return j.dump();
}

ManifestTokenizer tokenizer_entry_from_json(const std::string& s) {
  ManifestTokenizer t;
  nlohmann::json j = parse_untrusted_json_or_discarded(s);
  if (j.is_object()) {
    t.path = j.value("path", std::string());
    t.vocab_size = json_integer_or(j, "vocab_size", uint64_t{0});
    t.eos_id = json_integer_or(j, "eos_id", int64_t{-1});
  }
  return t;
}

}  // namespace

Status annotator_stage(Context& c, bool fresh) {
  const bool training = c.opt.tokenizer.trains();
  const std::string copy = c.rank_dir + "/tokenizer.json";
  auto create_from_copy = [&]() -> Status {
    TokenizerOptions from_copy = c.opt.tokenizer;
    from_copy.path = copy;
    KILN_ASSIGN_OR_RETURN(c.annotator, Annotator::create(c.opt.domains, from_copy, {}));
    return Status::ok();
  };
  if (!fresh) {  // resuming after this stage: rebuild the same annotator
    if (training) return create_from_copy();
    if (!c.annotator) {
      KILN_ASSIGN_OR_RETURN(c.annotator, Annotator::create(c.opt.domains, c.opt.tokenizer, {}));
    }
    return Status::ok();
  }
  std::string entry_json, tokenizer_bytes;
  Status st;
  if (training) {
    KILN_ASSIGN_OR_RETURN(std::vector<std::string> texts, sample_training_texts(c));
    if (c.rank == 0) {
      KILN_LOG_INFO("training the tokenizer on {} sampled kept documents", texts.size());
      auto a = Annotator::create(c.opt.domains, c.opt.tokenizer, texts);
      if (!a.is_ok()) {
        st = std::move(a).take_status();
      } else {
        auto entry = (*a)->save_tokenizer(c.out);
        if (!entry.is_ok()) {
          st = std::move(entry).take_status();
        } else {
          entry_json = tokenizer_entry_json(*entry);
          if (!entry->path.empty()) {
            auto bytes = read_file(c.out + "/" + entry->path);
            if (bytes.is_ok())
              tokenizer_bytes = std::move(*bytes);
            else
              st = std::move(bytes).take_status();
          }
        }
      }
    }
    KILN_RETURN_IF_ERROR(comm::agree(*c.g, std::move(st)));
    KILN_RETURN_IF_ERROR(comm::bcast_string(*c.g, &entry_json, 0));
    KILN_RETURN_IF_ERROR(comm::bcast_string(*c.g, &tokenizer_bytes, 0));
    // Every rank (rank 0 too) tokenizes with the saved tokenizer, so a resumed run is identical.
    KILN_RETURN_IF_ERROR(write_file_atomic(copy, tokenizer_bytes));
    st = create_from_copy();
  } else {
    // A loaded tokenizer: run_prep built the annotator before writing anything.
    if (!c.annotator) return Status::internal("the annotator was not loaded before the stages");
    if (c.rank == 0) {
      auto entry = c.annotator->save_tokenizer(c.out);
      if (entry.is_ok())
        entry_json = tokenizer_entry_json(*entry);
      else
        st = std::move(entry).take_status();
    }
    KILN_RETURN_IF_ERROR(comm::agree(*c.g, std::move(st)));
    KILN_RETURN_IF_ERROR(comm::bcast_string(*c.g, &entry_json, 0));
  }
  c.tokenizer = tokenizer_entry_from_json(entry_json);
  return st;
}

}  // namespace kiln::prep::detail
