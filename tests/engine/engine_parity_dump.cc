// Dumps one engine training setup for the PyTorch parity tests (tests/python/engine_parity.py,
// tests/python/llama_parity.py):
//   engine_parity_dump OUT_DIR PRECISION [gpt2|gpt2-doc_mask|llama]
// writes OUT_DIR/<precision>/{params,batch,grads,steps}.safetensors:
//   params   the fp32 master weights the model starts from (names as engine/model/params.h)
//   batch    inputs, targets (I32, B x T); llama and gpt2-doc_mask: doc_start (I32, B x T),
//            packed documents with model.doc_mask on (llama also GQA: n_kv_heads 2 of 4 heads,
//            untied embeddings, no biases)
//   grads    the fp32 gradient of the mean loss for every parameter (unscaled) and per-token losses
//   steps    the loss and global grad norm of each of 10 AdamW steps with clipping on that batch
// Hyper-parameters travel in the metadata. Exit code 0 on success.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/log.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/model.h"
#include "engine/model/optimizer.h"
#include "engine/model/params.h"
#include "engine/model/rng.h"
#include "kernels/ops.h"

using namespace kiln;
using namespace kiln::engine;

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr,
                 "usage: engine_parity_dump OUT_DIR fp32|bf16|fp16 [gpt2|gpt2-doc_mask|llama]\n");
    return 2;
  }
  const std::string arch = argc == 4 ? argv[3] : "gpt2";
  const bool llama = arch == "llama";
  if (!llama && arch != "gpt2" && arch != "gpt2-doc_mask") {
    std::fprintf(stderr, "unknown architecture %s\n", argv[3]);
    return 2;
  }
  const std::string prec_name = argv[2];
  Precision prec;
  if (prec_name == "fp32")
    prec = Precision::kFp32;
  else if (prec_name == "bf16")
    prec = Precision::kBf16;
  else if (prec_name == "fp16")
    prec = Precision::kFp16;
  else {
    std::fprintf(stderr, "unknown precision %s\n", argv[2]);
    return 2;
  }
  const std::string out = (std::filesystem::path(argv[1]) / prec_name).string();
  std::filesystem::create_directories(out);
  cpu::set_num_threads(2);

  // Odd sizes on purpose: nothing is a power of two except the head count.
  ModelConfig m;
  m.vocab_size = 101;
  m.d_model = 48;
  m.n_layers = 2;
  m.n_heads = 4;
  m.seq_len = 24;
  if (llama) {  // grouped-query (2 key/value heads for 4), untied, no biases, packed documents
    m.arch = Arch::kLlama;
    m.n_kv_heads = 2;
    m.ffn_hidden = 88;
    m.rope_theta = 500.0;  // low, so positions 0..23 turn the pairs through whole circles
    m.norm_eps = 1e-5f;
    m.tie_embeddings = false;
    m.bias = false;
    m.doc_mask = true;
  }
  if (arch == "gpt2-doc_mask") m.doc_mask = true;  // learned positions restart at document starts
  const int B = 3, T = 24;
  const uint64_t seed = 7;
  ParamStore params(m, prec);
  params.init(seed);
  // Non-trivial norm gains and biases, so their use in forward is checked too.
  for (size_t i = 0; i < params.tensors().size(); ++i) {
    const ParamTensor& t = params.tensors()[i];
    float* w = params.master(static_cast<int>(i));
    if (t.role == TensorRole::kNormGain) {
      for (size_t k = 0; k < t.numel; ++k)
        w[k] = 1.0f + 0.1f * float(random_normal(seed, 100 + i, k));
    } else if (t.role == TensorRole::kBias || t.role == TensorRole::kNormBias) {
      for (size_t k = 0; k < t.numel; ++k) w[k] = 0.02f * float(random_normal(seed, 200 + i, k));
    }
  }
  params.sync_low_precision();

  std::vector<TensorView> pv;
  for (size_t i = 0; i < params.tensors().size(); ++i) {
    const ParamTensor& t = params.tensors()[i];
    pv.push_back({t.name, "F32", t.shape, params.master(static_cast<int>(i)), t.numel * 4});
  }
  char theta[64];
  std::snprintf(theta, sizeof theta, "%.17g", m.rope_theta);
  const std::map<std::string, std::string> meta = {{"vocab_size", std::to_string(m.vocab_size)},
                                                   {"d_model", std::to_string(m.d_model)},
                                                   {"n_layers", std::to_string(m.n_layers)},
                                                   {"n_heads", std::to_string(m.n_heads)},
                                                   {"seq_len", std::to_string(m.seq_len)},
                                                   {"precision", prec_name},
                                                   {"arch", arch_name(m.arch)},
                                                   {"n_kv_heads", std::to_string(m.kv_heads())},
                                                   {"ffn_hidden", std::to_string(m.ffn())},
                                                   {"rope_theta", theta},
                                                   {"norm_eps", "1e-5"}};
  Status st = write_safetensors(out + "/params.safetensors", pv, meta);
  if (!st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }

  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    inputs[i] = static_cast<int32_t>(random_bits(seed, 1, i) % m.vocab_size);
    targets[i] = static_cast<int32_t>(random_bits(seed, 2, i) % m.vocab_size);
  }
  // Documents (model.doc_mask): row 0 starts ones at 5 and 13, row 1 is one document, row 2 has a
  // one-token document at 0 and one that starts at the last position.
  const std::vector<std::vector<int32_t>> starts = {{0, 5, 13}, {0}, {0, 1, 23}};
  std::vector<int32_t> doc_start;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      int32_t s = 0;
      for (int32_t x : starts[b])
        if (x <= t) s = x;
      doc_start.push_back(s);
    }
  }
  std::vector<TensorView> bv = {{"inputs", "I32", {B, T}, inputs.data(), inputs.size() * 4},
                                {"targets", "I32", {B, T}, targets.data(), targets.size() * 4}};
  if (m.doc_mask)
    bv.push_back({"doc_start", "I32", {B, T}, doc_start.data(), doc_start.size() * 4});
  st = write_safetensors(out + "/batch.safetensors", bv);
  if (!st.is_ok()) return 1;
  const int32_t* ds = m.doc_mask ? doc_start.data() : nullptr;

  // fp16 runs with a loss scale, as training does; gradients are unscaled before dumping.
  const double loss_scale = prec == Precision::kFp16 ? 1024.0 : 1.0;
  const float dloss = static_cast<float>(loss_scale / (B * T));
  auto model = Model::create(&params, B, Recompute::kNone);
  std::vector<float> losses(B * T);
  params.zero_grads();
  model->forward_backward(inputs.data(), targets.data(), dloss, losses.data(), ds);
  double loss = 0;
  for (float l : losses) loss += l;
  loss /= B * T;
  std::vector<std::vector<float>> grads;
  std::vector<TensorView> gv;
  grads.reserve(params.tensors().size());
  for (size_t i = 0; i < params.tensors().size(); ++i) {
    const ParamTensor& t = params.tensors()[i];
    const float* g = params.grad(static_cast<int>(i));
    grads.emplace_back(g, g + t.numel);
    for (float& x : grads.back()) x = static_cast<float>(x / loss_scale);
    gv.push_back({t.name, "F32", t.shape, grads.back().data(), t.numel * 4});
  }
  gv.push_back({"__losses__", "F32", {B, T}, losses.data(), losses.size() * 4});
  gv.push_back({"__loss__", "F64", {1}, &loss, 8});
  st = write_safetensors(out + "/grads.safetensors", gv,
                         {{"loss_scale", std::to_string(loss_scale)}});
  if (!st.is_ok()) return 1;

  // Ten AdamW steps with clipping on the same batch.
  OptimizerConfig oc;
  oc.lr = 1e-3;
  oc.beta1 = 0.9f;
  oc.beta2 = 0.95f;
  oc.eps = 1e-8f;
  oc.weight_decay = 0.1f;
  oc.clip_grad = 0.5f;
  AdamW opt(oc);
  std::vector<double> step_loss, step_norm;
  for (int k = 0; k < 10; ++k) {
    params.zero_grads();
    model->forward_backward(inputs.data(), targets.data(), dloss, losses.data(), ds);
    double l = 0;
    for (float x : losses) l += x;
    step_loss.push_back(l / (B * T));
    StepStats s = opt.step(params, oc.lr, loss_scale);
    step_norm.push_back(s.grad_norm);
    if (!s.finite) {
      std::fprintf(stderr, "non-finite gradients at step %d\n", k + 1);
      return 1;
    }
  }
  char buf[64];
  std::map<std::string, std::string> om = {{"weight_decay", "0.1"},
                                           {"clip_grad", "0.5"},
                                           {"beta1", "0.9"},
                                           {"beta2", "0.95"},
                                           {"eps", "1e-8"}};
  std::snprintf(buf, sizeof buf, "%.17g", oc.lr);
  om["lr"] = buf;
  st = write_safetensors(out + "/steps.safetensors",
                         {{"loss", "F64", {10}, step_loss.data(), 80},
                          {"grad_norm", "F64", {10}, step_norm.data(), 80}},
                         om);
  if (!st.is_ok()) return 1;
  std::printf("%s: loss %.7f, step losses %.7f .. %.7f\n", prec_name.c_str(), loss, step_loss[0],
              step_loss[9]);
  return 0;
}
