// The Loader implementation: threads, queues and positions around four parts with their own
// headers — plan.h (cursor -> units), decode.h (unit -> packed tokens), pack.h (mixture decision,
// sequences cut from the packed streams) and weights_history.h (the weights of every step, as
// the state records them). Structure (see docs/LOADER.md):
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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
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
    history_.set_from(consumer_step_, std::move(w));
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
    s.world = options_.dp_world;
    s.step = consumer_step_;
    s.mix_index = consumer_mix_;
    s.weights_history = history_.changes();
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
        cursors[d] = loader::detail::reshard_cursor(old, state.world, infos_[d].samples,
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
    return loader::detail::cursor_at(u.plan, D.consumer.doc, D.consumer.tok, D.consumer_seqs);
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
    const auto& w = history_.at(packer_step_);
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
        loader::detail::decode_unit(manifest_, decode_options_, abort_decode_, unit.get());
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
    std::vector<std::shared_ptr<const Unit>> current(domains_.size());
    for (int64_t r = 0; r < rows; ++r) {
      const int d = loader::detail::choose_domain(w, seed_, mix + r);
      b.domains[r] = d;
      Pos& p = (*pos)[d];
      auto fetch = [&](uint64_t seq) -> std::shared_ptr<const Unit> { return get_unit(d, seq, gen); };
      const FillResult filled = loader::detail::fill_row(fetch, &current[d], &p, width,
                                                         b.tokens.data() + r * width, &b.docs[r],
                                                         &out->status);
      if (filled == FillResult::kAbandoned) return false;
      if (filled == FillResult::kFailed) return true;
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
      const std::vector<double> w = history_.at(step);
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

  WeightsHistory history_{std::vector<std::string>()};
  DecodeOptions decode_options_;
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

}  // namespace kiln::loader
