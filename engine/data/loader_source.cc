// DataSource over the loader (loader/loader.h): a `kiln prep` dataset, packed and domain-mixed.
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "engine/data/data_source.h"
#include "loader/loader.h"

namespace kiln::engine {

void append_doc_starts(const std::vector<int32_t>& starts, int64_t seq_len,
                       std::vector<int32_t>* out) {
  size_t next = 0;
  int32_t cur = 0;
  for (int64_t t = 0; t < seq_len; ++t) {
    while (next < starts.size() && starts[next] <= t) cur = starts[next++];
    out->push_back(cur);
  }
}

namespace {

class LoaderSource final : public DataSource {
 public:
  LoaderSource(std::unique_ptr<loader::Loader> loader, Manifest full, std::string manifest_path)
      : loader_(std::move(loader)),
        full_(std::move(full)),
        manifest_path_(std::move(manifest_path)) {}

  Status next(MicroBatch* out) override {
    KILN_ASSIGN_OR_RETURN(loader::Batch b, loader_->next_batch());
    const int64_t T = b.seq_len;
    out->rows = b.micro_batch;
    out->seq_len = T;
    out->inputs.resize(b.micro_batch * T);
    out->targets.resize(b.micro_batch * T);
    out->domains.assign(b.domains.begin(), b.domains.end());
    out->doc_start.clear();
    for (int64_t r = 0; r < b.micro_batch; ++r) {
      append_doc_starts(b.doc_starts(r), T, &out->doc_start);
      auto row = b.row(r);
      for (int64_t i = 0; i < T; ++i) {
        out->inputs[r * T + i] = static_cast<int32_t>(row[i]);
        out->targets[r * T + i] = static_cast<int32_t>(row[i + 1]);
      }
    }
    out->wait_ms = b.wait_ms;
    out->samples.clear();
    for (const auto& row : b.docs) {
      for (const loader::DocSpan& d : row) {
        if (d.doc_offset != 0 && !out->samples.empty()) continue;  // a continued piece
        out->samples.push_back(loader_->manifest().shards[d.shard].path + "#" +
                               std::to_string(d.member));
      }
    }
    return Status::ok();
  }

  // The first `per_domain` sequences of each domain's validation shards, packed as for training
  // (a loader over the validation split with only that domain weighted, the run's seed).
  Result<std::vector<ValidationSequences>> validation_set(int64_t per_domain) override {
    std::vector<ValidationSequences> out;
    const Manifest val = select_split(full_, /*val=*/true);
    for (size_t d = 0; d < loader_->domain_names().size(); ++d) {
      const std::string& name = loader_->domain_names()[d];
      auto it = val.domains.find(name);
      if (it == val.domains.end() || it->second.tokens == 0) continue;
      loader::LoaderOptions o = loader_->options();
      o.val_split = true;
      o.dp_rank = 0;
      o.dp_world = 1;
      o.micro_batch = per_domain;
      o.global_batch = per_domain;
      o.partitions = 1;  // the split read in order, the same on every layout
      o.weights = {{name, 1.0}};
      o.workers = 1;
      o.prefetch_depth = 1;
      KILN_ASSIGN_OR_RETURN(auto loader, loader::Loader::open(full_, o));
      KILN_ASSIGN_OR_RETURN(loader::Batch b, loader->next_batch());
      ValidationSequences v;
      v.domain = static_cast<int>(d);
      v.rows = b.micro_batch;
      v.seq_len = b.seq_len;
      const int64_t T = b.seq_len;
      for (int64_t r = 0; r < b.micro_batch; ++r) {
        append_doc_starts(b.doc_starts(r), T, &v.doc_start);
        auto row = b.row(r);
        for (int64_t i = 0; i < T; ++i) {
          v.inputs.push_back(static_cast<int32_t>(row[i]));
          v.targets.push_back(static_cast<int32_t>(row[i + 1]));
        }
      }
      out.push_back(std::move(v));
    }
    return out;
  }

  const std::vector<std::string>& domains() const override { return loader_->domain_names(); }
  loader::DomainWeights weights() const override { return loader_->weights(); }
  Status set_weights(const loader::DomainWeights& w) override { return loader_->set_weights(w); }
  std::string state() const override { return loader_->state().to_json(); }
  Result<std::string> merge_states(const std::vector<std::string>& per_rank) const override {
    std::vector<loader::LoaderState> states;
    for (size_t r = 0; r < per_rank.size(); ++r) {
      KILN_ASSIGN_OR_RETURN(
          loader::LoaderState s,
          loader::LoaderState::from_json(per_rank[r], "rank " + std::to_string(r) + " data state"));
      states.push_back(std::move(s));
    }
    if (states.size() == 1) return states[0].to_json();
    KILN_ASSIGN_OR_RETURN(loader::LoaderState merged, loader::LoaderState::merge(states));
    return merged.to_json();
  }
  Status restore(const std::string& state) override {
    KILN_ASSIGN_OR_RETURN(loader::LoaderState s,
                          loader::LoaderState::from_json(state, "checkpoint data_state"));
    return loader_->restore(s);
  }
  std::string describe() const override {
    const Manifest& m = loader_->manifest();
    uint64_t tokens = 0;
    for (const auto& [name, d] : m.domains) tokens += d.tokens;
    std::string doms;
    for (const auto& [name, w] : loader_->weights()) {
      doms += (doms.empty() ? "" : ", ") + name + fmt::format(" {:.3f}", w);
    }
    return fmt::format("{} ({} shards, {} tokens; weights: {})", manifest_path_, m.shards.size(),
                       tokens, doms);
  }

 private:
  std::unique_ptr<loader::Loader> loader_;
  Manifest full_;  // both splits
  std::string manifest_path_;
};

}  // namespace

Result<std::unique_ptr<DataSource>> open_loader_source(const DataConfig& data,
                                                       const ModelConfig& model, uint64_t seed,
                                                       DataRank rank) {
  auto read = read_manifest(data.manifest);
  if (!read.is_ok()) {
    // The path came from the config: a missing or unreadable manifest is a config error naming it.
    if (read.status().code() == StatusCode::kNotFound || read.status().code() == StatusCode::kIo) {
      return Status::config(read.status().to_string()).with_key("data.manifest");
    }
    return std::move(read).take_status();
  }
  Manifest manifest = std::move(read).value();
  if (manifest.tokenizer.vocab_size > static_cast<uint64_t>(model.vocab_size)) {
    return Status::config("the dataset's tokenizer has " +
                          std::to_string(manifest.tokenizer.vocab_size) +
                          " tokens but model.vocab_size is " + std::to_string(model.vocab_size))
        .with_key("model.vocab_size");
  }
  loader::LoaderOptions o;
  o.seq_len = model.seq_len;
  o.micro_batch = data.micro_batch;
  o.seed = seed;
  o.dp_rank = rank.rank;
  o.dp_world = rank.world;
  o.global_batch = data.micro_batch * data.grad_accum * rank.world;
  o.partitions = data.partitions;
  o.repartition = data.repartition;
  o.weights = data.mixture;
  o.prefetch_depth = static_cast<int>(data.prefetch_depth);
  o.workers = static_cast<int>(data.workers);
  auto loader = loader::Loader::open(manifest, o);
  if (!loader.is_ok()) {
    // The loader names its weights "weights.<domain>"; in a train config they are data.mixture.
    Status st = std::move(loader).take_status();
    if (st.key().rfind("weights", 0) == 0) st.with_key("data.mixture" + st.key().substr(7));
    if (st.key() == "partitions") st.with_key("data.partitions");
    return st;
  }
  return std::unique_ptr<DataSource>(
      new LoaderSource(std::move(*loader), std::move(manifest), data.manifest));
}

}  // namespace kiln::engine
