// The Loader implementation: threads, queues and positions around four parts with their own
// headers — plan.h (cursor -> units), decode.h (unit -> packed tokens), pack.h (mixture decision,
// sequences cut from the packed streams) and weights_history.h (the weights of every step, as
// the state records them). Structure (see docs/LOADER.md):
//
//   Planner (per hosted canonical partition and domain: a "stream") — turns the stream's cursor
//                           (pending intervals of shuffled epoch orders, then the partition's
//                           regular parts of later epochs) into "units": the members of one
//                           shard that one epoch's order visits consecutively.
//   workers               — decode planned units: read the shard, check it, widen the token ids,
//                           append eos after every document (the packed token stream).
//   packer thread         — assembles batches ahead into a bounded queue: for each of the rank's
//                           rows of the global batch, picks the domain from the shared mixture
//                           sequence (by global row) and cuts the next seq_len + 1 tokens of the
//                           row's partition's packed stream of that domain.
//   consumer              — next_batch() pops a batch and moves the consumed positions forward.
//
// Per stream, the units from the consumer's position on stay in memory (a deque), so
// set_weights() can drop the prefetched batches and rewind the packer to the consumer's position
// without reading anything again. Positions are (unit, document, token) triples; state() turns the
// consumer's positions into serialisable cursors using the unit's plan.
#include "loader/loader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/hash.h"
#include "common/log.h"
#include "common/text.h"
#include "loader/decode.h"
#include "loader/order.h"
#include "loader/pack.h"
#include "loader/plan.h"
#include "loader/reshard.h"
#include "loader/weights_history.h"

namespace kiln::loader {

namespace {

using loader::detail::DecodeOptions;
using loader::detail::DomainInfo;
using loader::detail::FillResult;
using loader::detail::Planner;
using loader::detail::Pos;
using loader::detail::Unit;
using loader::detail::WeightsHistory;
using DomainCursor = LoaderState::DomainCursor;

struct DomainRt {
  DomainInfo info;
  std::unique_ptr<Planner> planner;
  DomainCursor initial;  // the cursor before unit 0
  std::deque<std::shared_ptr<Unit>> units;  // seq front_seq, front_seq + 1, ...
  uint64_t front_seq = 0;
  Pos consumer, packer;
  uint64_t consumer_seqs = 0, packer_seqs = 0;
  uint64_t packer_head = 0;  // highest unit seq the in-progress batch asked for
  bool starving = false;     // the packer waits for a unit not planned yet
  // The last unit planned: (epoch, end position); nothing planned before it is asked for again.
  bool planned_any = false;
  uint64_t last_epoch = 0, last_end = 0;
  // Parts of shards decoded for this stream by another hosted stream's read of the same shard
  // (the shard at the boundary of two adjacent partitions' blocks), until this stream plans them.
  std::vector<std::shared_ptr<Unit>> parked;
  // Parts of shards for this stream that another worker's read is filling right now; `waiter` is
  // this stream's planned unit for exactly that part, completed when the read lands.
  struct InflightPart {
    std::shared_ptr<Unit> part, waiter;
  };
  std::vector<InflightPart> inflight;
  uint64_t planned_end() const { return front_seq + units.size(); }
};

struct RowPos {
  int domain;
  Pos pos;
  uint64_t seqs;
};

struct Prepared {
  Status status;
  Batch batch;
  std::vector<RowPos> rows;
};

uint64_t dataset_fingerprint(const Manifest& m) {
  Xxh3Stream h(0x6b696c6e);
  for (const auto& s : m.shards) {
    h.update(s.path);
    h.update("\0", 1);
    h.update(s.domain);
    h.update("\0", 1);
    h.update(std::to_string(s.samples));
    h.update("\0", 1);
    h.update(hex64(s.xxh3));
    h.update("\n", 1);
  }
  return h.digest();
}

class LoaderImpl final : public Loader {
 public:
  LoaderImpl(Manifest manifest, LoaderOptions options)
      : manifest_(std::move(manifest)), options_(std::move(options)) {}
  ~LoaderImpl() override { stop_threads(); }

  Status init() {
    const auto& o = options_;
    if (o.seq_len < 1 || o.seq_len > (1ll << 30)) {
      return Status::config("seq_len must be in [1, 2^30], got " + std::to_string(o.seq_len))
          .with_key("seq_len");
    }
    if (o.micro_batch < 1 || o.micro_batch > (1 << 20)) {
      return Status::config("micro_batch must be in [1, 2^20]").with_key("micro_batch");
    }
    if (o.dp_world < 1) return Status::config("dp_world must be >= 1").with_key("dp_world");
    if (o.dp_rank < 0 || o.dp_rank >= o.dp_world) {
      return Status::config("dp_rank " + std::to_string(o.dp_rank) + " is not in [0, " +
                            std::to_string(o.dp_world) + ")")
          .with_key("dp_rank");
    }
    const int64_t per_call = o.micro_batch * o.dp_world;
    G_ = o.global_batch == 0 ? per_call : o.global_batch;
    if (G_ < 1 || G_ > (1ll << 40) || G_ % per_call != 0) {
      return Status::config("global_batch " + std::to_string(G_) +
                            " is not a multiple of micro_batch x dp_world = " +
                            std::to_string(o.micro_batch) + " x " + std::to_string(o.dp_world))
          .with_key("global_batch");
    }
    KILN_RETURN_IF_ERROR(check_partitions(o.partitions == 0 ? G_ : o.partitions, "partitions"));
    P_ = o.partitions == 0 ? G_ : o.partitions;
    // Upper bounds as in kiln stream's flags and the train config: a thread each, a batch each.
    if (o.prefetch_depth < 1 || o.prefetch_depth > (1 << 16)) {
      return Status::config("prefetch_depth must be in [1, 65536], got " +
                            std::to_string(o.prefetch_depth))
          .with_key("prefetch_depth");
    }
    if (o.workers < 1 || o.workers > 256) {
      return Status::config("workers must be in [1, 256], got " + std::to_string(o.workers))
          .with_key("workers");
    }
    if (manifest_.tokenizer.eos_id < 0) {
      return Status::config("the manifest's tokenizer has no eos_id; packing needs one")
          .with_key("tokenizer.eos_id");
    }
    if (manifest_.tokenizer.vocab_size > 0 &&
        static_cast<uint64_t>(manifest_.tokenizer.eos_id) >= manifest_.tokenizer.vocab_size) {
      return Status::config("eos_id is not below vocab_size").with_key("tokenizer.eos_id");
    }
    eos_ = static_cast<uint32_t>(manifest_.tokenizer.eos_id);
    for (const auto& [name, d] : manifest_.domains) names_.push_back(name);
    for (size_t i = 0; i < names_.size(); ++i) {
      DomainInfo info;
      info.name = names_[i];
      infos_.push_back(std::move(info));
    }
    for (size_t s = 0; s < manifest_.shards.size(); ++s) {
      const auto& sh = manifest_.shards[s];
      const int id = domain_id(sh.domain);
      if (id < 0) {
        return Status::data("shard's domain '" + sh.domain + "' is not in the manifest's domains")
            .with_file(sh.path);
      }
      if (sh.samples > UINT32_MAX) {
        return Status::data("shard has more than 2^32 samples").with_file(sh.path);
      }
      auto& info = infos_[id];
      info.shard_ids.push_back(static_cast<uint32_t>(s));
      info.shard_samples.push_back(sh.samples);
      info.samples += sh.samples;
      info.tokens += sh.tokens;
    }
    if (names_.empty()) return Status::data("the manifest has no domains");
    for (const DomainInfo& info : infos_) {  // packed tokens (with eos) of an average shard
      shard_tokens_.push_back(info.shard_ids.empty()
                                  ? 0.0
                                  : static_cast<double>(info.tokens + info.samples) /
                                        static_cast<double>(info.shard_ids.size()));
    }
    fingerprint_ = dataset_fingerprint(manifest_);
    seed_ = o.seed;

    std::vector<double> w;
    if (o.weights.empty()) {
      w = default_weights();
    } else {
      KILN_ASSIGN_OR_RETURN(w, normalise(o.weights));
    }
    history_ = WeightsHistory(names_);
    history_.append(0, std::move(w));
    decode_options_.verify_checksums = o.verify_checksums;
    decode_options_.sample_ids = o.sample_ids;
    decode_options_.eos = eos_;

    // A fresh run: each hosted partition's part of epoch 0 onwards.
    reset_streams(std::vector<DomainCursor>(streams()));
    start_threads();
    return Status::ok();
  }

  Result<Batch> next_batch() override {
    std::unique_lock lk(mu_);
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lk, [&] { return !queue_.empty() || !latched_.is_ok(); });
    const double waited = ms_since(t0);
    wait_total_ += waited;
    last_wait_ms_ = waited;
    if (!latched_.is_ok()) return latched_;
    Prepared p = std::move(queue_.front());
    queue_.pop_front();
    if (!p.status.is_ok()) {
      latched_ = p.status;
      return latched_;
    }
    for (const RowPos& r : p.rows) {
      DomainRt& D = *domains_[r.domain];
      D.consumer = r.pos;
      D.consumer_seqs = r.seqs;
    }
    for (auto& dp : domains_) {
      DomainRt& D = *dp;
      while (!D.units.empty() && D.front_seq < D.consumer.unit) {
        recycle(std::move(D.units.front()));
        D.units.pop_front();
        ++D.front_seq;
      }
    }
    if (++consumer_micro_ == accumulation()) {
      ++consumer_step_;
      consumer_micro_ = 0;
    }
    tokens_emitted_ += p.batch.tokens.size();
    cv_.notify_all();
    p.batch.wait_ms = waited;
    return std::move(p.batch);
  }

  Status set_weights(const DomainWeights& weights) override {
    KILN_ASSIGN_OR_RETURN(std::vector<double> w, normalise(weights));
    std::unique_lock lk(mu_);
    // Mid-step (some micro-batches of this step returned) the change waits for the next step:
    // a step's rows are mixed with one set of weights on every rank.
    history_.set_from(consumer_step_ + (consumer_micro_ > 0 ? 1 : 0), std::move(w));
    rewind_locked();
    return Status::ok();
  }

  DomainWeights weights() const override {
    std::unique_lock lk(mu_);
    return history_.by_name(history_.at(consumer_step_));
  }

  LoaderState state() const override {
    std::unique_lock lk(mu_);
    LoaderState s;
    s.dataset = fingerprint_;
    s.seed = seed_;
    s.partitions = P_;
    s.global_batch = G_;
    s.world = options_.dp_world;
    s.micro_batch = options_.micro_batch;
    s.step = consumer_step_;
    s.micro = consumer_micro_;
    s.weights_history = history_.changes();
    s.skipped_shards = bad_shards_.size() + skipped_before_;
    const size_t D = names_.size();
    for (int64_t hp = 0; hp < hosted(); ++hp) {
      LoaderState::PartitionCursor pc;
      pc.partition = first_partition() + hp;
      for (size_t d = 0; d < D; ++d) pc.domains[names_[d]] = consumer_cursor(hp * D + d);
      s.cursors.push_back(std::move(pc));
    }
    return s;
  }

  Status restore(const LoaderState& state) override {
    if (state.dataset != fingerprint_) {
      return Status::config("loader state was saved for a different dataset (fingerprint " +
                            hex64(state.dataset) + ", this manifest " + hex64(fingerprint_) + ")")
          .with_key("dataset");
    }
    for (const auto& r : state.cursors) {
      if (r.domains.size() != names_.size() ||
          !std::all_of(names_.begin(), names_.end(),
                       [&](const std::string& n) { return r.domains.count(n) > 0; })) {
        return Status::config("loader state's domains differ from the manifest's")
            .with_key("cursors[partition " + std::to_string(r.partition) + "].domains");
      }
    }
    KILN_ASSIGN_OR_RETURN(Placement place, place_state(state));
    for (size_t i = 0; i < place.cursors.size(); ++i) {
      const size_t d = i % names_.size();
      for (const auto& iv : place.cursors[i].pending) {
        if (iv.end > infos_[d].samples) {
          return Status::config("loader state position " + std::to_string(iv.end) +
                                " is past the " + std::to_string(infos_[d].samples) +
                                " samples of domain '" + names_[d] + "'")
              .with_key("cursors.domains." + names_[d]);
        }
      }
    }
    WeightsHistory history(names_);
    if (state.weights_history.empty() || state.weights_history.front().step != 0) {
      history.append(0, history_.first());  // the weights in effect before the first change
    }
    for (const auto& h : state.weights_history) {
      KILN_ASSIGN_OR_RETURN(auto w, normalise(h.weights));
      history.append(h.step, std::move(w));
    }

    stop_threads();
    if (state.seed != options_.seed) {
      KILN_LOG_INFO("loader: restoring with the state's seed {} (options said {})", state.seed,
                    options_.seed);
    }
    seed_ = state.seed;
    history_ = std::move(history);
    consumer_step_ = packer_step_ = state.step;
    consumer_micro_ = packer_micro_ = state.micro;
    skipped_before_ = place.own ? state.skipped_shards : 0;
    bad_shards_.clear();
    shards_read_ = 0;
    tar_bytes_ = 0;
    queue_.clear();
    latched_ = Status::ok();
    P_ = place.partitions;
    reset_streams(place.cursors);
    start_threads();
    return Status::ok();
  }

  const std::vector<std::string>& domain_names() const override { return names_; }
  int domain_id(std::string_view name) const override {
    auto it = std::lower_bound(names_.begin(), names_.end(), name);
    if (it == names_.end() || *it != name) return -1;
    return static_cast<int>(it - names_.begin());
  }
  const Manifest& manifest() const override { return manifest_; }
  const LoaderOptions& options() const override { return options_; }

  LoaderStats stats() const override {
    std::unique_lock lk(mu_);
    LoaderStats s;
    const size_t D = names_.size();
    for (size_t d = 0; d < D; ++d) {
      LoaderStats::Domain sd{names_[d], UINT64_MAX, 0};
      for (int64_t hp = 0; hp < hosted(); ++hp) {
        const DomainCursor c = consumer_cursor(hp * D + d);
        sd.epoch = std::min(sd.epoch, c.pending.empty() ? c.next_epoch : c.pending.front().epoch);
        sd.sequences += c.sequences;
      }
      s.domains.push_back(sd);
    }
    s.step = consumer_step_;
    s.partitions = P_;
    s.shards_read = shards_read_;
    s.tar_bytes = tar_bytes_;
    s.tokens = tokens_emitted_;
    s.skipped_shards = bad_shards_.size() + skipped_before_;
    s.wait_ms_total = wait_total_;
    return s;
  }

 private:
  // ---- weights ---------------------------------------------------------------------------
  std::vector<double> default_weights() const {
    std::vector<double> w(names_.size(), 0.0);
    double total = 0;
    for (size_t d = 0; d < names_.size(); ++d) total += static_cast<double>(infos_[d].tokens);
    const bool by_tokens = total > 0;
    if (!by_tokens) {
      for (size_t d = 0; d < names_.size(); ++d) total += static_cast<double>(infos_[d].samples);
    }
    for (size_t d = 0; d < names_.size(); ++d) {
      w[d] = static_cast<double>(by_tokens ? infos_[d].tokens : infos_[d].samples) / total;
    }
    return w;
  }

  // Checked weights by domain id, summing to 1. kConfig naming "weights.<domain>".
  Result<std::vector<double>> normalise(const DomainWeights& weights) const {
    WeightRules rules;
    rules.known = names_;
    KILN_RETURN_IF_ERROR(weights.check(rules));
    std::vector<double> w = weights.normalised_over(names_);
    for (size_t d = 0; d < w.size(); ++d) {
      if (w[d] > 0 && infos_[d].samples == 0) {
        return Status::data("domain '" + names_[d] + "' has weight but no samples")
            .with_key("weights." + names_[d]);
      }
    }
    return w;
  }

  // ---- partitions ------------------------------------------------------------------------
  int64_t hosted() const { return P_ / options_.dp_world; }
  int64_t first_partition() const { return options_.dp_rank * hosted(); }
  size_t streams() const { return static_cast<size_t>(hosted()) * names_.size(); }
  int64_t accumulation() const { return G_ / (options_.micro_batch * options_.dp_world); }

  // P fits this layout: it divides the global batch and dp_world divides it.
  Status check_partitions(int64_t p, const char* key) const {
    if (p < 1 || p > (1 << 24) || G_ % p != 0 || p % options_.dp_world != 0) {
      return Status::config(std::string(key) + " " + std::to_string(p) +
                            " must divide the global batch (" + std::to_string(G_) +
                            ") and be a multiple of dp_world (" +
                            std::to_string(options_.dp_world) + ")")
          .with_key(key);
    }
    return Status::ok();
  }

  // Where a restored state puts this rank: the partitions and one cursor per hosted stream.
  struct Placement {
    int64_t partitions = 0;
    std::vector<DomainCursor> cursors;  // hosted partition-major, then domain id
    bool own = false;                   // exactly this rank's partitions (skipped shards carry)
  };

  Result<Placement> place_state(const LoaderState& state) const {
    const int W = options_.dp_world;
    const size_t D = names_.size();
    std::map<int64_t, const LoaderState::PartitionCursor*> by_part;
    for (const auto& c : state.cursors) by_part[c.partition] = &c;
    auto held = [&] {
      std::string have;
      for (const auto& [p, c] : by_part) have += (have.empty() ? "" : ",") + std::to_string(p);
      return have;
    };
    const bool same_sequence = state.global_batch == G_ && state.partitions % W == 0;
    if (state.micro != 0 && (state.world != W || state.micro_batch != options_.micro_batch ||
                             state.global_batch != G_)) {
      return Status::config("loader state was saved after micro-batch " +
                            std::to_string(state.micro) + " of step " + std::to_string(state.step) +
                            "; it continues only on the layout that saved it (dp_world " +
                            std::to_string(state.world) + ", micro_batch " +
                            std::to_string(state.micro_batch) + ")")
          .with_key("micro");
    }
    Placement out;
    if (same_sequence) {
      out.partitions = state.partitions;
      const int64_t k = out.partitions / W, first = options_.dp_rank * k;
      for (int64_t hp = 0; hp < k; ++hp) {
        auto it = by_part.find(first + hp);
        if (it == by_part.end()) {
          return Status::config("rank " + std::to_string(options_.dp_rank) + " of " +
                                std::to_string(W) + " continues partitions [" +
                                std::to_string(first) + ", " + std::to_string(first + k) + ") of " +
                                std::to_string(out.partitions) +
                                "; this state holds partition(s) " + held() +
                                " (give the merged states of all ranks: LoaderState::merge)")
              .with_key("cursors");
        }
        for (size_t d = 0; d < D; ++d) out.cursors.push_back(it->second->domains.at(names_[d]));
      }
      out.own = static_cast<int64_t>(by_part.size()) == k && state.world == W;
      return out;
    }
    if (!options_.repartition) {
      std::string sizes;
      for (int64_t w = 1; w <= state.partitions && sizes.size() < 80; ++w) {
        if (state.partitions % w == 0) sizes += (sizes.empty() ? "" : ", ") + std::to_string(w);
      }
      return Status::config(
                 "loader state was saved with " + std::to_string(state.partitions) +
                 " canonical partitions and global batch " + std::to_string(state.global_batch) +
                 "; this run has dp_world " + std::to_string(W) + " and global batch " +
                 std::to_string(G_) + ". The same sample sequence continues with global batch " +
                 std::to_string(state.global_batch) + " on a data-parallel size dividing " +
                 std::to_string(state.partitions) + " (" + sizes +
                 "); to continue here in another order (no sample repeated or skipped) allow "
                 "repartitioning (data.repartition: true, kiln stream --repartition)")
          .with_key("partitions");
    }
    if (static_cast<int64_t>(by_part.size()) != state.partitions) {
      return Status::config("repartitioning needs the merged states of all " +
                            std::to_string(state.partitions) +
                            " partitions; this state holds partition(s) " + held())
          .with_key("cursors");
    }
    out.partitions = options_.partitions == 0 ? G_ : options_.partitions;
    const int64_t k = out.partitions / W, first = options_.dp_rank * k;
    for (int64_t hp = 0; hp < k; ++hp) {
      for (size_t d = 0; d < D; ++d) {
        std::vector<DomainCursor> old;
        for (const auto& [p, c] : by_part) old.push_back(c->domains.at(names_[d]));
        out.cursors.push_back(loader::detail::reshard_cursor(
            old, static_cast<int>(state.partitions), infos_[d].samples,
            static_cast<int>(out.partitions), static_cast<int>(first + hp)));
      }
    }
    KILN_LOG_WARN(
        "loader: repartitioning {} partitions (global batch {}) onto {} (global batch {}, "
        "dp_world {}): the current epochs continue without a sample repeated or skipped, but "
        "the sample order differs from the run that saved the state",
        state.partitions, state.global_batch, out.partitions, G_, W);
    return out;
  }

  // ---- streams and positions (mu_ held or threads stopped) ----------------------------
  // One stream per hosted partition and domain, from `starts` (same order).
  void reset_streams(const std::vector<DomainCursor>& starts) {
    KILN_CHECK(starts.size() == streams());
    domains_.clear();
    redo_.clear();
    for (size_t i = 0; i < starts.size(); ++i) {
      domains_.push_back(std::make_unique<DomainRt>());
      reset_domain(i, starts[i]);
    }
  }

  void reset_domain(size_t i, const DomainCursor& start) {
    DomainRt& D = *domains_[i];
    const size_t d = i % names_.size();
    const int64_t partition = first_partition() + static_cast<int64_t>(i / names_.size());
    D.info = infos_[d];
    D.initial = start;
    D.planner = std::make_unique<Planner>(D.info, seed_, static_cast<int>(P_),
                                          static_cast<int>(partition), start);
    D.units.clear();
    D.front_seq = 0;
    D.consumer = D.packer = Pos{};
    D.consumer_seqs = D.packer_seqs = start.sequences;
    D.packer_head = 0;
    D.starving = false;
    D.planned_any = false;
    D.last_epoch = D.last_end = 0;
    D.parked.clear();
  }

  DomainCursor consumer_cursor(size_t d) const {
    const DomainRt& D = *domains_[d];
    if (D.consumer.unit >= D.planned_end()) {
      DomainCursor c = D.initial;  // nothing consumed since open / restore
      c.sequences = D.consumer_seqs;
      return c;
    }
    const Unit& u = *D.units[D.consumer.unit - D.front_seq];
    return loader::detail::cursor_at(u.plan, D.consumer.doc, D.consumer.tok, D.consumer_seqs);
  }

  void rewind_locked() {
    ++generation_;
    queue_.clear();
    latched_ = Status::ok();
    packer_failed_ = false;
    packer_step_ = consumer_step_;
    packer_micro_ = consumer_micro_;
    for (auto& dp : domains_) {
      dp->packer = dp->consumer;
      dp->packer_seqs = dp->consumer_seqs;
      dp->packer_head = 0;
      dp->starving = false;
    }
    cv_.notify_all();
  }

  // ---- threads ---------------------------------------------------------------------------
  void start_threads() {
    stop_ = false;
    ++generation_;
    packer_step_ = consumer_step_;
    packer_micro_ = consumer_micro_;
    packer_failed_ = false;
    started_ = false;
    for (int i = 0; i < options_.workers; ++i) {
      threads_.emplace_back([this] { worker_main(false); });
    }
    // Until the first batch is out, the shards that the hosted streams start in are decoded in
    // parallel on up to the cores this rank has (they are all needed at once: a rank hosts P / W
    // streams per domain); these extra workers end with the first batch.
    for (int i = startup_workers(); i > options_.workers; --i) {
      threads_.emplace_back([this] { worker_main(true); });
    }
    threads_.emplace_back([this] { packer_main(); });
  }

  // Decoders until the first batch: the hosted streams, at most this rank's share of the cores
  // (OMPI_COMM_WORLD_LOCAL_SIZE / LOCAL_WORLD_SIZE ranks on the machine), at least `workers`.
  int startup_workers() const {
    int local = 1;
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"}) {
      if (const char* v = std::getenv(name)) {
        local = std::max(1, std::atoi(v));
        break;
      }
    }
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int share = std::max(1, cores / local);
    return std::max(options_.workers,
                    static_cast<int>(std::min<size_t>(static_cast<size_t>(share), streams())));
  }

  void stop_threads() {
    {
      std::unique_lock lk(mu_);
      stop_ = true;
      abort_decode_ = true;  // a worker mid-shard gives up instead of finishing it
      cv_.notify_all();
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
    abort_decode_ = false;
  }

  // Keeps the token buffer of a unit nobody uses any more for the next decode: shard-sized
  // buffers are large, and allocating fresh ones costs page faults on every unit. mu_ held.
  void recycle(std::shared_ptr<Unit> unit) {
    if (unit.use_count() != 1) return;
    const size_t cap = static_cast<size_t>(options_.workers) + 1;
    if (unit->tokens.capacity() > 0 && token_pool_.size() < cap) {
      token_pool_.push_back(std::move(unit->tokens));
    }
    if (unit->tokens16.capacity() > 0 && token16_pool_.size() < cap) {
      token16_pool_.push_back(std::move(unit->tokens16));
    }
  }

  // Picks the stream whose next unit a worker should decode, or -1. mu_ held.
  //
  // Read-ahead is by tokens, not units (a unit can be a whole partition's block of a shard): a
  // stream gets its next unit decoded when what it has decoded ahead of the packer falls below its
  // horizon, about twice what it consumes while one shard of its domain is decoded (its share of
  // the rows times a shard's tokens). So a rank that hosts many streams does not hold, or read
  // before it is needed, a unit ahead for every one of them (the next epoch's block, at the end of
  // an epoch). A stream whose current unit is not planned yet comes first, most urgent first.
  int pick_domain() const {
    const auto& w = history_.at(packer_step_);
    const size_t D = names_.size();
    int active = 0;
    int64_t total_ahead = 0;
    for (size_t i = 0; i < domains_.size(); ++i) {
      const DomainRt& S = *domains_[i];
      if (S.starving) return static_cast<int>(i);
      if (w[i % D] > 0) ++active;
      total_ahead += ahead(S);
    }
    const int64_t per_domain = std::max(1, options_.workers);
    if (total_ahead >= options_.workers + active) return -1;
    int best = -1;
    double best_score = 0;
    for (size_t i = 0; i < domains_.size(); ++i) {
      const DomainRt& S = *domains_[i];
      const double wd = w[i % D];
      if (wd <= 0 || ahead(S) >= per_domain) continue;
      double score = 0;
      if (ahead(S) >= 0) {
        const double horizon =
            2.0 * wd / static_cast<double>(hosted()) * shard_tokens_[i % D] + 1.0;
        const double left = decoded_ahead(S);
        if (left >= horizon) continue;
        score = left / horizon;
      }
      if (best < 0 || score < best_score) {
        best = static_cast<int>(i);
        best_score = score;
      }
    }
    return best;
  }

  // Tokens decoded for stream S from the packer's position on (infinite while one of its planned
  // units is still being decoded). mu_ held.
  static double decoded_ahead(const DomainRt& S) {
    const uint64_t current = std::max(S.packer.unit, S.packer_head);
    double left = 0;
    for (uint64_t seq = std::max(current, S.front_seq); seq < S.planned_end(); ++seq) {
      const Unit& u = *S.units[seq - S.front_seq];
      if (!u.ready) return std::numeric_limits<double>::infinity();
      uint64_t used = 0;
      if (seq == S.packer.unit) {
        used = S.packer.doc < u.docs() ? u.doc_start[S.packer.doc] + S.packer.tok : u.size();
      }
      left += static_cast<double>(u.size() - std::min<uint64_t>(used, u.size()));
    }
    return left;
  }

  // Units planned beyond the one the packer works in.
  static int64_t ahead(const DomainRt& D) {
    const uint64_t current = std::max(D.packer.unit, D.packer_head);
    return static_cast<int64_t>(D.planned_end()) - static_cast<int64_t>(current) - 1;
  }

  // Shard parts parked for one stream at most (a stream needs at most the two ends of its block
  // per epoch, and a neighbour may run an epoch ahead).
  static constexpr size_t kMaxParked = 4;

  // Whether stream D will never plan a unit starting at (epoch, position pos) from scratch: it
  // has planned one at or after it, or (nothing planned since open / restore) its cursor starts
  // after it or inside that document. mu_ held.
  static bool planned_past(const DomainRt& D, uint64_t epoch, uint64_t pos) {
    if (D.planned_any) {
      return D.last_epoch > epoch || (D.last_epoch == epoch && D.last_end > pos);
    }
    for (const auto& iv : D.initial.pending) {
      if (iv.begin >= iv.end) continue;
      return iv.epoch > epoch ||
             (iv.epoch == epoch && (iv.begin > pos || (iv.begin == pos && iv.skip_tokens > 0)));
    }
    return D.initial.next_epoch > epoch;
  }

  // Whether `part` (filled for a sibling) holds exactly what unit u plans.
  static bool same_part(const Unit& part, const Unit& u) {
    const loader::detail::UnitPlan &qp = part.plan, &p = u.plan;
    return p.skip_tokens == 0 && qp.epoch == p.epoch && qp.shard == p.shard &&
           qp.pos_begin == p.pos_begin && qp.pos_end == p.pos_end;
  }
  static void take_decoded(Unit* from, Unit* to) {
    to->narrow = from->narrow;
    to->tokens = std::move(from->tokens);
    to->tokens16 = std::move(from->tokens16);
    to->doc_start = std::move(from->doc_start);
    to->loss = std::move(from->loss);
    to->ids = std::move(from->ids);
  }

  // Takes the parked decode of exactly u's plan, if any, into u; drops parked parts the stream
  // has gone past (plans come in increasing (epoch, position) order). mu_ held.
  static bool adopt_parked(DomainRt& D, Unit* u) {
    const loader::detail::UnitPlan& p = u->plan;
    bool adopted = false;
    for (auto it = D.parked.begin(); it != D.parked.end();) {
      Unit& q = **it;
      const loader::detail::UnitPlan& qp = q.plan;
      if (!adopted && same_part(q, *u)) {
        take_decoded(&q, u);
        adopted = true;
        it = D.parked.erase(it);
      } else if (qp.epoch < p.epoch || (qp.epoch == p.epoch && qp.pos_begin < p.pos_end)) {
        it = D.parked.erase(it);
      } else {
        ++it;
      }
    }
    return adopted;
  }

  // The parts of `plan`'s shard (same epoch) that the rank's other streams of the same domain
  // read in their regular blocks and have not planned yet: decoded with `plan`'s unit from one
  // read, so two adjacent partitions of this rank do not both decompress the shard between their
  // blocks. Returns (stream, unit to fill). mu_ held.
  std::vector<std::pair<size_t, std::shared_ptr<Unit>>> sibling_units(
      size_t d, const loader::detail::UnitPlan& plan) {
    std::vector<std::pair<size_t, std::shared_ptr<Unit>>> out;
    const size_t D = names_.size();
    const int64_t k = hosted();
    if (k <= 1) return out;
    const DomainInfo& info = domains_[d]->info;
    std::unique_ptr<loader::detail::EpochOrder> order;
    size_t shard_k = 0;
    std::vector<uint32_t> members;
    for (int64_t h = 0; h < k; ++h) {
      const size_t j = static_cast<size_t>(h) * D + d % D;
      if (j == d) continue;
      const loader::detail::Block b =
          loader::detail::rank_block(info.samples, static_cast<uint64_t>(P_),
                                     static_cast<uint64_t>(first_partition() + h), plan.epoch);
      if (!order) {
        order = std::make_unique<loader::detail::EpochOrder>(seed_, info.name, plan.epoch,
                                                             info.shard_ids, info.shard_samples);
        shard_k = order->shard_at(plan.pos_begin);
        members = order->members(shard_k);
      }
      const uint64_t s0 = order->shard_start(shard_k);
      const uint64_t lo = std::max(b.begin, s0), hi = std::min(b.end, order->shard_end(shard_k));
      const DomainRt& J = *domains_[j];
      if (lo >= hi || planned_past(J, plan.epoch, lo) || J.parked.size() >= kMaxParked) continue;
      // After a repartition a stream's pending intervals may cross other blocks: never the same
      // samples twice in one read.
      if (lo < plan.pos_end && plan.pos_begin < hi) continue;
      auto same_read = [&](const Unit& q) {
        return q.plan.epoch == plan.epoch && q.plan.shard == plan.shard;
      };
      const bool parked = std::any_of(J.parked.begin(), J.parked.end(),
                                      [&](const auto& q) { return same_read(*q); });
      const bool filling = std::any_of(J.inflight.begin(), J.inflight.end(),
                                       [&](const auto& f) { return same_read(*f.part); });
      if (parked || filling) continue;
      auto u = std::make_shared<Unit>();
      u->plan.epoch = plan.epoch;
      u->plan.shard = plan.shard;
      u->plan.pos_begin = lo;
      u->plan.pos_end = hi;
      u->plan.members.assign(members.begin() + (lo - s0), members.begin() + (hi - s0));
      out.emplace_back(j, std::move(u));
    }
    return out;
  }

  // startup: an extra worker that ends once the first batch is queued (start_threads).
  void worker_main(bool startup) {
    std::unique_lock lk(mu_);
    while (true) {
      int d = -1;
      cv_.wait(lk, [&] {
        return stop_ || (startup && started_) || !redo_.empty() || (d = pick_domain()) >= 0;
      });
      if (stop_ || (startup && started_)) return;
      std::shared_ptr<Unit> unit;
      if (!redo_.empty()) {
        // A unit that waited on another worker's read, which failed: decoded here on its own.
        d = redo_.front().first;
        unit = std::move(redo_.front().second);
        redo_.pop_front();
      } else {
        DomainRt& D = *domains_[d];
        unit = std::make_shared<Unit>();
        unit->plan = D.planner->next();
        D.units.push_back(unit);
        D.planned_any = true;
        D.last_epoch = unit->plan.epoch;
        D.last_end = unit->plan.pos_end;
        if (D.starving && D.planned_end() > std::max(D.packer.unit, D.packer_head)) {
          D.starving = false;
        }
        if (adopt_parked(D, unit.get())) {
          unit->ready = true;
          cv_.notify_all();
          continue;
        }
        auto fill = std::find_if(D.inflight.begin(), D.inflight.end(), [&](const auto& f) {
          return !f.waiter && same_part(*f.part, *unit);
        });
        if (fill != D.inflight.end()) {
          fill->waiter = unit;  // another worker is reading exactly this part
          continue;
        }
      }
      const bool known_bad = bad_shards_.count(unit->plan.shard) > 0;
      std::vector<std::pair<size_t, std::shared_ptr<Unit>>> siblings;
      if (!known_bad) siblings = sibling_units(static_cast<size_t>(d), unit->plan);
      if (!token_pool_.empty()) {
        unit->tokens = std::move(token_pool_.back());
        token_pool_.pop_back();
      }
      if (!token16_pool_.empty()) {
        unit->tokens16 = std::move(token16_pool_.back());
        token16_pool_.pop_back();
      }
      for (auto& [j, u] : siblings) domains_[j]->inflight.push_back({u, nullptr});
      lk.unlock();
      if (known_bad) {
        unit->skipped = true;
      } else {
        std::vector<Unit*> sib;
        for (auto& [j, u] : siblings) sib.push_back(u.get());
        loader::detail::decode_unit(manifest_, decode_options_, abort_decode_, unit.get(), sib);
      }
      lk.lock();
      // The siblings' parts: to the unit that waits for one, else parked for later.
      for (auto& [j, u] : siblings) {
        DomainRt& J = *domains_[j];
        auto it = std::find_if(J.inflight.begin(), J.inflight.end(),
                               [&](const auto& f) { return f.part == u; });
        KILN_CHECK(it != J.inflight.end());
        std::shared_ptr<Unit> waiter = std::move(it->waiter);
        J.inflight.erase(it);
        const bool ok = unit->status.is_ok() && u->status.is_ok();
        if (waiter && ok) {
          take_decoded(u.get(), waiter.get());
          waiter->ready = true;
        } else if (waiter) {
          redo_.emplace_back(static_cast<int>(j), std::move(waiter));
        } else if (ok && !planned_past(J, u->plan.epoch, u->plan.pos_begin) &&
                   J.parked.size() < kMaxParked) {
          J.parked.push_back(std::move(u));
        }
      }
      if (!unit->status.is_ok() && options_.skip_bad_shards && !known_bad) {
        const auto& sh = manifest_.shards[unit->plan.shard];
        KILN_LOG_WARN("loader: skipping bad shard {} (skip_bad_shards): {}", sh.path,
                      unit->status.to_string());
        bad_shards_.insert(unit->plan.shard);
        unit->status = Status::ok();
        unit->skipped = true;
        unit->tokens = {};
        unit->tokens16 = {};
        unit->doc_start.clear();
        unit->loss.clear();
        unit->ids.clear();
      }
      if (unit->skipped) {
        const size_t domain = static_cast<size_t>(d) % names_.size();
        const auto& shard_ids = infos_[domain].shard_ids;
        const bool all_bad = std::all_of(shard_ids.begin(), shard_ids.end(),
                                         [&](uint32_t s) { return bad_shards_.count(s) > 0; });
        if (all_bad) {
          unit->status =
              Status::data("every shard of domain '" + names_[domain] + "' is unreadable");
        }
      }
      if (!known_bad) ++shards_read_;
      tar_bytes_ += unit->tar_bytes;
      unit->ready = true;
      cv_.notify_all();
    }
  }

  // The unit `seq` of domain d once decoded; nullptr when the batch must be abandoned (stop or
  // rewind). mu_ must not be held.
  std::shared_ptr<Unit> get_unit(int d, uint64_t seq, uint64_t gen) {
    std::unique_lock lk(mu_);
    while (true) {
      if (stop_ || gen != generation_) return nullptr;
      DomainRt& D = *domains_[d];
      KILN_CHECK(seq >= D.front_seq, "a unit needed by the packer was released");
      D.packer_head = std::max(D.packer_head, seq);
      if (seq < D.planned_end()) {
        auto u = D.units[seq - D.front_seq];
        if (u->ready) return u;
      } else if (!D.starving) {
        D.starving = true;
        cv_.notify_all();
      }
      cv_.wait(lk);
    }
  }

  // Builds micro-batch `micro` of global step `step` from the given stream positions (copies of
  // the packer's). Returns false when abandoned. Runs without mu_ except inside get_unit().
  bool build(uint64_t gen, int64_t step, int64_t micro, const std::vector<double>& w,
             std::vector<Pos>* pos, std::vector<uint64_t>* seqs, Prepared* out) {
    const int64_t rows = options_.micro_batch;
    const int64_t width = options_.seq_len + 1;
    const int64_t k = hosted();
    const size_t D = names_.size();
    Batch& b = out->batch;
    b.step = step;
    b.micro = micro;
    b.micro_batch = rows;
    b.seq_len = options_.seq_len;
    b.tokens.resize(rows * width);
    b.loss_mask.resize(rows * width);
    b.domains.resize(rows);
    b.global_rows.resize(rows);
    b.docs.assign(rows, {});
    out->rows.resize(rows);
    std::vector<std::shared_ptr<const Unit>> current(domains_.size());
    for (int64_t r = 0; r < rows; ++r) {
      // The rank's l-th row of the step: round l / k over the partitions, hosted partition l % k.
      const int64_t l = micro * rows + r;
      const int64_t hp = l % k;
      const int64_t j = (l / k) * P_ + first_partition() + hp;
      const int d = loader::detail::choose_domain(
          w, seed_, static_cast<uint64_t>(step) * static_cast<uint64_t>(G_) + j);
      const size_t i = static_cast<size_t>(hp) * D + d;
      b.domains[r] = d;
      b.global_rows[r] = j;
      Pos& p = (*pos)[i];
      auto fetch = [&](uint64_t seq) -> std::shared_ptr<const Unit> {
        return get_unit(static_cast<int>(i), seq, gen);
      };
      const FillResult filled =
          loader::detail::fill_row(fetch, &current[i], &p, width, b.tokens.data() + r * width,
                                   &b.docs[r], &out->status, b.loss_mask.data() + r * width);
      if (filled == FillResult::kAbandoned) return false;
      if (filled == FillResult::kFailed) return true;
      ++(*seqs)[i];
      out->rows[r] = {static_cast<int>(i), p, (*seqs)[i]};
    }
    b.has_masks = std::find(b.loss_mask.begin(), b.loss_mask.end(), 0) != b.loss_mask.end();
    return true;
  }

  void packer_main() {
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] {
        return stop_ || (!packer_failed_ &&
                         queue_.size() < static_cast<size_t>(options_.prefetch_depth));
      });
      if (stop_) return;
      const uint64_t gen = generation_;
      const int64_t step = packer_step_;
      const int64_t micro = packer_micro_;
      const std::vector<double> w = history_.at(step);
      std::vector<Pos> pos;
      std::vector<uint64_t> seqs;
      for (auto& dp : domains_) {
        pos.push_back(dp->packer);
        seqs.push_back(dp->packer_seqs);
      }
      lk.unlock();
      Prepared p;
      const bool done = build(gen, step, micro, w, &pos, &seqs, &p);
      lk.lock();
      if (!done || stop_ || gen != generation_) continue;
      if (!p.status.is_ok()) {
        packer_failed_ = true;
      } else {
        for (size_t i = 0; i < domains_.size(); ++i) {
          domains_[i]->packer = pos[i];
          domains_[i]->packer_seqs = seqs[i];
          domains_[i]->packer_head = 0;
        }
        if (++packer_micro_ == accumulation()) {
          ++packer_step_;
          packer_micro_ = 0;
        }
      }
      queue_.push_back(std::move(p));
      started_ = true;
      cv_.notify_all();
    }
  }

  Manifest manifest_;
  LoaderOptions options_;
  uint32_t eos_ = 0;
  std::vector<std::string> names_;
  std::vector<DomainInfo> infos_;
  std::vector<double> shard_tokens_;  // per domain: packed tokens of an average shard
  uint64_t fingerprint_ = 0;
  uint64_t seed_ = 0;
  int64_t G_ = 1;  // global batch: rows per step over all ranks
  int64_t P_ = 1;  // canonical partitions

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  std::atomic<bool> abort_decode_{false};
  uint64_t generation_ = 0;

  WeightsHistory history_{std::vector<std::string>()};
  DecodeOptions decode_options_;
  std::deque<Prepared> queue_;
  std::vector<std::vector<uint32_t>> token_pool_;    // recycled Unit::tokens buffers
  std::vector<std::vector<uint16_t>> token16_pool_;  // recycled Unit::tokens16 buffers
  bool packer_failed_ = false;
  bool started_ = false;  // a batch was queued since the threads started (startup workers end)
  Status latched_;
  int64_t consumer_step_ = 0, packer_step_ = 0;     // global steps
  int64_t consumer_micro_ = 0, packer_micro_ = 0;   // micro-batches into that step
  std::vector<std::unique_ptr<DomainRt>> domains_;  // streams: hosted partition-major, domain
  // Planned units whose sibling read failed: (stream, unit), decoded by the next free worker.
  std::deque<std::pair<int, std::shared_ptr<Unit>>> redo_;

  std::set<uint32_t> bad_shards_;
  uint64_t skipped_before_ = 0;
  uint64_t shards_read_ = 0;
  uint64_t tar_bytes_ = 0;
  uint64_t tokens_emitted_ = 0;
  double wait_total_ = 0;
  double last_wait_ms_ = 0;
};

}  // namespace

Result<std::unique_ptr<Loader>> Loader::open(Manifest manifest, LoaderOptions options) {
  Manifest split = select_split(manifest, options.val_split);
  auto impl = std::make_unique<LoaderImpl>(std::move(split), std::move(options));
  KILN_RETURN_IF_ERROR(impl->init());
  return std::unique_ptr<Loader>(std::move(impl));
}

Result<std::unique_ptr<Loader>> Loader::open(const std::string& manifest_path,
                                             LoaderOptions options) {
  KILN_ASSIGN_OR_RETURN(Manifest m, read_manifest(manifest_path));
  return open(std::move(m), std::move(options));
}

}  // namespace kiln::loader
