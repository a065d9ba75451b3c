// The training data loader: reads a `kiln prep` dataset (manifest.json + tar shards) and yields
// packed, domain-mixed batches for one data-parallel rank. See docs/LOADER.md for the algorithm.
//
// What it guarantees:
// - Global batches: a step's `global_batch` rows (over all data-parallel ranks and micro-batches)
//   are a function of the dataset, seed, weights history, global batch and seq_len only — not of
//   the data-parallel size or of the split into micro-batches and gradient accumulation. Row j of
//   a step belongs to canonical partition j mod P (P = `partitions`, fixed for the run and kept in
//   the state); a partition reads its own disjoint part of every domain (shuffled from (seed,
//   epoch, domain), split into P parts at sample granularity). Rank w of W hosts the contiguous
//   partitions [w P/W, (w+1) P/W) and yields their rows in global row order, `micro_batch` per
//   next_batch(), global_batch / (micro_batch W) calls per step. Any W dividing P reproduces the
//   run; a partition whose part of a domain is used up starts that domain's next epoch (epochs are
//   counted per domain); the tokens of the last partial sequence of an epoch continue into the
//   next epoch (nothing is dropped).
// - Mixture: the domain of global row j of step s is decided from (seed, s * global_batch + j,
//   weights of step s), the same on every rank and layout. Weights can be replaced between any
//   two steps (set_weights); the change is recorded in the state's history by global step.
// - Packing: documents of one domain are joined, each followed by the manifest tokenizer's
//   eos_id, and cut into sequences of seq_len + 1 tokens; a document that does not fit continues
//   in the partition's next sequence of that domain. No token is dropped or duplicated.
// - Prefetch: `workers` threads read, decompress and pack shards ahead; a bounded queue holds up
//   to `prefetch_depth` assembled batches. Memory is bounded by these settings, the shard size and
//   the partitions hosted (P / W per domain), not by the dataset size. Batch::wait_ms reports how
//   long next_batch() blocked.
// - State: state() is small (per hosted partition and domain: epoch and position within the
//   epoch's order; the weights history) and restore() continues with exactly the batches that
//   would have come next, without replaying from the start. The merged states of all ranks
//   (merge()) restore on any W that divides P with the identical sample sequence; on another W
//   (or global batch) only with `repartition`, which continues the current epochs without
//   repeating or skipping a sample but in another order (logged as a warning).
// - Errors: a missing shard, a checksum mismatch or a malformed member is a kData Status naming
//   the shard and member; with skip_bad_shards the shard is skipped, counted and logged instead.
//
// Thread safety: a Loader is driven by one thread (next_batch, set_weights, state, restore are not
// safe to call concurrently with each other); it owns its worker threads and joins them in the
// destructor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/manifest.h"
#include "common/status.h"
#include "loader/domain_weights.h"

namespace kiln::loader {

struct LoaderOptions {
  int64_t seq_len = 1024;    // a sequence holds seq_len + 1 tokens (inputs [0,T), targets [1,T])
  int64_t micro_batch = 8;   // sequences per batch (per rank and next_batch() call)
  int dp_rank = 0;           // this rank's data-parallel index, 0 <= dp_rank < dp_world
  int dp_world = 1;          // data-parallel world size (tensor-parallel peers share a dp_rank)
  // Rows of one optimizer step over all ranks: micro_batch * dp_world * gradient accumulation.
  // 0: micro_batch * dp_world (no accumulation). Must be a multiple of micro_batch * dp_world.
  int64_t global_batch = 0;
  // Canonical partitions P: 0 = global_batch (every data-parallel size that can run the global
  // batch reproduces the run). Must divide global_batch and be a multiple of dp_world. A
  // restored state's P replaces this one.
  int64_t partitions = 0;
  // Restoring a state whose partitions dp_world does not divide, or whose global batch differs:
  // false refuses (kConfig naming the allowed sizes); true re-splits what is left of the current
  // epochs over this layout's partitions (no sample repeated or skipped, another order; a warning).
  bool repartition = false;
  uint64_t seed = 0;         // shared by all ranks: shuffles and mixture decisions
  // Domain weights (normalised; domains not named get 0). Empty: the manifest's token shares.
  DomainWeights weights;
  int prefetch_depth = 4;    // batches assembled ahead, 1 .. 65536
  int workers = 2;           // threads that read, decompress and pack shards, 1 .. 256
  bool skip_bad_shards = false;  // skip (count, log) an unreadable shard instead of failing
  bool verify_checksums = true;  // check each shard's XXH3-64 against the manifest before use
  bool sample_ids = false;       // parse "id" from <key>.json into DocSpan::id (kiln stream)
  // Which split to read: the training shards (default; validation shards are never read) or
  // only the validation shards ("split": "val" in the manifest, written by `kiln prep` with
  // split.val_fraction / split.val_min_docs).
  bool val_split = false;
};

// A piece of one document held by a sequence.
struct DocSpan {
  uint32_t shard = 0;       // index into Manifest::shards
  uint32_t member = 0;      // index of the sample within its shard (tar order)
  uint64_t epoch = 0;       // epoch of the domain this piece was read in
  uint32_t doc_offset = 0;  // document token index of the first token held (0: the doc starts here)
  uint32_t length = 0;      // tokens held, counting the document's trailing eos if it is held
  uint32_t seq_offset = 0;  // position in the sequence of the first token held
  bool ends = false;        // the document's eos is held here (the document ends in this sequence)
  std::string id;           // the input id as raw JSON (e.g. "\"doc-7\"" or "17") when
                            // LoaderOptions::sample_ids, else empty
};

// One step's data for this rank. Rows are sequences of seq_len + 1 tokens.
struct Batch {
  int64_t step = 0;         // 0-based global (optimizer) step of this batch
  int64_t micro = 0;        // which micro-batch of the step on this rank, 0 .. accumulation - 1
  int64_t micro_batch = 0;  // rows
  int64_t seq_len = 0;      // row length is seq_len + 1
  std::vector<uint32_t> tokens;            // micro_batch * (seq_len + 1), row-major
  // Beside tokens: 1 when the token is a target the loss counts (a chat sample's assistant
  // tokens, every token of a plain document), 0 otherwise (docs/LOADER.md "Loss masks").
  std::vector<uint8_t> loss_mask;
  bool has_masks = false;                  // some token of the batch has loss_mask 0
  std::vector<int32_t> domains;            // domain id per row (see Loader::domain_names)
  std::vector<std::vector<DocSpan>> docs;  // per row, the document pieces in order
  std::vector<int64_t> global_rows;        // per row, its index in the step's global batch
  double wait_ms = 0;  // time next_batch() blocked waiting for this batch

  std::span<const uint32_t> row(int64_t i) const {
    return {tokens.data() + i * (seq_len + 1), static_cast<size_t>(seq_len + 1)};
  }
  // Offsets in row i where a new document begins (for attention masks and position resets).
  std::vector<int32_t> doc_starts(int64_t i) const;
};

// Serialisable loader position, in terms of canonical partitions. A state from state() holds the
// partitions of one rank; merge() combines the states of all ranks so it can be restored on any
// data-parallel size that divides `partitions`.
struct LoaderState {
  // Positions [begin, end) of a domain's shuffled sample order of `epoch`; the first
  // `skip_tokens` tokens of the sample at `begin` were already emitted.
  struct Interval {
    uint64_t epoch = 0;
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t skip_tokens = 0;
  };
  struct DomainCursor {
    std::vector<Interval> pending;  // read these first, in order
    uint64_t next_epoch = 0;        // then the partition's part of epoch next_epoch, ...
    uint64_t sequences = 0;         // sequences of this domain emitted by the partition so far
  };
  struct PartitionCursor {
    int64_t partition = 0;
    std::map<std::string, DomainCursor> domains;
  };
  struct WeightChange {
    int64_t step = 0;       // first global step the weights apply to
    DomainWeights weights;  // normalised, every domain named
  };

  uint64_t dataset = 0;  // fingerprint of the manifest's shard list; restore() checks it
  uint64_t seed = 0;
  int64_t partitions = 1;    // canonical partitions P
  int64_t global_batch = 1;  // rows per global step
  int world = 1;             // dp_world of the run that saved it (informational; micro > 0 checks)
  int64_t micro_batch = 1;   // its micro_batch (likewise)
  int64_t step = 0;          // global steps completed (the next batch's step)
  int64_t micro = 0;         // micro-batches of that step this rank already returned (0: none)
  std::vector<WeightChange> weights_history;  // in step order; the first applies from step 0
  std::vector<PartitionCursor> cursors;       // this rank's partitions, or all P after merge()
  uint64_t skipped_shards = 0;

  std::string to_json() const;  // compact, deterministic
  static Result<LoaderState> from_json(std::string_view text, const std::string& origin = "");
  // Combines the states of every rank of one run (same dataset, seed, partitions, step). kConfig
  // on a mismatch or a duplicated partition.
  static Result<LoaderState> merge(const std::vector<LoaderState>& per_rank);
};

struct LoaderStats {
  struct Domain {
    std::string name;
    uint64_t epoch = 0;      // lowest epoch the next sequences of this rank's partitions start in
    uint64_t sequences = 0;  // sequences emitted (this rank's partitions)
  };
  std::vector<Domain> domains;
  int64_t step = 0;             // the next batch's global step
  int64_t partitions = 0;       // canonical partitions P of the run
  uint64_t shards_read = 0;     // shard reads completed by the workers since open / restore
  uint64_t tar_bytes = 0;       // uncompressed tar bytes of those reads
  uint64_t tokens = 0;          // tokens emitted in consumed batches
  uint64_t skipped_shards = 0;  // bad shards skipped (skip_bad_shards)
  double wait_ms_total = 0;     // total time next_batch() blocked
};

class Loader {
 public:
  // Validates options and weights against the manifest (kConfig naming the option / domain) and
  // starts the workers. The manifest must name an eos_id.
  static Result<std::unique_ptr<Loader>> open(Manifest manifest, LoaderOptions options);
  // Reads the manifest (a file or a directory holding manifest.json) first.
  static Result<std::unique_ptr<Loader>> open(const std::string& manifest_path,
                                              LoaderOptions options);
  virtual ~Loader() = default;

  // The next batch; blocks until it is ready (Batch::wait_ms says how long). A read error is
  // returned here (kData naming the shard and member) and repeats on later calls.
  virtual Result<Batch> next_batch() = 0;

  // Replaces the weights from the next batch on (names as in the manifest; normalised; unnamed
  // domains get 0). Recorded in the state's weights history. kConfig on unknown domains, negative
  // or non-finite values, or all zero; kData when a weighted domain has no samples.
  virtual Status set_weights(const DomainWeights& weights) = 0;
  // Normalised weights in effect for the next batch, every domain named.
  virtual DomainWeights weights() const = 0;

  // Position after the last batch returned by next_batch(). Cheap; call it at checkpoint time.
  virtual LoaderState state() const = 0;
  // Continues from `state`: either this rank's own state (same layout) or a merged state of all
  // ranks (any dp_world dividing its partitions; others with `repartition`). Prefetched batches
  // are discarded. The state's seed, partitions and weights history replace the options'.
  // kConfig when the state does not fit this dataset or layout, naming what would.
  virtual Status restore(const LoaderState& state) = 0;

  // Domain names in id order (sorted by name, as in the manifest).
  virtual const std::vector<std::string>& domain_names() const = 0;
  // The id of a domain, or -1.
  virtual int domain_id(std::string_view name) const = 0;
  virtual const Manifest& manifest() const = 0;
  virtual const LoaderOptions& options() const = 0;
  virtual LoaderStats stats() const = 0;
};

}  // namespace kiln::loader
