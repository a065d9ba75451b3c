// The engine's device seam (engine/device/runtime.h): device selection and its error, backend
// memory, staged batches, parameter-store host access; on a GPU also the same model and optimizer
// step on the CPU and on the GPU from the same initial bits (losses, gradients and weights within
// stated tolerances). Without a usable GPU the GPU cases are skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "engine/config/train_config.h"
#include "engine/data/device_batches.h"
#include "engine/data/step_batches.h"
#include "engine/device/runtime.h"
#include "engine/model/model.h"
#include "engine/model/optimizer.h"
#include "engine/model/params.h"
#include "engine/model/rng.h"
#include "engine/parallel/zero.h"

namespace kiln::engine {
namespace {

// Whether a failed runtime_for(kCuda) means "no GPU here" (a skip) rather than a broken CUDA
// module (a failure: the module must load wherever it was built).
bool no_gpu_here(const std::string& msg) {
  return msg.find(cuda_compiled() ? "no usable GPU" : "built without CUDA") != std::string::npos ||
         msg.find("no CUDA device") != std::string::npos;
}

// The CUDA backend, or nullptr with the reason it is unusable in *why.
Runtime* gpu(std::string* why) {
  auto b = runtime_for(Device::kCuda);
  if (b.is_ok()) return *b;
  *why = b.status().to_string();
  EXPECT_TRUE(no_gpu_here(b.status().message())) << "the CUDA module did not load: " << *why;
  return nullptr;
}

#define REQUIRE_GPU(var)     \
  std::string why_;          \
  Runtime* var = gpu(&why_); \
  if (var == nullptr) GTEST_SKIP() << "no GPU: " << why_

std::vector<Runtime*> backends() {
  std::vector<Runtime*> out{&host_runtime()};
  std::string why;
  if (Runtime* g = gpu(&why)) out.push_back(g);
  return out;
}

template <typename T>
std::vector<T> to_host(Runtime& rt, const T* p, size_t n) {
  std::vector<T> h(n);
  rt.copy_to_host(h.data(), p, n * sizeof(T));
  return h;
}

TEST(Device, ParseNamesAndErrors) {
  EXPECT_EQ(*parse_device("cpu"), Device::kCpu);
  EXPECT_EQ(*parse_device("cuda"), Device::kCuda);
  auto bad = parse_device("tpu");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kConfig);
  EXPECT_EQ(bad.status().key(), "device");
  EXPECT_STREQ(device_name(Device::kCuda), "cuda");
  ASSERT_TRUE(runtime_for(Device::kCpu).is_ok());
  EXPECT_EQ((*runtime_for(Device::kCpu))->device(), Device::kCpu);
}

// Without CUDA (build or GPU), asking for it is an error that names `device` and says why.
TEST(Device, CudaUnavailableNamesDeviceAndReason) {
  auto b = runtime_for(Device::kCuda);
  if (b.is_ok()) {
    EXPECT_EQ((*b)->device(), Device::kCuda);
    EXPECT_NE((*b)->describe().find("cuda"), std::string::npos);
    GTEST_SKIP() << "a GPU is usable here: " << (*b)->describe();
  }
  EXPECT_EQ(b.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(b.status().key(), "device");
  EXPECT_TRUE(no_gpu_here(b.status().message())) << b.status().message();
}

// Out of memory stops the process naming what was allocated and its size (the preflight's
// estimate was short of it, or something else took the memory).
TEST(DeviceDeathTest, OutOfHostMemoryNamesTheBuffer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(host_runtime().allocate(uint64_t{1} << 62, "blocks.3.master"),
               "out of host memory allocating 4611686018427387904 bytes for blocks.3.master");
}

TEST(Device, MemoryFillCopyAndAccounting) {
  for (Runtime* rt : backends()) {
    SCOPED_TRACE(rt->describe());
    const size_t before = rt->memory().in_use;
    {
      DeviceArray<float> a(rt, 1000);
      EXPECT_EQ(rt->memory().in_use, before + 4000);
      EXPECT_GE(rt->memory().peak, before + 4000);
      auto h = to_host(*rt, a.data(), 1000);
      EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](float v) { return v == 0.0f; }));
      rt->fill(a.data() + 10, 2.5f, 5);
      std::vector<float> src(1000);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
      h = to_host(*rt, a.data(), 1000);
      EXPECT_EQ(h[9], 0.0f);
      EXPECT_EQ(h[10], 2.5f);
      EXPECT_EQ(h[14], 2.5f);
      EXPECT_EQ(h[15], 0.0f);
      rt->copy_to_device(a.data(), src.data(), 4000);
      EXPECT_EQ(to_host(*rt, a.data(), 1000), src);
      a.zero();
      EXPECT_EQ(to_host(*rt, a.data(), 1000)[999], 0.0f);
      DeviceArray<float> moved = std::move(a);
      EXPECT_TRUE(a.empty());
      EXPECT_EQ(moved.size(), 1000u);
    }
    EXPECT_EQ(rt->memory().in_use, before);
  }
}

TEST(Device, StagedBatchesRoundTrip) {
  for (Runtime* rt : backends()) {
    SCOPED_TRACE(rt->describe());
    const int rows = 3, T = 7;
    DeviceBatches staged(rt, rows, T);
    std::vector<MicroBatch> mb(3);
    for (size_t k = 0; k < mb.size(); ++k) {
      mb[k].rows = rows;
      mb[k].seq_len = T;
      for (int i = 0; i < rows * T; ++i) {
        mb[k].inputs.push_back(static_cast<int32_t>(100 * k + i));
        mb[k].targets.push_back(static_cast<int32_t>(1000 * k + i));
      }
    }
    for (int step = 0; step < 2; ++step) {  // buffers are reused by the next step
      for (size_t k = 0; k < mb.size(); ++k) staged.upload(k, mb[k]);
      for (size_t k = 0; k < mb.size(); ++k) {
        auto tok = staged.at(k);
        EXPECT_EQ(to_host(*rt, tok.inputs, rows * T), mb[k].inputs);
        EXPECT_EQ(to_host(*rt, tok.targets, rows * T), mb[k].targets);
        rt->fill(staged.losses(k), static_cast<float>(k + step), rows * T);
      }
      std::vector<float> losses(mb.size() * rows * T);
      staged.download_losses(mb.size(), losses.data());
      EXPECT_EQ(losses[0], static_cast<float>(step));
      EXPECT_EQ(losses[2 * rows * T], static_cast<float>(2 + step));
      // The host view (pinned copy on a GPU, the buffer itself on the CPU), of fewer micro-batches.
      const float* host = staged.host_losses(2);
      EXPECT_EQ(host[0], static_cast<float>(step));
      EXPECT_EQ(host[rows * T + 1], static_cast<float>(1 + step));
      EXPECT_EQ(std::vector<float>(host, host + 2 * rows * T),
                std::vector<float>(losses.begin(), losses.begin() + 2 * rows * T));
    }
  }
}

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 67;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.seq_len = 16;
  return m;
}

// The next step's batches drawn and uploaded on a second thread (on a GPU: bound to the same
// device, the copy stream, two sets of upload slots) while "compute" reads the current step's:
// every step's device tokens are the source's next batches, and a weight change drops the draw
// ahead (the source goes back first).
TEST(Device, StepBatchesDrawAheadOnASecondThread) {
  TrainConfig c;
  c.model = small_model();
  c.data.micro_batch = 3;
  for (Runtime* rt : backends()) {
    SCOPED_TRACE(rt->describe());
    auto ref_src = make_synthetic_source(c.data, c.model, c.run.seed),
         src = make_synthetic_source(c.data, c.model, c.run.seed);
    const int64_t B = c.data.micro_batch, T = c.model.seq_len, V = c.model.vocab_size;
    const size_t n = static_cast<size_t>(B * T);
    StepBatches sb(src.get(), rt, B, T, V, /*prefetch=*/true);
    for (int step = 1; step <= 6; ++step) {
      SCOPED_TRACE(step);
      if (step == 4) {
        const loader::DomainWeights w{{src->domains()[0], 1.0}};
        ASSERT_TRUE(ref_src->set_weights(w).is_ok());
        ASSERT_TRUE(sb.set_weights(w).is_ok());
      }
      const auto d = sb.take(5);
      ASSERT_TRUE(d.status.is_ok()) << d.status.to_string();
      EXPECT_EQ(d.prefetched, step != 1 && step != 4);
      sb.prefetch(5);  // drawn and uploaded while the device tokens below are read
      for (size_t i = 0; i < 5; ++i) {
        MicroBatch want;
        ASSERT_TRUE(ref_src->next(&want).is_ok());
        const auto tok = sb.staged().at(i);
        // A kernel-ordered read: the device copy after the compute stream waited for the upload.
        DeviceArray<int32_t> got(rt, 2 * n);
        rt->copy(got.data(), tok.inputs, 2 * n * sizeof(int32_t));
        const std::vector<int32_t> h = to_host(*rt, got.data(), 2 * n);
        ASSERT_EQ(std::vector<int32_t>(h.begin(), h.begin() + n), want.inputs)
            << "micro-batch " << i;
        ASSERT_EQ(std::vector<int32_t>(h.begin() + n, h.end()), want.targets)
            << "micro-batch " << i;
      }
    }
    EXPECT_EQ(sb.prefetched_steps(), 4);
    EXPECT_EQ(sb.discarded(), 5);
  }
}

// Initialisation is generated on the host: every backend starts from the same bits, and the
// host view / upload pair round-trips.
// ZeRO-1/2/3 (one rank) updates every tensor range with the backend's multi-tensor AdamW
// (engine/parallel/zero.cc): three steps give the same bits as AdamW on the whole store, on every
// backend (on a GPU: the same multi-tensor launch over the shards' ranges), fp32 and bf16
// (the low-precision copy the stages 1-2 keep in the full unit, too).
TEST(Device, ZeroStagesMatchAdamWBitForBit) {
  auto group = comm::make_local_group();
  OptimizerConfig oc;
  oc.clip_grad = 0.5f;  // clipped: grad_scale != 1
  for (Runtime* rt : backends()) {
    for (Precision prec : {Precision::kFp32, Precision::kBf16}) {
      for (int stage = 1; stage <= 3; ++stage) {
        SCOPED_TRACE(rt->describe() + " " + precision_name(prec) + " stage " +
                     std::to_string(stage));
        ParamStore ref(small_model(), prec, false, rt);
        ParamStore zp(small_model(), prec, false, rt, {}, /*allocate=*/false);
        ref.init(11);
        InitSource init(zp, 11);  // ZeRO builds its states from the initialisation
        AdamW adamw(oc);
        auto made = ZeroOptimizer::create(zp, init, *group, oc, stage, 1);
        ASSERT_TRUE(made.is_ok()) << made.status().to_string();
        ZeroOptimizer& zero = **made;
        const auto& tensors = ref.tensors();
        for (int step = 1; step <= 3; ++step) {
          ref.zero_grads();
          zero.zero_grads();
          for (size_t t = 0; t < tensors.size(); ++t) {
            std::vector<float> g(tensors[t].numel);
            for (size_t i = 0; i < g.size(); ++i)
              g[i] = static_cast<float>(random_normal(step, t, i));
            ref.upload(static_cast<int>(t), ParamField::kGrad, g.data());
            rt->copy_to_device(zero.shard_grad(tensors[t].unit) + tensors[t].offset, g.data(),
                               g.size() * sizeof(float));
          }
          const StepStats a = adamw.inspect(ref, 1.0);
          auto b = zero.inspect(1.0);
          ASSERT_TRUE(b.is_ok()) << b.status().to_string();
          ASSERT_EQ(a.grad_norm, b->grad_norm);
          ASSERT_LT(a.clip_coef, 1.0);
          adamw.apply(ref, 1e-3, 1.0, a);
          ASSERT_TRUE(zero.apply(1e-3, 1.0, *b, step).is_ok());
        }
        // The shards (one rank: whole units, zero-padded) against the reference store.
        std::deque<std::vector<float>> scratch;
        const auto views = zero.checkpoint_partition(&scratch);
        ASSERT_EQ(views.size(), 3 * ref.units().size());
        std::vector<float> s1;
        for (size_t t = 0; t < tensors.size(); ++t) {
          const ParamField fields[] = {ParamField::kMaster, ParamField::kExpAvg,
                                       ParamField::kExpAvgSq};
          for (int f = 0; f < 3; ++f) {
            const float* want = ref.host_view(static_cast<int>(t), fields[f], &s1);
            const float* got =
                static_cast<const float*>(views[3 * tensors[t].unit + f].data) + tensors[t].offset;
            ASSERT_EQ(0, std::memcmp(want, got, tensors[t].numel * 4))
                << tensors[t].name << " " << views[3 * tensors[t].unit + f].name;
          }
        }
        if (prec != Precision::kFp32 && stage < 3) {
          for (size_t u = 0; u < ref.units().size(); ++u) {
            auto want = to_host(*rt, ref.units()[u].lp.data(), ref.units()[u].numel);
            auto got = to_host(*rt, zp.units()[u].lp.data(), zp.units()[u].numel);
            ASSERT_EQ(want, got) << ref.units()[u].name << " low-precision copy";
          }
        }
      }
    }
  }
}

TEST(Device, ParamStoreInitAndHostAccess) {
  ParamStore ref(small_model(), Precision::kBf16);
  ref.init(5);
  for (Runtime* rt : backends()) {
    SCOPED_TRACE(rt->describe());
    ParamStore p(small_model(), Precision::kBf16, false, rt);
    p.init(5);
    std::vector<float> s1, s2;
    for (size_t t = 0; t < p.tensors().size(); ++t) {
      const int ti = static_cast<int>(t);
      const size_t n = p.tensors()[t].numel;
      const float* a = p.host_view(ti, ParamField::kMaster, &s1);
      const float* b = ref.host_view(ti, ParamField::kMaster, &s2);
      ASSERT_EQ(0, std::memcmp(a, b, n * 4)) << p.tensors()[t].name;
    }
    // Low-precision copy: the same rounding on every backend.
    for (size_t u = 0; u < p.units().size(); ++u) {
      auto lp = to_host(*rt, p.units()[u].lp.data(), p.units()[u].numel);
      ASSERT_EQ(0, std::memcmp(lp.data(), ref.units()[u].lp.data(), lp.size() * 2));
    }
    std::vector<float> vals(p.tensors()[0].numel);
    for (size_t i = 0; i < vals.size(); ++i) vals[i] = 0.5f * static_cast<float>(i);
    p.upload(0, ParamField::kExpAvgSq, vals.data());
    const float* back = p.host_view(0, ParamField::kExpAvgSq, &s1);
    EXPECT_EQ(0, std::memcmp(back, vals.data(), vals.size() * 4));
  }
}

struct StepResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads, weights;
  double grad_norm = 0;
};

// One forward+backward and one AdamW step of the small model on `be`, from seed 7.
StepResult one_step(Runtime* rt, Precision p) {
  const ModelConfig m = small_model();
  ParamStore params(m, p, false, rt);
  params.init(7);
  const int B = 2, T = static_cast<int>(m.seq_len);
  auto model = Model::create(&params, B, Recompute::kSelective);
  MicroBatch mb;
  mb.rows = B;
  mb.seq_len = T;
  for (int i = 0; i < B * T; ++i) {
    mb.inputs.push_back(static_cast<int32_t>(random_bits(9, 1, i) % m.vocab_size));
    mb.targets.push_back(static_cast<int32_t>(random_bits(9, 2, i) % m.vocab_size));
  }
  mb.targets[3] = -1;
  DeviceBatches staged(rt, B, T);
  staged.upload(0, mb);
  params.zero_grads();
  auto tok = staged.at(0);
  model->forward_backward(tok.inputs, tok.targets, 1.0f / (B * T - 1), staged.losses(0));
  StepResult r;
  r.losses.resize(B * T);
  staged.download_losses(1, r.losses.data());
  std::vector<float> scratch;
  for (size_t t = 0; t < params.tensors().size(); ++t) {
    const float* g = params.host_view(static_cast<int>(t), ParamField::kGrad, &scratch);
    r.grads.emplace_back(g, g + params.tensors()[t].numel);
  }
  OptimizerConfig oc;
  AdamW opt(oc);
  StepStats st = opt.step(params, 1e-3, 1.0);
  r.grad_norm = st.grad_norm;
  for (size_t t = 0; t < params.tensors().size(); ++t) {
    const float* w = params.host_view(static_cast<int>(t), ParamField::kMaster, &scratch);
    r.weights.emplace_back(w, w + params.tensors()[t].numel);
  }
  return r;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1e-6, err = 0;
  for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::fabs(double(b[i])));
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::fabs(double(a[i]) - b[i]));
  return err / scale;
}

// The same step on the GPU and on the CPU. fp32: both accumulate in fp32 in different orders,
// so losses agree to 1e-5 and gradients to 1e-4 of each tensor's largest value; bf16 rounds
// activations at every op, so 2e-2 (losses, relative) and 5e-2 (gradients).
void expect_step_parity(Runtime* g, Precision p, double loss_tol, double grad_tol) {
  SCOPED_TRACE(precision_name(p));
  StepResult c = one_step(&host_runtime(), p), d = one_step(g, p);
  EXPECT_LT(max_rel(d.losses, c.losses), loss_tol);
  for (size_t t = 0; t < c.grads.size(); ++t) {
    EXPECT_LT(max_rel(d.grads[t], c.grads[t]), grad_tol) << "grad of tensor " << t;
    // AdamW's first step moves a weight by lr * g / (|g| + eps) (plus decay): for a gradient that
    // is not tiny, the same on both devices to 1e-6; a tiny gradient may flip sign.
    float gmax = 0;
    for (float v : c.grads[t]) gmax = std::max(gmax, std::fabs(v));
    int bad = 0;
    for (size_t i = 0; i < c.weights[t].size(); ++i) {
      if (std::fabs(c.grads[t][i]) < 1e-2f * gmax) continue;
      bad += std::fabs(d.weights[t][i] - c.weights[t][i]) > 1e-6f;
    }
    EXPECT_EQ(bad, 0) << "weights of tensor " << t;
  }
  EXPECT_NEAR(d.grad_norm, c.grad_norm, grad_tol * c.grad_norm);
}

TEST(DeviceGpu, ModelStepMatchesCpuFp32) {
  REQUIRE_GPU(g);
  expect_step_parity(g, Precision::kFp32, 1e-5, 1e-4);
}

TEST(DeviceGpu, ModelStepMatchesCpuBf16) {
  REQUIRE_GPU(g);
  expect_step_parity(g, Precision::kBf16, 2e-2, 5e-2);
}

// Deterministic by default: the same step twice on the GPU gives the same bits.
TEST(DeviceGpu, StepIsBitReproducible) {
  REQUIRE_GPU(g);
  StepResult a = one_step(g, Precision::kBf16), b = one_step(g, Precision::kBf16);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.weights, b.weights);
}

}  // namespace
}  // namespace kiln::engine
