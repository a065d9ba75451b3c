#include "engine/train/eval.h"

#include <algorithm>

namespace kiln::engine {

Result<std::unique_ptr<Evaluator>> Evaluator::open(DataSource& data, const EvalConfig& config,
                                                   int64_t micro_batch, int64_t seq_len,
                                                   int64_t vocab, Runtime* runtime) {
  auto e = std::unique_ptr<Evaluator>(new Evaluator());
  e->names_ = data.domains();
  KILN_ASSIGN_OR_RETURN(std::vector<ValidationSequences> sets,
                        data.validation_set(config.sequences_per_domain));
  // Repack every domain's sequences into micro-batches of the model's size; the padding rows
  // have no targets (ignored by the loss).
  MicroBatch cur;
  auto flush = [&] {
    if (cur.rows == 0) return;
    const int64_t T = cur.seq_len;
    cur.inputs.resize(micro_batch * T, 0);
    cur.targets.resize(micro_batch * T, -1);
    cur.doc_start.resize(cur.doc_start.empty() ? 0 : micro_batch * T, 0);
    cur.domains.resize(micro_batch, -1);
    cur.rows = micro_batch;
    e->batches_.push_back(std::move(cur));
    cur = MicroBatch();
  };
  for (const ValidationSequences& v : sets) {
    const int64_t T = v.seq_len;
    for (int64_t r = 0; r < v.rows; ++r) {
      if (cur.rows == micro_batch) flush();
      cur.seq_len = T;
      cur.inputs.insert(cur.inputs.end(), v.inputs.begin() + r * T, v.inputs.begin() + (r + 1) * T);
      cur.targets.insert(cur.targets.end(), v.targets.begin() + r * T,
                         v.targets.begin() + (r + 1) * T);
      if (!v.doc_start.empty()) {
        cur.doc_start.insert(cur.doc_start.end(), v.doc_start.begin() + r * T,
                             v.doc_start.begin() + (r + 1) * T);
      }
      cur.domains.push_back(v.domain);
      ++cur.rows;
      ++e->sequences_;
    }
  }
  flush();
  for (const MicroBatch& b : e->batches_) {
    KILN_RETURN_IF_ERROR(Status(check_token_ids(b, vocab)).prefixed("validation split"));
  }
  e->staged_ = std::make_unique<DeviceBatches>(runtime, micro_batch, seq_len);
  for (size_t i = 0; i < e->batches_.size(); ++i) e->staged_->upload(i, e->batches_[i]);
  return e;
}

namespace {
// Model::forward on each staged micro-batch in turn, or the pass.
// (doc_start: the rows' document starts, zeros for one document per row - a task row is one.)
Status run_forward(Model& model, const ForwardPass& pass, DeviceBatches& staged, size_t n) {
  std::vector<DeviceBatches::Tokens> toks;
  std::vector<float*> losses;
  for (size_t i = 0; i < n; ++i) {
    toks.push_back(staged.at(i));
    losses.push_back(staged.losses(i));
  }
  if (pass) return pass(toks, losses);
  for (size_t i = 0; i < n; ++i)
    model.forward(toks[i].inputs, toks[i].targets, losses[i], toks[i].doc_start);
  return Status::ok();
}
}  // namespace

Result<WeightMap> Evaluator::evaluate(Model& model, const ForwardPass& pass) {
  std::vector<double> sum(names_.size(), 0.0);
  std::vector<int64_t> count(names_.size(), 0);
  if (batches_.empty()) return WeightMap{};
  KILN_RETURN_IF_ERROR(run_forward(model, pass, *staged_, batches_.size()));
  const size_t per_batch = batches_[0].inputs.size();  // every batch is rows x seq_len
  losses_.resize(batches_.size() * per_batch);
  staged_->download_losses(batches_.size(), losses_.data());
  for (size_t i = 0; i < batches_.size(); ++i) {
    const MicroBatch& b = batches_[i];
    const int64_t T = b.seq_len;
    const float* losses = losses_.data() + i * per_batch;
    for (int64_t r = 0; r < b.rows; ++r) {
      const int d = b.domains[r];
      if (d < 0 || d >= static_cast<int>(names_.size())) continue;
      for (int64_t i = 0; i < T; ++i) {
        if (b.targets[r * T + i] < 0) continue;
        sum[d] += losses[r * T + i];
        ++count[d];
      }
    }
  }
  WeightMap out;
  for (size_t d = 0; d < names_.size(); ++d)
    if (count[d] > 0) out[names_[d]] = sum[d] / static_cast<double>(count[d]);
  return out;
}

TaskEvaluator::TaskEvaluator(const TokenizedTasks& tasks, int64_t micro_batch, int64_t seq_len,
                             Runtime* runtime)
    : tasks_(tasks), rows_(micro_batch), seq_len_(seq_len) {
  MicroBatch cur;
  std::vector<MicroBatch> batches;
  auto flush = [&] {
    if (cur.rows == 0) return;
    cur.inputs.resize(rows_ * seq_len_, 0);
    cur.targets.resize(rows_ * seq_len_, -1);
    cur.rows = rows_;
    batches.push_back(std::move(cur));
    cur = MicroBatch();
  };
  for (const auto& [name, examples] : tasks_) {
    for (const McTokens& ex : examples) {
      for (size_t c = 0; c < ex.choices.size(); ++c) {
        if (cur.rows == rows_) flush();
        cur.seq_len = seq_len_;
        const size_t at = cur.inputs.size();
        cur.inputs.resize(at + seq_len_);
        cur.targets.resize(at + seq_len_);
        mc_row(ex, c, seq_len_, cur.inputs.data() + at, cur.targets.data() + at);
        ++cur.rows;
        ++count_;
      }
    }
  }
  flush();
  batches_ = batches.size();
  staged_ = std::make_unique<DeviceBatches>(runtime, micro_batch, seq_len, /*slot_base=*/1);
  staged_->reserve(batches_);
  for (size_t i = 0; i < batches.size(); ++i) staged_->upload(i, batches[i]);
}

Result<std::map<std::string, McResult>> TaskEvaluator::evaluate(Model& model,
                                                                const ForwardPass& pass) {
  KILN_RETURN_IF_ERROR(run_forward(model, pass, *staged_, batches_));
  const size_t per_row = static_cast<size_t>(seq_len_);
  losses_.resize(batches_ * static_cast<size_t>(rows_) * per_row);
  staged_->download_losses(batches_, losses_.data());
  std::map<std::string, McResult> out;
  size_t row = 0;
  for (const auto& [name, examples] : tasks_) {
    std::vector<std::vector<double>> nll(examples.size());
    for (size_t e = 0; e < examples.size(); ++e) {
      for (size_t c = 0; c < examples[e].choices.size(); ++c, ++row) {
        double sum = 0;  // targets -1 have loss 0
        const float* l = losses_.data() + row * per_row;
        for (size_t i = 0; i < per_row; ++i) sum += l[i];
        nll[e].push_back(sum);
      }
    }
    out[name] = mc_result(examples, nll);
  }
  return out;
}

}  // namespace kiln::engine
