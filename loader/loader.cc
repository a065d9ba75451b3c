// The Loader implementation. Structure (see docs/LOADER.md):
//
//   Planner (per domain)  — turns the domain's cursor (pending intervals of shuffled epoch orders,
//                           then this rank's regular parts of later epochs) into "units": the
//                           members of one shard that one epoch's order visits consecutively.
//   workers               — decode planned units: read the shard, check it, widen the token ids,
//                           append eos after every document (the packed token stream).
//   packer thread         — assembles batches ahead into a bounded queue: picks each slot's domain
//                           from the shared mixture sequence and cuts the next seq_len + 1 tokens
//                           of that domain's packed stream.
//   consumer              — next_batch() pops a batch and moves the consumed positions forward.
//
// Per domain, the units from the consumer's position on stay in memory (a deque), so
// set_weights() can drop the prefetched batches and rewind the packer to the consumer's position
// without reading anything again. Positions are (unit, document, token) triples; state() turns the
// consumer's positions into serialisable cursors using the unit's plan.
#include "loader/loader.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "common/hash.h"
#include "common/log.h"
#include "common/npy.h"
#include "common/shard.h"
#include "loader/order.h"
#include "loader/reshard.h"

namespace kiln {

namespace {

using loader_internal::EpochOrder;
using Interval = LoaderState::Interval;
using DomainCursor = LoaderState::DomainCursor;

struct DomainInfo {
  std::string name;
  std::vector<uint32_t> shard_ids;      // manifest indices, manifest order
  std::vector<uint64_t> shard_samples;  // per shard
  uint64_t samples = 0;
  uint64_t tokens = 0;
};

// One shard's worth of one epoch's order: what a worker reads in one go.
struct UnitPlan {
  uint64_t seq = 0;  // per-domain sequence number (0 after open / restore)
  uint64_t epoch = 0;
  uint32_t shard = 0;  // manifest index
  uint64_t pos_begin = 0, pos_end = 0;  // positions in the epoch order
  uint64_t skip_tokens = 0;             // already emitted tokens of the first member
  std::vector<uint32_t> members;        // tar-order sample indices, in visiting order
  // Enough to turn a position inside this unit back into a DomainCursor:
  uint64_t interval_end = 0;  // end of the pending interval this unit is cut from
  std::shared_ptr<const std::vector<Interval>> rest;  // pending intervals after that one
  uint64_t next_epoch = 0;                             // the regular epoch after `rest`
};

struct Unit {
  UnitPlan plan;
  bool ready = false;
  bool skipped = false;  // a bad shard skipped under skip_bad_shards: no documents
  Status status;
  std::vector<uint32_t> tokens;     // packed: every document's tokens then eos
  std::vector<uint64_t> doc_start;  // offsets into tokens, size docs + 1
  std::vector<std::string> ids;     // raw JSON ids (sample_ids only)
  uint64_t tar_bytes = 0;
  size_t docs() const { return doc_start.empty() ? 0 : doc_start.size() - 1; }
};

// Cursor -> units.
class Planner {
 public:
  Planner(const DomainInfo& info, uint64_t seed, int world, int rank, DomainCursor start)
      : info_(info), seed_(seed), world_(world), rank_(rank) {
    for (const auto& iv : start.pending) {
      if (iv.begin < iv.end) queue_.push_back(iv);
    }
    next_epoch_ = start.next_epoch;
  }

  UnitPlan next() {
    KILN_CHECK(info_.samples > 0, "planning a unit of an empty domain");
    while (!have_cur_) {
      if (queue_.empty()) {
        // With samples < world some parts are empty; rotation gives every rank a non-empty
        // part within `world` epochs.
        for (int guard = 0; queue_.empty(); ++guard) {
          KILN_CHECK(guard <= world_ + 1);
          const auto b = loader_internal::rank_block(info_.samples, world_, rank_, next_epoch_);
          if (b.begin < b.end) queue_.push_back({next_epoch_, b.begin, b.end, 0});
          ++next_epoch_;
        }
      }
      cur_ = queue_.front();
      queue_.pop_front();
      if (cur_.begin >= cur_.end) continue;
      cur_rest_ = std::make_shared<const std::vector<Interval>>(queue_.begin(), queue_.end());
      cur_next_epoch_ = next_epoch_;
      have_cur_ = true;
    }
    const EpochOrder& order = order_for(cur_.epoch);
    const size_t k = order.shard_at(cur_.begin);
    const uint64_t start = order.shard_start(k);
    const uint64_t end = std::min(cur_.end, order.shard_end(k));
    if (k != members_k_ || cur_.epoch != members_epoch_) {
      members_ = order.members(k);
      members_k_ = k;
      members_epoch_ = cur_.epoch;
    }
    UnitPlan plan;
    plan.seq = seq_++;
    plan.epoch = cur_.epoch;
    plan.shard = order.shard_id(k);
    plan.pos_begin = cur_.begin;
    plan.pos_end = end;
    plan.skip_tokens = cur_.skip_tokens;
    plan.members.assign(members_.begin() + (cur_.begin - start), members_.begin() + (end - start));
    plan.interval_end = cur_.end;
    plan.rest = cur_rest_;
    plan.next_epoch = cur_next_epoch_;
    cur_.begin = end;
    cur_.skip_tokens = 0;
    if (cur_.begin == cur_.end) have_cur_ = false;
    return plan;
  }

 private:
  const EpochOrder& order_for(uint64_t epoch) {
    if (!order_ || order_->epoch() != epoch) {
      order_ = std::make_unique<EpochOrder>(seed_, info_.name, epoch, info_.shard_ids,
                                            info_.shard_samples);
      members_k_ = SIZE_MAX;
    }
    return *order_;
  }

  const DomainInfo& info_;
  uint64_t seed_;
  int world_, rank_;
  std::deque<Interval> queue_;
  uint64_t next_epoch_ = 0;
  bool have_cur_ = false;
  Interval cur_;
  std::shared_ptr<const std::vector<Interval>> cur_rest_;
  uint64_t cur_next_epoch_ = 0;
  uint64_t seq_ = 0;
  std::unique_ptr<EpochOrder> order_;
  std::vector<uint32_t> members_;
  size_t members_k_ = SIZE_MAX;
  uint64_t members_epoch_ = 0;
};

// The cursor of the position (document `doc`, token `tok` of the stored tokens) in unit `plan`.
DomainCursor cursor_at(const UnitPlan& plan, uint64_t doc, uint64_t tok, uint64_t sequences) {
  DomainCursor c;
  c.next_epoch = plan.next_epoch;
  c.sequences = sequences;
  const uint64_t pos = plan.pos_begin + doc;
  if (pos < plan.interval_end) {
    c.pending.push_back({plan.epoch, pos, plan.interval_end, (doc == 0 ? plan.skip_tokens : 0) + tok});
  }
  c.pending.insert(c.pending.end(), plan.rest->begin(), plan.rest->end());
  return c;
}

struct Pos {
  uint64_t unit = 0;  // unit seq
  uint64_t doc = 0;   // document index within the unit
  uint64_t tok = 0;   // offset into the document's stored tokens
};

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

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
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
    if (o.prefetch_depth < 1) {
      return Status::config("prefetch_depth must be >= 1").with_key("prefetch_depth");
    }
    if (o.workers < 1) return Status::config("workers must be >= 1").with_key("workers");
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
    fingerprint_ = dataset_fingerprint(manifest_);
    seed_ = o.seed;

    std::vector<double> w;
    if (o.weights.empty()) {
      w = default_weights();
    } else {
      KILN_ASSIGN_OR_RETURN(w, normalise(o.weights));
    }
    history_.push_back({0, to_map(w)});
    history_w_.push_back(w);

    for (size_t d = 0; d < names_.size(); ++d) {
      DomainCursor start;  // a fresh run: this rank's part of epoch 0 onwards
      domains_.push_back(std::make_unique<DomainRt>());
      reset_domain(d, start);
    }
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
    ++consumer_step_;
    consumer_mix_ += static_cast<uint64_t>(options_.micro_batch);
    tokens_emitted_ += p.batch.tokens.size();
    cv_.notify_all();
    p.batch.wait_ms = waited;
    return std::move(p.batch);
  }

  Status set_weights(const DomainWeights& weights) override {
    KILN_ASSIGN_OR_RETURN(std::vector<double> w, normalise(weights));
    std::unique_lock lk(mu_);
    while (!history_.empty() && history_.back().step >= consumer_step_) {
      history_.pop_back();
      history_w_.pop_back();
    }
    history_.push_back({consumer_step_, to_map(w)});
    history_w_.push_back(std::move(w));
    rewind_locked();
    return Status::ok();
  }

  DomainWeights weights() const override {
    std::unique_lock lk(mu_);
    return to_map(weights_at(consumer_step_));
  }

  LoaderState state() const override {
    std::unique_lock lk(mu_);
    LoaderState s;
    s.dataset = fingerprint_;
    s.seed = seed_;
    s.world = options_.dp_world;
    s.step = consumer_step_;
    s.mix_index = consumer_mix_;
    s.weights_history = history_;
    s.skipped_shards = bad_shards_.size() + skipped_before_;
    LoaderState::RankCursor rc;
    rc.rank = options_.dp_rank;
    for (size_t d = 0; d < domains_.size(); ++d) rc.domains[names_[d]] = consumer_cursor(d);
    s.ranks.push_back(std::move(rc));
    return s;
  }

  Status restore(const LoaderState& state) override {
    if (state.dataset != fingerprint_) {
      return Status::config("loader state was saved for a different dataset (fingerprint " +
                            hex64(state.dataset) + ", this manifest " + hex64(fingerprint_) + ")")
          .with_key("dataset");
    }
    for (const auto& r : state.ranks) {
      if (r.domains.size() != names_.size() ||
          !std::all_of(names_.begin(), names_.end(),
                       [&](const std::string& n) { return r.domains.count(n) > 0; })) {
        return Status::config("loader state's domains differ from the manifest's")
            .with_key("ranks[" + std::to_string(r.rank) + "].domains");
      }
    }
    // This rank's cursor per domain.
    std::vector<DomainCursor> cursors(names_.size());
    const LoaderState::RankCursor* own = nullptr;
    for (const auto& r : state.ranks) {
      if (r.rank == options_.dp_rank) own = &r;
    }
    if (state.world == options_.dp_world && own != nullptr) {
      for (size_t d = 0; d < names_.size(); ++d) cursors[d] = own->domains.at(names_[d]);
    } else {
      if (static_cast<int>(state.ranks.size()) != state.world) {
        std::string have;
        for (const auto& r : state.ranks) {
          if (!have.empty()) have.push_back(',');
          have.append(std::to_string(r.rank));
        }
        return Status::config("restoring a state of world size " + std::to_string(state.world) +
                              " as rank " + std::to_string(options_.dp_rank) + " of " +
                              std::to_string(options_.dp_world) +
                              " needs the merged states of all " + std::to_string(state.world) +
                              " ranks (LoaderState::merge); this one holds rank(s) " + have)
            .with_key("ranks");
      }
      std::vector<const LoaderState::RankCursor*> by_rank(state.world, nullptr);
      for (const auto& r : state.ranks) by_rank[r.rank] = &r;
      for (size_t d = 0; d < names_.size(); ++d) {
        std::vector<DomainCursor> old;
        for (const auto* r : by_rank) old.push_back(r->domains.at(names_[d]));
        cursors[d] = loader_internal::reshard_cursor(old, state.world, infos_[d].samples,
                                                     options_.dp_world, options_.dp_rank);
      }
    }
    for (size_t d = 0; d < names_.size(); ++d) {
      for (const auto& iv : cursors[d].pending) {
        if (iv.end > infos_[d].samples) {
          return Status::config("loader state position " + std::to_string(iv.end) +
                                " is past the " + std::to_string(infos_[d].samples) +
                                " samples of domain '" + names_[d] + "'")
              .with_key("ranks.domains." + names_[d]);
        }
      }
    }
    std::vector<LoaderState::WeightChange> history;
    std::vector<std::vector<double>> history_w;
    for (const auto& h : state.weights_history) {
      KILN_ASSIGN_OR_RETURN(auto w, normalise(h.weights));
      history.push_back({h.step, to_map(w)});
      history_w.push_back(std::move(w));
    }
    if (history.empty() || history.front().step != 0) {
      history.insert(history.begin(), {0, to_map(history_w_.front())});
      history_w.insert(history_w.begin(), history_w_.front());
    }

    stop_threads();
    if (state.seed != options_.seed) {
      KILN_LOG_INFO("loader: restoring with the state's seed {} (options said {})", state.seed,
                    options_.seed);
    }
    seed_ = state.seed;
    history_ = std::move(history);
    history_w_ = std::move(history_w);
    consumer_step_ = packer_step_ = state.step;
    consumer_mix_ = packer_mix_ = state.mix_index;
    skipped_before_ = state.world == options_.dp_world && own ? state.skipped_shards : 0;
    bad_shards_.clear();
    shards_read_ = 0;
    tar_bytes_ = 0;
    queue_.clear();
    latched_ = Status::ok();
    for (size_t d = 0; d < names_.size(); ++d) reset_domain(d, cursors[d]);
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
    for (size_t d = 0; d < domains_.size(); ++d) {
      const DomainCursor c = consumer_cursor(d);
      s.domains.push_back({names_[d], c.pending.empty() ? c.next_epoch : c.pending.front().epoch,
                           c.sequences});
    }
    s.step = consumer_step_;
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

  DomainWeights to_map(const std::vector<double>& w) const {
    DomainWeights m;
    for (size_t d = 0; d < w.size(); ++d) m.set(names_[d], w[d]);
    return m;
  }

  const std::vector<double>& weights_at(int64_t step) const {
    size_t i = 0;
    while (i + 1 < history_.size() && history_[i + 1].step <= step) ++i;
    return history_w_[i];
  }

  // The mixture decision for slot `index`: the same on every rank.
  int choose_domain(const std::vector<double>& w, uint64_t index) const {
    const double u = loader_internal::mix_uniform(seed_, index);
    double acc = 0;
    int last = -1;
    for (size_t d = 0; d < w.size(); ++d) {
      if (w[d] <= 0) continue;
      last = static_cast<int>(d);
      acc += w[d];
      if (u < acc) return last;
    }
    return last;
  }

  // ---- domains and positions (mu_ held or threads stopped) ----------------------------
  void reset_domain(size_t d, const DomainCursor& start) {
    DomainRt& D = *domains_[d];
    D.info = infos_[d];
    D.initial = start;
    D.planner = std::make_unique<Planner>(infos_[d], seed_, options_.dp_world, options_.dp_rank,
                                          start);
    D.units.clear();
    D.front_seq = 0;
    D.consumer = D.packer = Pos{};
    D.consumer_seqs = D.packer_seqs = start.sequences;
    D.packer_head = 0;
    D.starving = false;
  }

  DomainCursor consumer_cursor(size_t d) const {
    const DomainRt& D = *domains_[d];
    if (D.consumer.unit >= D.planned_end()) {
      DomainCursor c = D.initial;  // nothing consumed since open / restore
      c.sequences = D.consumer_seqs;
      return c;
    }
    const Unit& u = *D.units[D.consumer.unit - D.front_seq];
    return cursor_at(u.plan, D.consumer.doc, D.consumer.tok, D.consumer_seqs);
  }

  void rewind_locked() {
    ++generation_;
    queue_.clear();
    latched_ = Status::ok();
    packer_failed_ = false;
    packer_step_ = consumer_step_;
    packer_mix_ = consumer_mix_;
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
    packer_mix_ = consumer_mix_;
    packer_failed_ = false;
    for (int i = 0; i < options_.workers; ++i) threads_.emplace_back([this] { worker_main(); });
    threads_.emplace_back([this] { packer_main(); });
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
    if (unit.use_count() != 1 || unit->tokens.capacity() == 0) return;
    if (token_pool_.size() >= static_cast<size_t>(options_.workers) + 1) return;
    token_pool_.push_back(std::move(unit->tokens));
  }

  // Picks the domain whose next unit a worker should decode, or -1. mu_ held.
  int pick_domain() const {
    const auto& w = weights_at(packer_step_);
    int active = 0;
    int64_t total_ahead = 0;
    for (size_t d = 0; d < domains_.size(); ++d) {
      const DomainRt& D = *domains_[d];
      if (D.starving) return static_cast<int>(d);
      if (w[d] > 0) ++active;
      total_ahead += ahead(D);
    }
    const int64_t per_domain = std::max(1, options_.workers);
    if (total_ahead >= options_.workers + active) return -1;
    int best = -1;
    double best_score = 0;
    for (size_t d = 0; d < domains_.size(); ++d) {
      const DomainRt& D = *domains_[d];
      if (w[d] <= 0 || ahead(D) >= per_domain) continue;
      const double score = static_cast<double>(ahead(D) + 1) / w[d];
      if (best < 0 || score < best_score) {
        best = static_cast<int>(d);
        best_score = score;
      }
    }
    return best;
  }

  // Units planned beyond the one the packer works in.
  static int64_t ahead(const DomainRt& D) {
    const uint64_t current = std::max(D.packer.unit, D.packer_head);
    return static_cast<int64_t>(D.planned_end()) - static_cast<int64_t>(current) - 1;
  }

  void worker_main() {
    std::unique_lock lk(mu_);
    while (true) {
      int d = -1;
      cv_.wait(lk, [&] { return stop_ || (d = pick_domain()) >= 0; });
      if (stop_) return;
      DomainRt& D = *domains_[d];
      auto unit = std::make_shared<Unit>();
      unit->plan = D.planner->next();
      D.units.push_back(unit);
      if (D.starving && D.planned_end() > std::max(D.packer.unit, D.packer_head)) {
        D.starving = false;
      }
      const bool known_bad = bad_shards_.count(unit->plan.shard) > 0;
      if (!token_pool_.empty()) {
        unit->tokens = std::move(token_pool_.back());
        token_pool_.pop_back();
      }
      lk.unlock();
      if (known_bad) {
        unit->skipped = true;
      } else {
        decode(unit.get());
      }
      lk.lock();
      if (!unit->status.is_ok() && options_.skip_bad_shards && !known_bad) {
        const auto& sh = manifest_.shards[unit->plan.shard];
        KILN_LOG_WARN("loader: skipping bad shard {} (skip_bad_shards): {}", sh.path,
                      unit->status.to_string());
        bad_shards_.insert(unit->plan.shard);
        unit->status = Status::ok();
        unit->skipped = true;
        unit->tokens = {};
        unit->doc_start.clear();
        unit->ids.clear();
      }
      if (unit->skipped) {
        const auto& shard_ids = infos_[d].shard_ids;
        const bool all_bad = std::all_of(shard_ids.begin(), shard_ids.end(),
                                         [&](uint32_t s) { return bad_shards_.count(s) > 0; });
        if (all_bad) {
          unit->status = Status::data("every shard of domain '" + names_[d] + "' is unreadable");
        }
      }
      if (!known_bad) ++shards_read_;
      tar_bytes_ += unit->tar_bytes;
      unit->ready = true;
      cv_.notify_all();
    }
  }

  // Reads one unit's shard and packs the chosen members. Runs without mu_.
  void decode(Unit* unit) const {
    const UnitPlan& plan = unit->plan;
    const ManifestShard& sh = manifest_.shards[plan.shard];
    const std::string path = manifest_.shard_path(sh);
    auto fail = [&](Status st) {
      // Name the shard once (the shard reader's own errors already do).
      if (st.to_string().find(path) == std::string::npos) {
        unit->status = std::move(st).prefixed("shard '" + path + "'");
      } else {
        unit->status = std::move(st);
      }
    };
    ShardReaderOptions ro;
    if (options_.verify_checksums) ro.expected_xxh3 = sh.xxh3;
    auto reader = ShardReader::open(path, ro);
    if (!reader) return fail(std::move(reader).take_status());

    std::vector<int32_t> slot_of(sh.samples, -1);
    for (size_t i = 0; i < plan.members.size(); ++i) slot_of[plan.members[i]] = static_cast<int32_t>(i);
    std::vector<std::string> npy(plan.members.size());
    std::vector<std::string> keys(plan.members.size());
    if (options_.sample_ids) unit->ids.assign(plan.members.size(), std::string());
    ShardSample sample;
    uint64_t index = 0;
    while (true) {
      if (abort_decode_.load(std::memory_order_relaxed)) {
        unit->status = Status::internal("loader stopped");
        return;
      }
      auto more = (*reader)->next(&sample);
      if (!more) return fail(std::move(more).take_status());
      if (!*more) break;
      if (index >= sh.samples) {
        return fail(Status::data("holds more samples than the manifest's " +
                                 std::to_string(sh.samples)));
      }
      const int32_t slot = slot_of[index++];
      if (slot < 0) continue;
      keys[slot] = sample.key;
      for (auto& m : sample.members) {
        if (m.ext == "tokens.npy") npy[slot] = std::move(m.data);
      }
      if (!sample.find("tokens.npy")) {
        return fail(Status::data("member '" + sample.key + ".tokens.npy' is missing"));
      }
      if (options_.sample_ids) {
        const ShardMember* js = sample.find("json");
        if (!js) return fail(Status::data("member '" + sample.key + ".json' is missing"));
        try {
          auto j = nlohmann::json::parse(js->data);
          auto it = j.find("id");
          if (!j.is_object() || it == j.end() || !(it->is_string() || it->is_number())) {
            return fail(Status::data("member '" + sample.key +
                                     ".json': no \"id\" (string or number)"));
          }
          unit->ids[slot] = it->dump();
        } catch (const nlohmann::json::exception& e) {
          return fail(Status::data("member '" + sample.key + ".json' is not valid JSON: " +
                                   e.what()));
        }
      }
    }
    unit->tar_bytes = (*reader)->tar_bytes();
    if (index != sh.samples) {
      return fail(Status::data("holds " + std::to_string(index) + " samples, the manifest says " +
                               std::to_string(sh.samples)));
    }
    // Pack: widen to uint32, append eos after every document.
    const uint64_t vocab = manifest_.tokenizer.vocab_size;
    std::vector<NpyView> views(npy.size());
    uint64_t total = 0;
    for (size_t i = 0; i < npy.size(); ++i) {
      auto v = npy_parse(npy[i]);
      if (!v) {
        return fail(std::move(v).take_status().prefixed("member '" + keys[i] + ".tokens.npy'"));
      }
      views[i] = *v;
      total += v->size + 1;
    }
    if (!views.empty() && plan.skip_tokens >= views[0].size + 1) {
      return fail(Status::config("the loader state's position (" +
                                 std::to_string(plan.skip_tokens) + " tokens into '" + keys[0] +
                                 "') is past that document's end; the data changed?"));
    }
    // (A recycled buffer keeps its old size: resize() then only zero-fills the growth.)
    unit->tokens.resize(total - (views.empty() ? 0 : plan.skip_tokens));
    unit->doc_start.resize(views.size() + 1);
    uint32_t* out = unit->tokens.data();
    uint64_t at = 0;
    for (size_t i = 0; i < views.size(); ++i) {
      const NpyView& v = views[i];
      unit->doc_start[i] = at;
      const uint64_t from = i == 0 ? std::min<uint64_t>(plan.skip_tokens, v.size) : 0;
      uint32_t max_id = 0;
      if (v.dtype == NpyDtype::kU16) {
        const auto* p = reinterpret_cast<const unsigned char*>(v.data);
        for (uint64_t t = from; t < v.size; ++t) {
          const uint32_t id = static_cast<uint32_t>(p[2 * t]) | (static_cast<uint32_t>(p[2 * t + 1]) << 8);
          max_id = std::max(max_id, id);
          out[at++] = id;
        }
      } else {
        const auto* p = reinterpret_cast<const unsigned char*>(v.data);
        for (uint64_t t = from; t < v.size; ++t) {
          uint32_t id;
          std::memcpy(&id, p + 4 * t, 4);  // little-endian host (x86-64, aarch64)
          max_id = std::max(max_id, id);
          out[at++] = id;
        }
      }
      if (vocab > 0 && v.size > from && max_id >= vocab) {
        return fail(Status::data("member '" + keys[i] + ".tokens.npy' holds token id " +
                                 std::to_string(max_id) + " >= vocab_size " + std::to_string(vocab)));
      }
      out[at++] = eos_;
    }
    unit->doc_start[views.size()] = at;
    KILN_CHECK(at == unit->tokens.size());
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

  // Builds one batch from the given positions (copies of the packer's). Returns false when
  // abandoned. Runs without mu_ except inside get_unit().
  bool build(uint64_t gen, int64_t step, uint64_t mix, const std::vector<double>& w,
             std::vector<Pos>* pos, std::vector<uint64_t>* seqs, Prepared* out) {
    const int64_t rows = options_.micro_batch;
    const int64_t width = options_.seq_len + 1;
    Batch& b = out->batch;
    b.step = step;
    b.micro_batch = rows;
    b.seq_len = options_.seq_len;
    b.tokens.resize(rows * width);
    b.domains.resize(rows);
    b.docs.assign(rows, {});
    out->rows.resize(rows);
    std::vector<std::shared_ptr<Unit>> current(domains_.size());
    for (int64_t r = 0; r < rows; ++r) {
      const int d = choose_domain(w, mix + r);
      b.domains[r] = d;
      Pos& p = (*pos)[d];
      uint32_t* dst = b.tokens.data() + r * width;
      int64_t filled = 0;
      while (filled < width) {
        auto& u = current[d];
        if (!u || u->plan.seq != p.unit) {
          u = get_unit(d, p.unit, gen);
          if (!u) return false;
        }
        if (!u->status.is_ok()) {
          out->status = u->status;
          return true;
        }
        if (p.doc >= u->docs()) {
          ++p.unit;
          p.doc = p.tok = 0;
          continue;
        }
        const uint64_t begin = u->doc_start[p.doc] + p.tok;
        const uint64_t end = u->doc_start[p.doc + 1];
        const uint64_t take = std::min<uint64_t>(end - begin, width - filled);
        std::memcpy(dst + filled, u->tokens.data() + begin, take * sizeof(uint32_t));
        DocSpan s;
        s.shard = u->plan.shard;
        s.member = u->plan.members[p.doc];
        s.epoch = u->plan.epoch;
        s.doc_offset = static_cast<uint32_t>((p.doc == 0 ? u->plan.skip_tokens : 0) + p.tok);
        s.length = static_cast<uint32_t>(take);
        s.seq_offset = static_cast<uint32_t>(filled);
        s.ends = begin + take == end;
        if (!u->ids.empty()) s.id = u->ids[p.doc];
        b.docs[r].push_back(std::move(s));
        filled += static_cast<int64_t>(take);
        p.tok += take;
        if (begin + take == end) {
          ++p.doc;
          p.tok = 0;
        }
      }
      ++(*seqs)[d];
      out->rows[r] = {d, p, (*seqs)[d]};
    }
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
      const uint64_t mix = packer_mix_;
      const std::vector<double> w = weights_at(step);
      std::vector<Pos> pos;
      std::vector<uint64_t> seqs;
      for (auto& dp : domains_) {
        pos.push_back(dp->packer);
        seqs.push_back(dp->packer_seqs);
      }
      lk.unlock();
      Prepared p;
      const bool done = build(gen, step, mix, w, &pos, &seqs, &p);
      lk.lock();
      if (!done || stop_ || gen != generation_) continue;
      if (!p.status.is_ok()) {
        packer_failed_ = true;
      } else {
        for (size_t d = 0; d < domains_.size(); ++d) {
          domains_[d]->packer = pos[d];
          domains_[d]->packer_seqs = seqs[d];
          domains_[d]->packer_head = 0;
        }
        ++packer_step_;
        packer_mix_ += static_cast<uint64_t>(options_.micro_batch);
      }
      queue_.push_back(std::move(p));
      cv_.notify_all();
    }
  }

  Manifest manifest_;
  LoaderOptions options_;
  uint32_t eos_ = 0;
  std::vector<std::string> names_;
  std::vector<DomainInfo> infos_;
  uint64_t fingerprint_ = 0;
  uint64_t seed_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  std::atomic<bool> abort_decode_{false};
  uint64_t generation_ = 0;

  std::vector<LoaderState::WeightChange> history_;
  std::vector<std::vector<double>> history_w_;  // history_ as vectors by domain id
  std::vector<std::unique_ptr<DomainRt>> domains_;
  std::deque<Prepared> queue_;
  std::vector<std::vector<uint32_t>> token_pool_;  // recycled Unit::tokens buffers
  bool packer_failed_ = false;
  Status latched_;
  int64_t consumer_step_ = 0, packer_step_ = 0;
  uint64_t consumer_mix_ = 0, packer_mix_ = 0;

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

}  // namespace kiln
