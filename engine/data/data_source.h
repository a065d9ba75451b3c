// Where training batches come from: the loader (a `kiln prep` dataset) or synthetic data.
//
// A DataSource yields micro-batches of (micro_batch, seq_len) inputs and next-token targets with
// a domain per sequence, takes new domain weights between steps, and saves / restores its
// position as a JSON string (stored in checkpoints) so a resumed run sees exactly the batches
// that would have come next. Driven by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/data.h"
#include "engine/config/model.h"
#include "engine/mixing/control_file.h"

namespace kiln::engine {

struct MicroBatch {
  int64_t rows = 0, seq_len = 0;
  std::vector<int32_t> inputs;   // rows * seq_len
  std::vector<int32_t> targets;  // rows * seq_len
  std::vector<int32_t> domains;  // rows: index into DataSource::domains()
  // rows * seq_len: the row position where each token's document starts (0 <= start <= t;
  // model.doc_mask restarts attention and positions there). Empty when the source has no
  // documents (synthetic data): one document per row.
  std::vector<int32_t> doc_start;
  double wait_ms = 0;  // time spent waiting for this batch
  // The documents the batch holds pieces of, "<shard path>#<member>" (loader data; empty for
  // synthetic data), for logging a skipped batch.
  std::vector<std::string> samples;
};

// "a, b, ... (N in all)": the first 16 of a batch's samples, for a message naming them.
std::string listed_samples(const std::vector<std::string>& samples);

// Whether every input is a token id of the model's vocabulary [0, vocab) and every target one or
// -1 (padding): kData naming the first id outside it, where it is and the batch's samples. Every
// batch is checked on the host before it reaches the model (training and validation batches).
Status check_token_ids(const MicroBatch& b, int64_t vocab);

// A domain's fixed validation sequences (see engine/train/eval.h).
struct ValidationSequences {
  int domain = 0;  // index into DataSource::domains()
  int64_t rows = 0, seq_len = 0;
  std::vector<int32_t> inputs;     // rows * seq_len
  std::vector<int32_t> targets;    // rows * seq_len
  std::vector<int32_t> doc_start;  // rows * seq_len, as MicroBatch's
};

// Appends the per-token document starts of one row of seq_len tokens to *out, from the row
// positions where documents begin (loader::Batch::doc_starts; a row that begins inside a document
// starts one there).
void append_doc_starts(const std::vector<int32_t>& starts, int64_t seq_len,
                       std::vector<int32_t>* out);

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual Status next(MicroBatch* out) = 0;
  virtual const std::vector<std::string>& domains() const = 0;
  // Normalised weights in effect for the next batch, every domain named.
  virtual loader::DomainWeights weights() const = 0;
  // Replaces the weights from the next batch on (unnamed domains get 0). kConfig when invalid.
  virtual Status set_weights(const loader::DomainWeights& weights) = 0;
  virtual std::string state() const = 0;
  // One state from every data-parallel rank's state() (rank order): restore() takes it on any
  // number of ranks and continues without repeating or skipping a sample. kData on a mismatch.
  virtual Result<std::string> merge_states(const std::vector<std::string>& per_rank) const = 0;
  virtual Status restore(const std::string& state) = 0;
  virtual std::string describe() const = 0;
  // Up to `per_domain` validation sequences of every domain that has any, the same on every
  // call (independent of the training position). Empty when the data has no validation split.
  virtual Result<std::vector<ValidationSequences>> validation_set(int64_t per_domain) = 0;
};

// This process's share of the data: data-parallel rank `rank` of `world` (tensor-parallel peers
// share a rank and so read the same batches).
struct DataRank {
  int rank = 0;
  int world = 1;
};

// Synthetic data (no manifest): two learnable domains, "markov" (a sparse random bigram chain:
// each token has 4 equally likely successors, so the best loss is ln 4 = 1.386) and "repeat"
// (a random 16-token motif repeated; predictable after its first period). Every token is a pure
// function of (seed, sequence slot, position); the state is the slot counter plus the weights.
// Data-parallel rank r of W reads slots [s + r*B, s + (r+1)*B) of each group of W*B, so W ranks
// with micro-batch B see exactly the rows one process with micro-batch W*B sees; the slot counter
// is global, so the state is the same on every rank and resumes on any world size.
// Each source takes config section `data`, the model (seq_len, vocab_size) and run.seed.
std::unique_ptr<DataSource> make_synthetic_source(const DataConfig& data, const ModelConfig& model,
                                                  uint64_t seed, DataRank rank = {});

// The loader over data.manifest, or synthetic data when data.manifest is empty.
Result<std::unique_ptr<DataSource>> open_data_source(const DataConfig& data,
                                                     const ModelConfig& model, uint64_t seed,
                                                     DataRank rank = {});

}  // namespace kiln::engine
