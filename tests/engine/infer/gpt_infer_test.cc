// engine/infer/gpt_infer.h: the cached forward (one token at a time after a prefill) gives the
// full forward's logits within fp32 round-off at every step, so greedy decoding with the cache
// equals argmax of the full forward at each step; the inference forward's token losses equal
// the training model's (engine/model/model.h Model::forward) on the same weights; sampling is
// deterministic per seed and its settings do what they say. On a GPU (GptInferenceCuda: skipped
// with the reason where none is usable; tools/gpu_check's infer row runs them) the same model on
// the CUDA backend gives the CPU's logits, token losses, eval numbers and greedy tokens, and its
// own cache equals its own full forward.
#include "engine/infer/gpt_infer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <set>
#include <tuple>

#include "engine/checkpoint/checkpoint.h"
#include "engine/device/runtime.h"
#include "engine/infer/eval_tasks.h"
#include "engine/model/model.h"
#include "kernels/ops.h"
#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {

namespace fs = std::filesystem;

// llama: grouped-query attention (4 query heads, 2 key/value heads), RoPE, RMSNorm, SwiGLU, an
// untied head, no biases.
ModelConfig model(bool llama = false) {
  ModelConfig m;
  if (llama) {
    m.arch = Arch::kLlama;
    m.n_kv_heads = 2;
    m.ffn_hidden = 48;
    m.tie_embeddings = false;
    m.bias = false;
  }
  m.vocab_size = 96;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.seq_len = 24;
  m.init_std = 0.3f;  // large weights: peaked, input-dependent logits
  return m;
}

struct Loaded {
  std::string root;
  std::unique_ptr<ParamStore> whole;
  ModelWeights weights;
  std::unique_ptr<GptInference> infer;
};

Loaded load(const std::string& name, bool llama = false) {
  Loaded l;
  l.root = test::temp_dir("infer", name + (llama ? "_llama" : ""));
  l.whole = std::make_unique<ParamStore>(model(llama), Precision::kFp32);
  l.whole->init(5);
  TrainerState st;
  EXPECT_TRUE(save_checkpoint(l.root, *l.whole, st, "# test\n", 0).is_ok());
  auto w = open_model_weights(l.root);  // the run directory: its latest checkpoint
  EXPECT_TRUE(w.is_ok()) << w.status().to_string();
  l.weights = std::move(w).value();
  EXPECT_EQ(l.weights.kind, "checkpoint");
  auto g = GptInference::load(l.weights);
  EXPECT_TRUE(g.is_ok());
  l.infer = std::move(g).value();
  return l;
}

std::vector<int32_t> tokens(int n, int seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 37 + seed * 11 + 5) % 96;
  return t;
}

void cached_steps(bool llama) {
  Loaded l = load("cache", llama);
  const int V = 96, T = 24;
  const std::vector<int32_t> seq = tokens(T, 1);
  std::vector<float> full(static_cast<size_t>(T) * V), step(V);
  l.infer->forward_full(seq.data(), T, full.data());
  auto cache = l.infer->new_cache();
  const int prefill = 5;
  double worst = 0, scale = 0;
  for (int p = prefill; p <= T; ++p) {
    if (p == prefill) {
      l.infer->step(seq.data(), prefill, &cache, step.data());
    } else {
      l.infer->step(seq.data() + p - 1, 1, &cache, step.data());
    }
    for (int v = 0; v < V; ++v) {
      const float want = full[static_cast<size_t>(p - 1) * V + v];
      worst = std::max(worst, static_cast<double>(std::abs(step[v] - want)));
      scale = std::max(scale, static_cast<double>(std::abs(want)));
    }
  }
  EXPECT_EQ(cache.len, T);
  // fp32 round-off of a different summation order (the attention kernel's blocked online
  // softmax vs the cache's direct one) through 2 blocks.
  EXPECT_LE(worst, 1e-5 * std::max(1.0, scale)) << "logit scale " << scale;
  EXPECT_GT(scale, 1.0);
  fs::remove_all(l.root);
}

void greedy_steps(bool llama) {
  Loaded l = load("greedy", llama);
  const int V = 96;
  GenerateOptions o;
  o.max_tokens = 20;
  o.sampling.temperature = 0;
  const std::vector<int32_t> prompt = tokens(4, 2);
  std::vector<int32_t> cached, again, nocache;
  ASSERT_TRUE(generate(*l.infer, prompt, o, [&](int32_t t) { cached.push_back(t); }).is_ok());
  ASSERT_TRUE(generate(*l.infer, prompt, o, [&](int32_t t) { again.push_back(t); }).is_ok());
  o.use_cache = false;
  ASSERT_TRUE(generate(*l.infer, prompt, o, [&](int32_t t) { nocache.push_back(t); }).is_ok());
  EXPECT_EQ(cached.size(), 20u);
  EXPECT_EQ(cached, again);
  EXPECT_EQ(cached, nocache);
  // Each token is the argmax of the full forward of what precedes it.
  std::vector<int32_t> seq = prompt;
  for (int32_t t : cached) {
    std::vector<float> logits(seq.size() * V);
    l.infer->forward_full(seq.data(), static_cast<int>(seq.size()), logits.data());
    const float* last = logits.data() + (seq.size() - 1) * V;
    EXPECT_EQ(t, std::max_element(last, last + V) - last);
    seq.push_back(t);
  }
  // Not a constant: the model's output depends on its input.
  EXPECT_GT(std::set<int32_t>(cached.begin(), cached.end()).size(), 1u);
  // Generation stops at the context (24 positions: 4 + 20 = 24 fits exactly, 21 does not).
  o.use_cache = true;
  o.max_tokens = 100;
  GenerateStats st;
  std::vector<int32_t> out;
  ASSERT_TRUE(generate(
                  *l.infer, prompt, o, [&](int32_t t) { out.push_back(t); }, &st)
                  .is_ok());
  EXPECT_EQ(st.stop, "context");
  EXPECT_EQ(out.size(), 21u);  // the 21st token is predicted from 24 positions
  // And at end-of-text: the first greedy token as eos stops at once.
  o.eos_id = cached[0];
  out.clear();
  ASSERT_TRUE(generate(
                  *l.infer, prompt, o, [&](int32_t t) { out.push_back(t); }, &st)
                  .is_ok());
  EXPECT_EQ(st.stop, "eos");
  EXPECT_EQ(out.size(), 1u);
  fs::remove_all(l.root);
}

void token_losses(bool llama) {
  Loaded l = load("losses", llama);
  const int T = 24;
  const std::vector<int32_t> seq = tokens(T + 1, 3);
  std::vector<float> nll(T);
  l.infer->token_nll(seq.data(), T + 1, nll.data());
  auto m = Model::create(l.whole.get(), 1, Recompute::kNone);
  std::vector<float> losses(T);
  m->forward(seq.data(), seq.data() + 1, losses.data());
  for (int i = 0; i < T; ++i)
    EXPECT_NEAR(nll[i], losses[i], 2e-5f * std::max(1.0f, losses[i])) << i;
  // sequence_nll predicts every token once (windows of seq_len), after bos when given.
  const std::vector<int32_t> longer = tokens(3 * T + 5, 4);
  int64_t n = 0;
  const double total = sequence_nll(*l.infer, 7, longer, &n);
  EXPECT_EQ(n, static_cast<int64_t>(longer.size()));
  EXPECT_GT(total, 0);
  fs::remove_all(l.root);
}

TEST(GptInference, CachedStepsGiveTheFullForwardsLogits) { cached_steps(false); }
TEST(GptInference, GreedyWithTheCacheIsArgmaxOfTheFullForwardAtEachStep) { greedy_steps(false); }
TEST(GptInference, TokenLossesEqualTheTrainingForwards) { token_losses(false); }
// Llama: RoPE at the cache position (rope_rows), GQA over the cache, RMSNorm, SwiGLU, the
// untied head.
TEST(GptInference, LlamaCachedStepsGiveTheFullForwardsLogits) { cached_steps(true); }
TEST(GptInference, LlamaGreedyWithTheCacheIsArgmaxOfTheFullForwardAtEachStep) {
  greedy_steps(true);
}
TEST(GptInference, LlamaTokenLossesEqualTheTrainingForwards) { token_losses(true); }

// The decode step's rotation is the rope_forward operator's at the same positions within fp32
// round-off (a row rotated at position p alone equals row p of the operator over positions
// 0..T-1; values of magnitude up to 2), for
// multi-head, grouped-query and multi-query layouts and a large theta.
TEST(GptInference, RopeRowsEqualTheOperatorAtTheSamePositions) {
  for (auto [NH, NKV, hs, theta] : {std::tuple{4, 4, 8, 10000.0}, std::tuple{4, 2, 16, 500000.0},
                                    std::tuple{6, 1, 4, 10000.0}}) {
    const int T = 37, W = (NH + 2 * NKV) * hs;
    std::vector<float> qkv(static_cast<size_t>(T) * W);
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.37f * i + 0.1f) * 2.0f;
    std::vector<float> op = qkv;
    cpu::rope_forward(op.data(), nullptr, static_cast<float>(theta), 1, T, NH, NKV, hs);
    // One row at a time at its position, and a block of rows from position 30.
    std::vector<float> rows = qkv;
    for (int t = 0; t < 30; ++t)
      rope_rows(rows.data() + static_cast<size_t>(t) * W, 1, t, theta, NH, NKV, hs);
    rope_rows(rows.data() + static_cast<size_t>(30) * W, T - 30, 30, theta, NH, NKV, hs);
    // (The same fp64 angles rounded to fp32; the rotation's two products may be fused into one
    // rounding differently by the compiler: within an ulp or two of the operands' scale.)
    double worst = 0;
    for (size_t i = 0; i < qkv.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(op[i] - rows[i])));
    EXPECT_LE(worst, 2.5e-7) << NH << "/" << NKV << " hs " << hs;
    EXPECT_NE(op, qkv);  // it rotated something
  }
}

// ---- the CUDA backend ----------------------------------------------------------------------

// Whether a failed load on cuda means "no GPU here" (a skip) rather than a broken CUDA module (a
// failure: the module must load wherever it was built).
bool no_gpu_here(const std::string& msg) {
  return msg.find(cuda_compiled() ? "no usable GPU" : "built without CUDA") != std::string::npos ||
         msg.find("no CUDA device") != std::string::npos;
}

// The model of `w` on the GPU, or nullptr with the reason none is usable in *why.
std::unique_ptr<GptInference> on_gpu(ModelWeights& w, std::string* why) {
  auto g = GptInference::load(w, Device::kCuda);
  if (g.is_ok()) return std::move(g).value();
  *why = g.status().to_string();
  EXPECT_TRUE(no_gpu_here(g.status().message())) << "the CUDA module did not load: " << *why;
  return nullptr;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

// Without a GPU (or a build without CUDA), asking for one is refused naming `device` with the
// reason; with one, the model is on it. (No skip: this holds on every machine.)
TEST(GptInferenceCuda, CudaIsRefusedNamingDeviceWhereNoGpuIsUsable) {
  Loaded l = load("cuda_refusal");
  auto g = GptInference::load(l.weights, Device::kCuda);
  if (g.is_ok()) {
    EXPECT_EQ((*g)->device(), Device::kCuda);
  } else {
    EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(g.status().key(), "device");
    EXPECT_TRUE(no_gpu_here(g.status().message())) << g.status().to_string();
  }
  EXPECT_EQ(l.infer->device(), Device::kCpu);
  fs::remove_all(l.root);
}

// fp32 on both devices, no TF32 (kernels/cuda/matmul.cu): the GEMMs and reductions sum in other
// orders, so logits and losses agree to fp32 round-off of the model's scale, not bit for bit.
void cuda_equals_cpu(bool llama) {
  Loaded l = load("cuda_vs_cpu", llama);
  std::string why;
  std::unique_ptr<GptInference> gpu = on_gpu(l.weights, &why);
  if (!gpu) {
    fs::remove_all(l.root);
    GTEST_SKIP() << "no GPU: " << why;
  }
  const int V = 96, T = 24;
  GptInference& cpu = *l.infer;
  // The full forward's logits.
  const std::vector<int32_t> seq = tokens(T, 5);
  std::vector<float> lc(static_cast<size_t>(T) * V), lg(lc.size());
  cpu.forward_full(seq.data(), T, lc.data());
  gpu->forward_full(seq.data(), T, lg.data());
  const double scale = std::max(1.0, max_abs(lc));
  EXPECT_LE(max_diff(lc, lg), 1e-5 * scale) << "logit scale " << scale;
  // The GPU's cache (its own attention and RoPE kernels) against its own full forward.
  auto cache = gpu->new_cache();
  std::vector<float> step(V);
  double worst = 0;
  for (int p = 5; p <= T; ++p) {
    if (p == 5) {
      gpu->step(seq.data(), 5, &cache, step.data());
    } else {
      gpu->step(seq.data() + p - 1, 1, &cache, step.data());
    }
    for (int v = 0; v < V; ++v) {
      worst = std::max(
          worst, static_cast<double>(std::abs(step[v] - lg[static_cast<size_t>(p - 1) * V + v])));
    }
  }
  EXPECT_EQ(cache.len, T);
  EXPECT_LE(worst, 1e-5 * scale);
  // Token losses (kiln eval's numbers) and a sequence's total over windows.
  const std::vector<int32_t> s1 = tokens(T + 1, 6);
  std::vector<float> nc(T), ng(T);
  cpu.token_nll(s1.data(), T + 1, nc.data());
  gpu->token_nll(s1.data(), T + 1, ng.data());
  for (int i = 0; i < T; ++i) EXPECT_NEAR(nc[i], ng[i], 2e-5f * std::max(1.0f, nc[i])) << i;
  const std::vector<int32_t> longer = tokens(3 * T + 5, 7);
  int64_t n_cpu = 0, n_gpu = 0;
  const double total_cpu = sequence_nll(cpu, 7, longer, &n_cpu);
  const double total_gpu = sequence_nll(*gpu, 7, longer, &n_gpu);
  EXPECT_EQ(n_cpu, n_gpu);
  EXPECT_NEAR(total_cpu, total_gpu, 1e-5 * total_cpu);
  // Multiple choice (kiln eval --tasks): the same accuracies.
  const std::vector<McExample> ex = {
      {"ab", {"cd", "ef", "gh"}, 0}, {"xyz", {"q", "rs"}, 1}, {"", {"hello", "world"}, 0}};
  auto encode = [](std::string_view text) {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c) % 96));
    return ids;
  };
  const McResult mc = score_mc(cpu, ex, encode, 7), mg = score_mc(*gpu, ex, encode, 7);
  EXPECT_EQ(mc.examples, mg.examples);
  EXPECT_EQ(mc.acc, mg.acc);
  EXPECT_EQ(mc.acc_norm, mg.acc_norm);
  // Greedy generation with the cache: the CPU's tokens.
  GenerateOptions o;
  o.max_tokens = 20;
  o.sampling.temperature = 0;
  const std::vector<int32_t> prompt = tokens(4, 2);
  std::vector<int32_t> tc, tg;
  ASSERT_TRUE(generate(cpu, prompt, o, [&](int32_t t) { tc.push_back(t); }).is_ok());
  ASSERT_TRUE(generate(*gpu, prompt, o, [&](int32_t t) { tg.push_back(t); }).is_ok());
  EXPECT_EQ(tc, tg);
  EXPECT_EQ(tg.size(), 20u);
  fs::remove_all(l.root);
}

TEST(GptInferenceCuda, LogitsLossesAndGreedyTokensEqualTheCpus) { cuda_equals_cpu(false); }
TEST(GptInferenceCuda, LlamaLogitsLossesAndGreedyTokensEqualTheCpus) { cuda_equals_cpu(true); }

TEST(Sampler, SeededDeterministicAndTheSettingsHold) {
  const int V = 8;
  std::vector<float> base = {0.1f, 2.0f, 1.9f, -1.0f, 0.5f, 1.0f, 0.0f, -3.0f};
  auto draw = [&](SamplingOptions s, int n) {
    Sampler sm(s);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      std::vector<float> l = base;
      out.push_back(sm.next(l.data(), V, {}));
    }
    return out;
  };
  SamplingOptions s;
  s.seed = 9;
  EXPECT_EQ(draw(s, 200), draw(s, 200));
  SamplingOptions s2 = s;
  s2.seed = 10;
  EXPECT_NE(draw(s, 200), draw(s2, 200));
  auto all = draw(s, 2000);
  EXPECT_GT(std::set<int32_t>(all.begin(), all.end()).size(), 5u);
  s.top_k = 2;  // only ids 1 and 2
  for (int32_t t : draw(s, 300)) EXPECT_TRUE(t == 1 || t == 2) << t;
  s.top_k = 0;
  s.top_p = 0.3;  // id 1 alone carries > 0.3 of the mass... with id 2 close: both at most
  for (int32_t t : draw(s, 300)) EXPECT_TRUE(t == 1 || t == 2) << t;
  s.top_p = 1e-6;
  for (int32_t t : draw(s, 50)) EXPECT_EQ(t, 1);
  s.top_p = 1;
  s.temperature = 0;
  for (int32_t t : draw(s, 5)) EXPECT_EQ(t, 1);
  // A strong repetition penalty on id 1 (seen) makes id 2 the greedy choice.
  Sampler rp(SamplingOptions{0.0, 0, 1.0, 1.5, 0});
  std::vector<float> l = base;
  EXPECT_EQ(rp.next(l.data(), V, {1}), 2);
  EXPECT_FALSE(check_sampling(SamplingOptions{-1, 0, 1, 1, 0}).is_ok());
  EXPECT_FALSE(check_sampling(SamplingOptions{1, 0, 0, 1, 0}).is_ok());
}

}  // namespace
}  // namespace kiln::engine
