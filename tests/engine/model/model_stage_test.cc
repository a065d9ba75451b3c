// The model split into pipeline stages (engine/model/model.h stage_*, engine/model/gpt_model.h):
// each stage's model, run by hand on the same micro-batches with several in flight (1F1B and
// GPipe orders, activations and gradients copied between the stages as the pipeline sends them),
// gives the whole model's per-token losses and parameter gradients; the stage's activation
// memory is what plan_activation_memory says.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "engine/device/runtime.h"
#include "engine/model/model.h"
#include "engine/model/params.h"
#include "engine/model/rng.h"
#include "engine/parallel/tensor_parallel.h"
#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {

// GPT-2 with tied embeddings (the head on the last stage reads its own copy of wte).
ModelConfig gpt2(int64_t layers = 3) {
  ModelConfig m = test::small_model();
  m.n_layers = layers;
  return m;
}

// Llama: grouped-query attention (4 heads on 2), SwiGLU, untied head, no biases, document mask.
ModelConfig llama(int64_t layers = 3) {
  ModelConfig m = gpt2(layers);
  m.arch = Arch::kLlama;
  m.n_kv_heads = 2;
  m.ffn_hidden = 40;
  m.tie_embeddings = false;
  m.bias = false;
  m.doc_mask = true;
  return m;
}

constexpr int kMicro = 2;  // rows per micro-batch
constexpr int kMicroBatches = 5;

struct Batch {
  std::vector<int32_t> in, tg, ds;
  int T = 0;
  const int32_t* inputs(int k) const { return in.data() + size_t(k) * kMicro * T; }
  const int32_t* targets(int k) const { return tg.data() + size_t(k) * kMicro * T; }
  const int32_t* doc_start(int k) const { return ds.data() + size_t(k) * kMicro * T; }
};

Batch make_batch(const ModelConfig& m) {
  Batch b;
  b.T = static_cast<int>(m.seq_len);
  const size_t n = size_t(kMicro) * kMicroBatches * b.T;
  b.in.resize(n);
  b.tg.resize(n);
  b.ds.resize(n);
  for (size_t i = 0; i < n; ++i) {
    b.in[i] = static_cast<int32_t>(random_bits(7, 1, i) % m.vocab_size);
    b.tg[i] = static_cast<int32_t>(random_bits(7, 2, i) % m.vocab_size);
  }
  b.tg[3] = -1;                         // an ignored target
  for (size_t r = 0; r < n / b.T; ++r)  // documents every 6 tokens, shifted by the row
    for (int t = 0; t < b.T; ++t)
      b.ds[r * b.T + t] = int32_t(t < int(r % 5) ? 0 : (t - int(r % 5)) / 6 * 6 + int(r % 5));
  return b;
}

float dloss_of(Precision p, const Batch& b) {
  return static_cast<float>((p == Precision::kFp16 ? 256.0 : 1.0) / double(b.in.size()));
}

struct Result {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;  // per tensor of the whole model's store
};

Result whole_model(const ModelConfig& m, Precision p, Recompute r, const Batch& b,
                   bool through_stage_calls = false, TensorParallel* tp = nullptr) {
  ParamStore params(m, p);
  params.init(11);
  params.zero_grads();
  auto model = Model::create(&params, kMicro, r, 0, tp);
  Result out;
  out.losses.resize(b.in.size());
  for (int k = 0; k < kMicroBatches; ++k) {
    float* losses = out.losses.data() + size_t(k) * kMicro * b.T;
    if (through_stage_calls) {
      model->stage_forward(0, b.inputs(k), b.targets(k), losses, b.doc_start(k), dloss_of(p, b),
                           true);
      model->stage_backward(0, b.inputs(k), b.doc_start(k));
    } else {
      model->forward_backward(b.inputs(k), b.targets(k), dloss_of(p, b), losses, b.doc_start(k));
    }
  }
  for (size_t t = 0; t < params.tensors().size(); ++t) {
    const float* g = params.grad(int(t));
    out.grads.emplace_back(g, g + params.tensors()[t].numel);
  }
  return out;
}

enum class Schedule { kGpipe, k1F1B };

// One step of every stage's model over the micro-batches, in `schedule`'s order per stage; the
// stages take turns, each running its next operation once its input has arrived (a forward: the
// previous stage's output; a backward: the next stage's input gradient), which is the order
// mpirun's ranks would run. Messages are copies of the sent buffers taken right after the call,
// written into the receiving slot's buffer just before the receiving call. layers: the blocks per
// stage (empty: pp_stage_split's choice).
Result stages(const ModelConfig& m, Precision p, Recompute r, const Batch& b, int P,
              Schedule schedule, const std::vector<int64_t>& layers = {},
              TensorParallel* tp = nullptr) {
  struct Op {
    bool forward;
    int k;
  };
  std::vector<std::unique_ptr<ParamStore>> stores;
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::deque<Op>> ops(size_t(P), std::deque<Op>{});
  std::vector<int> slots;
  for (int s = 0; s < P; ++s) {
    stores.push_back(std::make_unique<ParamStore>(m, p, false, nullptr, TpShard{}, true,
                                                  pp_stage(m, s, P, layers)));
    stores.back()->init(11);
    stores.back()->zero_grads();
    // GPipe: every micro-batch in flight; 1F1B: at most P - s on stage s.
    slots.push_back(schedule == Schedule::kGpipe ? kMicroBatches : std::min(P - s, kMicroBatches));
    models.push_back(Model::create(stores.back().get(), kMicro, r, 0, tp, slots.back()));
    EXPECT_EQ(models.back()->pp_slots(), slots.back());
    std::deque<Op>& q = ops[size_t(s)];
    if (schedule == Schedule::kGpipe) {
      for (int k = 0; k < kMicroBatches; ++k) q.push_back({true, k});
      for (int k = 0; k < kMicroBatches; ++k) q.push_back({false, k});
    } else {  // warm-up forwards, then one forward and one backward, then the remaining backwards
      const int warm = std::min(P - s - 1, kMicroBatches);
      int f = 0, bk = 0;
      for (; f < warm; ++f) q.push_back({true, f});
      for (; f < kMicroBatches; ++f, ++bk) {
        q.push_back({true, f});
        q.push_back({false, bk});
      }
      for (; bk < kMicroBatches; ++bk) q.push_back({false, bk});
    }
  }
  const size_t bytes = models[0]->stage_activation_elems() * (p == Precision::kFp32 ? 4 : 2);
  EXPECT_EQ(models[0]->stage_activation_elems(), size_t(kMicro) * b.T * m.d_model);
  // (stage, micro-batch) -> the bytes the stage sent forward / backward.
  std::map<std::pair<int, int>, std::vector<char>> acts, grads;
  Result out;
  out.losses.assign(b.in.size(), -1.0f);
  std::vector<std::vector<int>> in_flight(
      static_cast<size_t>(P));  // per stage, per slot: micro-batch or -1
  for (int s = 0; s < P; ++s) in_flight[size_t(s)].assign(size_t(slots[size_t(s)]), -1);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      auto& q = ops[size_t(s)];
      if (q.empty()) continue;
      const Op op = q.front();
      Model& model = *models[size_t(s)];
      const int slot = op.k % slots[size_t(s)];
      int& held = in_flight[size_t(s)][size_t(slot)];
      if (op.forward) {
        if (s > 0 && !acts.count({s - 1, op.k})) continue;
        EXPECT_EQ(held, -1) << "stage " << s << " slot " << slot << " still in flight";
        if (s > 0) std::memcpy(model.stage_input(slot), acts[{s - 1, op.k}].data(), bytes);
        float* losses = s == P - 1 ? out.losses.data() + size_t(op.k) * kMicro * b.T : nullptr;
        model.stage_forward(slot, b.inputs(op.k), s == P - 1 ? b.targets(op.k) : nullptr, losses,
                            b.doc_start(op.k), dloss_of(p, b), true);
        held = op.k;
        if (s < P - 1) {
          const char* o = static_cast<const char*>(model.stage_output(slot));
          acts[{s, op.k}].assign(o, o + bytes);
        }
      } else {
        if (s < P - 1 && !grads.count({s + 1, op.k})) continue;
        EXPECT_EQ(held, op.k);
        if (s < P - 1)
          std::memcpy(model.stage_output_grad(slot), grads[{s + 1, op.k}].data(), bytes);
        model.stage_backward(slot, b.inputs(op.k), b.doc_start(op.k));
        held = -1;
        if (s > 0) {
          const char* g = static_cast<const char*>(model.stage_input_grad(slot));
          grads[{s, op.k}].assign(g, g + bytes);
        }
      }
      q.pop_front();
      progress = true;
    }
  }
  for (int s = 0; s < P; ++s) EXPECT_TRUE(ops[size_t(s)].empty()) << "stage " << s << " stuck";
  // Every tensor's gradient from the stage(s) holding its unit: the tied embedding's two copies
  // (first and last stage) summed, as the pipeline sums them.
  const ParamStore& any = *stores[0];
  for (size_t t = 0; t < any.tensors().size(); ++t) {
    std::vector<float> g(any.tensors()[t].numel, 0.0f);
    int holders = 0;
    for (int s = 0; s < P; ++s) {
      const ParamStore& st = *stores[size_t(s)];
      if (!st.holds(st.tensors()[t].unit)) continue;
      const float* sg = st.grad(int(t));
      if (holders++ == 0) {
        std::memcpy(g.data(), sg, g.size() * 4);
      } else {
        for (size_t i = 0; i < g.size(); ++i) g[i] += sg[i];
      }
    }
    EXPECT_GE(holders, 1) << any.tensors()[t].name;
    out.grads.push_back(std::move(g));
  }
  return out;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

// Bit-identical losses and gradients, except the tied embedding's gradient: the whole model adds
// each micro-batch's head and embedding gradients into one wte gradient in turn, the pipeline
// sums the head's (last stage) and the embedding's (first stage) separately and then adds the
// two - the same terms in another order, so equal to rounding.
void expect_same(const ModelConfig& m, const Result& whole, const Result& piped,
                 const std::string& what) {
  ParamStore layout(m, Precision::kFp32, false, nullptr, TpShard{}, false);
  ASSERT_EQ(0, std::memcmp(whole.losses.data(), piped.losses.data(), whole.losses.size() * 4))
      << what << ": per-token losses differ";
  ASSERT_EQ(whole.grads.size(), piped.grads.size());
  for (size_t t = 0; t < whole.grads.size(); ++t) {
    const std::string& name = layout.tensors()[t].name;
    if (m.tie_embeddings && int(t) == layout.wte()) {
      double norm = 0;
      for (float g : whole.grads[t]) norm += double(g) * g;
      EXPECT_GT(norm, 0.0) << name;
      EXPECT_LT(rel_diff(piped.grads[t], whole.grads[t]), 1e-6) << what << " " << name;
      continue;
    }
    EXPECT_EQ(0,
              std::memcmp(whole.grads[t].data(), piped.grads[t].data(), whole.grads[t].size() * 4))
        << what << ": " << name << " differs (rel " << rel_diff(piped.grads[t], whole.grads[t])
        << ")";
  }
}

// splits: blocks per stage (an empty entry of n: pp_stage_split's choice for n stages).
struct Split {
  int pp;
  std::vector<int64_t> layers;
};

void stages_match_whole(const ModelConfig& m, const std::vector<Split>& splits,
                        std::vector<Precision> precs) {
  const Batch b = make_batch(m);
  for (Precision p : precs) {
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      const Result whole = whole_model(m, p, r, b);
      for (const Split& split : splits) {
        std::string layers;
        for (int64_t n : split.layers) layers += " " + std::to_string(n);
        for (Schedule sc : {Schedule::k1F1B, Schedule::kGpipe}) {
          const std::string what = std::string(precision_name(p)) + " " + recompute_name(r) +
                                   " pp=" + std::to_string(split.pp) + layers +
                                   (sc == Schedule::kGpipe ? " gpipe" : " 1f1b");
          SCOPED_TRACE(what);
          expect_same(m, whole, stages(m, p, r, b, split.pp, sc, split.layers), what);
        }
      }
    }
  }
}

TEST(ModelStage, Gpt2TiedStagesMatchWholeModel) {
  stages_match_whole(gpt2(), {{2, {}}, {2, {1, 2}}, {3, {}}},
                     {Precision::kFp32, Precision::kBf16, Precision::kFp16});
}

TEST(ModelStage, LlamaStagesMatchWholeModel) {
  stages_match_whole(llama(), {{2, {}}, {2, {1, 2}}, {3, {}}},
                     {Precision::kFp32, Precision::kBf16, Precision::kFp16});
}

TEST(ModelStage, FourBlocksOnFourStages) {
  stages_match_whole(gpt2(4), {{4, {}}}, {Precision::kFp32});
  stages_match_whole(llama(4), {{4, {}}}, {Precision::kFp32, Precision::kBf16});
}

// The stages' tensor-parallel code path (Megatron-style layers, the vocabulary-parallel embedding
// and cross-entropy) on a group of one rank: the same as the whole model's. (TP = 2 x PP = 2 runs
// under mpirun: the pipeline's tests.)
TEST(ModelStage, TensorParallelPathOnOneRank) {
  auto group = comm::make_local_group();
  for (const ModelConfig& m : {gpt2(), llama()}) {
    auto tp = TensorParallel::create(m, StabilityConfig{}, *group);
    ASSERT_TRUE(tp.is_ok()) << tp.status().to_string();
    const Batch b = make_batch(m);
    for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
      const Result whole = whole_model(m, Precision::kBf16, r, b, false, tp->get());
      for (Schedule sc : {Schedule::k1F1B, Schedule::kGpipe}) {
        expect_same(m, whole, stages(m, Precision::kBf16, r, b, 3, sc, {}, tp->get()),
                    std::string(arch_name(m.arch)) + " tp");
      }
    }
  }
}

// The whole model run through the stage calls (slot 0) is forward_backward.
TEST(ModelStage, WholeModelThroughStageCallsIsForwardBackward) {
  for (const ModelConfig& m : {gpt2(), llama()}) {
    const Batch b = make_batch(m);
    const Result a = whole_model(m, Precision::kFp32, Recompute::kSelective, b);
    const Result c = whole_model(m, Precision::kFp32, Recompute::kSelective, b, true);
    ASSERT_EQ(0, std::memcmp(a.losses.data(), c.losses.data(), a.losses.size() * 4));
    for (size_t t = 0; t < a.grads.size(); ++t)
      EXPECT_EQ(0, std::memcmp(a.grads[t].data(), c.grads[t].data(), a.grads[t].size() * 4)) << t;
  }
}

// What the stages exchange: the first stage receives no activation and sends no gradient, the last
// sends no activation and receives no gradient; every slot has its own buffers.
TEST(ModelStage, ExchangeBuffersPerSlot) {
  const ModelConfig m = llama();
  std::vector<std::unique_ptr<ParamStore>> stores;
  for (int s = 0; s < 3; ++s) {
    stores.push_back(std::make_unique<ParamStore>(m, Precision::kBf16, false, nullptr, TpShard{},
                                                  true, pp_stage(m, s, 3)));
    auto model = Model::create(stores.back().get(), 2, Recompute::kSelective, 0, nullptr, 2);
    EXPECT_EQ(model->stage_activation_elems(), size_t(2 * m.seq_len * m.d_model));
    EXPECT_EQ(model->stage_input(0) == nullptr, s == 0);
    EXPECT_EQ(model->stage_input_grad(0) == nullptr, s == 0);
    EXPECT_EQ(model->stage_output(0) == nullptr, s == 2);
    EXPECT_EQ(model->stage_output_grad(0) == nullptr, s == 2);
    if (s > 0) {
      EXPECT_NE(model->stage_input(0), model->stage_input(1));
      EXPECT_NE(model->stage_input_grad(0), model->stage_input_grad(1));
    }
    if (s < 2) {
      EXPECT_NE(model->stage_output(0), model->stage_output(1));
      EXPECT_NE(model->stage_output_grad(0), model->stage_output_grad(1));
    }
  }
  // The whole model exchanges nothing.
  ParamStore whole(m, Precision::kBf16);
  auto model = Model::create(&whole, 2, Recompute::kNone);
  EXPECT_EQ(model->pp_slots(), 1);
  EXPECT_EQ(model->stage_input(0), nullptr);
  EXPECT_EQ(model->stage_output(0), nullptr);
}

TEST(ModelStageDeathTest, MisusedSlotsStop) {
  const ModelConfig m = gpt2();
  ParamStore last(m, Precision::kFp32, false, nullptr, TpShard{}, true, pp_stage(m, 1, 2));
  last.init(1);
  auto model = Model::create(&last, kMicro, Recompute::kNone, 0, nullptr, 2);
  const Batch b = make_batch(m);
  EXPECT_DEATH(model->stage_backward(0, b.inputs(0), nullptr), "no stage_forward");
  std::vector<float> losses(size_t(kMicro) * b.T);
  model->stage_forward(0, b.inputs(0), b.targets(0), losses.data(), nullptr, 1.0f, false);
  EXPECT_DEATH(model->stage_backward(0, b.inputs(0), nullptr), "without backward");
  EXPECT_DEATH(
      model->stage_forward(2, b.inputs(0), b.targets(0), losses.data(), nullptr, 1.0f, true),
      "slot 2 not in 0..1");
  EXPECT_DEATH(model->forward_backward(b.inputs(0), b.targets(0), 1.0f, losses.data(), nullptr),
               "stage_forward");
  ParamStore whole(m, Precision::kFp32);
  EXPECT_DEATH(Model::create(&whole, kMicro, Recompute::kNone, 0, nullptr, 2), "pp_slots");
}

// plan_activation_memory with a stage and pp_slots is what the stage's model allocates (host
// memory counted by the runtime), and its in-flight part grows with the slots.
TEST(ModelStage, PlanIsWhatTheStageAllocates) {
  Runtime& host = host_runtime();
  for (const ModelConfig& m : {gpt2(4), llama(4)}) {
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
        for (int P : {1, 2, 3, 4}) {
          for (int s = 0; s < P; ++s) {
            for (int slots : {1, 3}) {
              if (P == 1 && slots > 1) continue;
              const PpStage stage = pp_stage(m, s, P);
              SCOPED_TRACE(::testing::Message() << arch_name(m.arch) << " " << precision_name(p)
                                                << " " << recompute_name(r) << " stage " << s << "/"
                                                << P << " slots " << slots);
              ParamStore params(m, p, false, nullptr, TpShard{}, true, stage);
              const size_t before = host.memory().in_use;
              auto model = Model::create(&params, 3, r, 0, nullptr, slots);
              const size_t allocated = host.memory().in_use - before;
              const ActivationMemory plan =
                  plan_activation_memory(m, 3, p, r, 1, Device::kCpu, stage, slots);
              EXPECT_EQ(allocated, plan.total());
              EXPECT_EQ(model->activation_memory().total(), plan.total());
              if (slots == 3) {
                const ActivationMemory one =
                    plan_activation_memory(m, 3, p, r, 1, Device::kCpu, stage, 1);
                const size_t per_slot = (plan.kept_bytes - one.kept_bytes) / 2;
                EXPECT_EQ(plan.kept_bytes, one.kept_bytes + 2 * per_slot);
                EXPECT_GT(per_slot, 0u);
                EXPECT_EQ(plan.recompute_bytes, one.recompute_bytes);
                EXPECT_EQ(plan.working_bytes, one.working_bytes);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::engine
