#include <chrono>
#include <nlohmann/json.hpp>

#include "common/json.h"
#include "engine/data/data_source.h"
#include "engine/model/rng.h"

namespace kiln::engine {
namespace {

constexpr uint64_t kMixStream = 0x6d6978;                // "mix"
constexpr uint64_t kMarkovStream = 0x6d61726b;           // "mark"
constexpr uint64_t kRepeatStream = 0x72657074;           // "rept"
constexpr uint64_t kValidationStream = 0x76616c6964ull;  // "valid"
constexpr int kSuccessors = 4;
constexpr int kMotif = 16;

class SyntheticSource final : public DataSource {
 public:
  SyntheticSource(const DataConfig& data, const ModelConfig& model, uint64_t seed, DataRank rank)
      : rank_(rank),
        seed_(seed),
        rows_(data.micro_batch),
        T_(model.seq_len),
        V_(static_cast<uint64_t>(model.vocab_size)),
        names_{"markov", "repeat"} {
    loader::DomainWeights w = data.mixture;
    if (w.empty()) w = {{"markov", 1.0}, {"repeat", 1.0}};
    Status st = set_weights(w);
    KILN_CHECK(st.is_ok(), "synthetic weights were validated with the config: " + st.to_string());
  }

  Status next(MicroBatch* out) override {
    out->rows = rows_;
    out->seq_len = T_;
    out->inputs.resize(rows_ * T_);
    out->targets.resize(rows_ * T_);
    out->domains.resize(rows_);
    std::vector<int32_t> seq(T_ + 1);
    const uint64_t group = slot_;
    slot_ = group + static_cast<uint64_t>(rank_.rank) * rows_;
    for (int64_t r = 0; r < rows_; ++r, ++slot_) {
      const double u = random_uniform(seed_, kMixStream, slot_);
      const int d = u < weights_[0] ? 0 : 1;
      out->domains[r] = d;
      generate(seed_, slot_, d, seq.data());
      std::copy(seq.begin(), seq.end() - 1, out->inputs.begin() + r * T_);
      std::copy(seq.begin() + 1, seq.end(), out->targets.begin() + r * T_);
    }
    slot_ = group + static_cast<uint64_t>(rank_.world) * rows_;
    out->wait_ms = 0;
    return Status::ok();
  }

  const std::vector<std::string>& domains() const override { return names_; }

  loader::DomainWeights weights() const override {
    return {{names_[0], weights_[0]}, {names_[1], weights_[1]}};
  }

  Status set_weights(const loader::DomainWeights& w) override {
    loader::WeightRules rules;
    rules.key = "data.mixture";
    rules.known = names_;
    KILN_RETURN_IF_ERROR(w.check(rules));
    const std::vector<double> v = w.normalised_over(names_);
    weights_[0] = v[0];
    weights_[1] = v[1];
    return Status::ok();
  }

  std::string state() const override {
    nlohmann::json j;
    j["kind"] = "synthetic";
    j["slot"] = slot_;
    j["weights"] = {weights_[0], weights_[1]};
    return j.dump();
  }

  Result<std::string> merge_states(const std::vector<std::string>& per_rank) const override {
    for (const auto& s : per_rank) {
      if (s != per_rank.at(0))
        return Status::data("synthetic data states differ between ranks: " + per_rank[0] + " vs " +
                            s);
    }
    return per_rank.at(0);
  }

  Status restore(const std::string& state) override {
    try {
      auto j = parse_untrusted_json_or_throw(state);
      if (j.at("kind") != "synthetic")
        return Status::data("checkpoint data state is not synthetic");
      slot_ = json_integer_at<uint64_t>(j, "slot");
      weights_[0] = j.at("weights").at(0).get<double>();
      weights_[1] = j.at("weights").at(1).get<double>();
    } catch (const std::exception& e) {
      return Status::data(std::string("bad synthetic data state: ") + e.what());
    }
    return Status::ok();
  }

  std::string describe() const override {
    return "synthetic data (domains markov, repeat; no data.manifest given)";
  }

  // Held-out sequences: the same chain and motif rules, drawn from another random stream.
  Result<std::vector<ValidationSequences>> validation_set(int64_t per_domain) override {
    std::vector<ValidationSequences> out;
    std::vector<int32_t> seq(T_ + 1);
    for (int d = 0; d < 2; ++d) {
      ValidationSequences v;
      v.domain = d;
      v.rows = per_domain;
      v.seq_len = T_;
      for (int64_t r = 0; r < per_domain; ++r) {
        generate(seed_ ^ kValidationStream, static_cast<uint64_t>(r), d, seq.data());
        v.inputs.insert(v.inputs.end(), seq.begin(), seq.end() - 1);
        v.targets.insert(v.targets.end(), seq.begin() + 1, seq.end());
      }
      out.push_back(std::move(v));
    }
    return out;
  }

 private:
  // T + 1 tokens of domain d for `slot` of the random stream `stream_seed`; the bigram chain's
  // successor table depends on the run's seed only.
  void generate(uint64_t stream_seed, uint64_t slot, int d, int32_t* seq) const {
    if (d == 0) {
      uint64_t tok = random_bits(stream_seed, kMarkovStream, slot << 20) % V_;
      for (int64_t i = 0; i <= T_; ++i) {
        seq[i] = static_cast<int32_t>(tok);
        const uint64_t k =
            random_bits(stream_seed, kMarkovStream + 1, (slot << 20) + i) % kSuccessors;
        tok = random_bits(seed_ ^ 0x5eed, tok, k) % V_;  // the chain's fixed successor table
      }
    } else {
      int32_t motif[kMotif];
      for (int i = 0; i < kMotif; ++i)
        motif[i] =
            static_cast<int32_t>(random_bits(stream_seed, kRepeatStream, (slot << 8) + i) % V_);
      for (int64_t i = 0; i <= T_; ++i) seq[i] = motif[i % kMotif];
    }
  }

  DataRank rank_;
  uint64_t seed_;
  int64_t rows_, T_;
  uint64_t V_;
  std::vector<std::string> names_;
  double weights_[2] = {0.5, 0.5};
  uint64_t slot_ = 0;
};

}  // namespace

std::unique_ptr<DataSource> make_synthetic_source(const DataConfig& data, const ModelConfig& model,
                                                  uint64_t seed, DataRank rank) {
  return std::make_unique<SyntheticSource>(data, model, seed, rank);
}

}  // namespace kiln::engine
