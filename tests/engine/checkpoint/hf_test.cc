// engine/checkpoint/hf.h: a checkpoint exported as a Hugging Face directory imports back to the
// same weights bit for bit (fp32; bf16 rounds as cast() does), on one rank and as the slices of
// tensor-parallel ranks, from one model.safetensors or shards with an index; the export's names
// and layouts follow GPT-2's (Conv1D [in, out], fused c_attn); what Kiln cannot represent is
// refused naming the file and the field.
#include "engine/checkpoint/hf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/safetensors.h"
#include "kernels/ops.h"
#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {

namespace fs = std::filesystem;

// 4 heads, vocabulary 96: splits over 2 tensor-parallel ranks.
ModelConfig model() {
  ModelConfig m;
  m.vocab_size = 96;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.seq_len = 12;
  return m;
}

struct Fixture {
  std::string root, run, step;
  std::unique_ptr<ParamStore> whole;
};

// A checkpoint (P = 1) of an initialised model with a distinct value in every element.
// A llama of grouped-query attention (4 query heads, 2 key/value heads), SwiGLU 48 wide, an
// untied head, with biases (attention_bias and mlp_bias) so that every row block is exercised.
ModelConfig llama_model() {
  ModelConfig m = model();
  m.arch = Arch::kLlama;
  m.n_kv_heads = 2;
  m.ffn_hidden = 48;
  m.tie_embeddings = false;
  m.bias = true;
  m.norm_eps = 1e-6f;
  m.rope_theta = 500000.0;
  return m;
}

Fixture make_checkpoint(const std::string& name, const ModelConfig& mc = model()) {
  Fixture f;
  f.root = test::temp_dir("hf", name);
  f.run = f.root + "/run";
  f.whole = std::make_unique<ParamStore>(mc, Precision::kFp32);
  f.whole->init(77);
  for (size_t i = 0; i < f.whole->tensors().size(); ++i) {  // biases and gains too
    float* p = f.whole->master(static_cast<int>(i));
    for (size_t k = 0; k < f.whole->tensors()[i].numel; ++k) p[k] += 1e-3f * static_cast<float>(i);
  }
  TrainerState st;
  st.step = 3;
  EXPECT_TRUE(save_checkpoint(f.run, *f.whole, st, "# test\n", 0).is_ok());
  f.step = f.run + "/checkpoints/" + checkpoint_dir_name(3);
  return f;
}

// Imports `dir` into a store of TP slice `tp` and returns it.
std::unique_ptr<ParamStore> import(const std::string& dir, TpShard tp = {},
                                   const ModelConfig& mc = model()) {
  auto p = std::make_unique<ParamStore>(mc, Precision::kFp32, false, nullptr, tp);
  auto src = HfSource::open(dir, *p, "model.init_from");
  EXPECT_TRUE(src.is_ok()) << src.status().to_string();
  if (!src.is_ok()) return nullptr;
  Status st = p->fill(**src);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return p;
}

void expect_same_weights(const ParamStore& whole, const ParamStore& got, TpShard tp = {}) {
  for (size_t i = 0; i < whole.tensors().size(); ++i) {
    const ParamTensor& t = got.tensors()[i];
    std::vector<float> want(t.numel);
    copy_to_shard(t, tp, whole.master(static_cast<int>(i)), want.data());
    ASSERT_EQ(0, std::memcmp(want.data(), got.master(static_cast<int>(i)), t.numel * 4))
        << t.name << " on TP rank " << tp.rank << " of " << tp.size;
  }
}

TEST(HfNames, EveryTensorHasOneHuggingFaceNameGpt2Layouts) {
  ParamStore p(model(), Precision::kFp32, false, nullptr, {}, false);
  std::set<std::string> seen;
  for (const ParamTensor& t : p.tensors()) {
    bool tr = false;
    auto n = hf_tensor_name(t.name, &tr);
    ASSERT_TRUE(n.is_ok()) << t.name;
    EXPECT_TRUE(seen.insert(*n).second) << *n;
    EXPECT_EQ(tr, t.global_shape.size() == 2 && t.name.rfind("blocks.", 0) == 0) << t.name;
  }
  bool tr = false;
  EXPECT_EQ(*hf_tensor_name("blocks.1.attn.qkv.weight", &tr), "transformer.h.1.attn.c_attn.weight");
  EXPECT_TRUE(tr);
  EXPECT_EQ(*hf_tensor_name("wte", &tr), "transformer.wte.weight");
  EXPECT_FALSE(tr);
  EXPECT_FALSE(hf_tensor_name("blocks.x.ln1.weight", &tr).is_ok());
}

TEST(HfExport, RoundTripIsExactOnOneRankAndOnTensorParallelSlices) {
  Fixture f = make_checkpoint("roundtrip");
  HfExportOptions o;
  o.output = f.root + "/hf";
  HfExportReport rep;
  ASSERT_TRUE(export_hf(f.step, o, &rep).is_ok());
  EXPECT_EQ(rep.files, 1u);
  EXPECT_TRUE(fs::exists(o.output + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(o.output + "/generation_config.json"));
  // config.json: what transformers reads.
  auto cfg = nlohmann::json::parse(*read_file(o.output + "/config.json"));
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(cfg["n_embd"], 32);
  EXPECT_EQ(cfg["n_layer"], 2);
  EXPECT_EQ(cfg["n_head"], 4);
  EXPECT_EQ(cfg["n_positions"], 12);
  EXPECT_EQ(cfg["vocab_size"], 96);
  EXPECT_EQ(cfg["activation_function"], "gelu_new");
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  // GPT-2's Conv1D layout: c_attn.weight is [n_embd, 3 n_embd], the transpose of qkv.weight.
  auto file = SafetensorsFile::read(o.output + "/model.safetensors");
  ASSERT_TRUE(file.is_ok());
  EXPECT_EQ(file->metadata().at("format"), "pt");
  auto v = file->view("transformer.h.1.attn.c_attn.weight");
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(v->shape, (std::vector<int64_t>{32, 96}));
  const float* hf = static_cast<const float*>(v->data);
  const float* kiln = f.whole->master(f.whole->block(1).qkv_w);
  for (int r = 0; r < 96; ++r)
    for (int c = 0; c < 32; ++c) ASSERT_EQ(hf[c * 96 + r], kiln[r * 32 + c]);
  EXPECT_FALSE(file->has("lm_head.weight"));  // tied

  auto one = import(o.output);
  ASSERT_TRUE(one);
  expect_same_weights(*f.whole, *one);
  for (int r = 0; r < 2; ++r) {
    auto slice = import(o.output, TpShard{r, 2});
    ASSERT_TRUE(slice);
    expect_same_weights(*f.whole, *slice, TpShard{r, 2});
  }
  // The same bytes again (deterministic), and from the run directory (its latest checkpoint).
  HfExportOptions o2 = o;
  o2.output = f.root + "/hf2";
  ASSERT_TRUE(export_hf(f.run, o2).is_ok());
  EXPECT_EQ(*read_file(o.output + "/model.safetensors"),
            *read_file(o2.output + "/model.safetensors"));
  EXPECT_EQ(*read_file(o.output + "/config.json"), *read_file(o2.output + "/config.json"));
  // An existing directory is not replaced without overwrite.
  EXPECT_EQ(export_hf(f.step, o).code(), StatusCode::kUsage);
  o.overwrite = true;
  EXPECT_TRUE(export_hf(f.step, o).is_ok());
  fs::remove_all(f.root);
}

// Llama: q/k/v and gate/up are row blocks of Kiln's fused tensors under transformers' names, the
// config is LlamaForCausalLM's, and import gives back every element on one rank and on each
// tensor-parallel slice (a slice of the fused qkv takes unequal parts of q, k and v), from one
// file and from shards cut small (an index).
TEST(HfExport, LlamaRoundTripIsExactOnOneRankAndOnTensorParallelSlices) {
  const ModelConfig mc = llama_model();
  Fixture f = make_checkpoint("llama", mc);
  for (uint64_t limit : {uint64_t{5} << 30, uint64_t{6000}}) {
    HfExportOptions o;
    o.output = f.root + "/hf" + std::to_string(limit);
    o.max_shard_bytes = limit;
    HfExportReport rep;
    ASSERT_TRUE(export_hf(f.step, o, &rep).is_ok());
    auto cfg = nlohmann::json::parse(*read_file(o.output + "/config.json"));
    EXPECT_EQ(cfg["model_type"], "llama");
    EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(cfg["hidden_size"], 32);
    EXPECT_EQ(cfg["intermediate_size"], 48);
    EXPECT_EQ(cfg["num_attention_heads"], 4);
    EXPECT_EQ(cfg["num_key_value_heads"], 2);
    EXPECT_EQ(cfg["num_hidden_layers"], 2);
    EXPECT_EQ(cfg["hidden_act"], "silu");
    EXPECT_EQ(cfg["rms_norm_eps"], 1e-6);
    EXPECT_EQ(cfg["rope_theta"], 500000.0);
    EXPECT_EQ(cfg["tie_word_embeddings"], false);
    EXPECT_EQ(cfg["attention_bias"], true);
    EXPECT_EQ(cfg["mlp_bias"], true);
    EXPECT_TRUE(cfg["rope_scaling"].is_null());
    if (limit == 6000) {
      EXPECT_GT(rep.files, 2u);
      EXPECT_TRUE(fs::exists(o.output + "/model.safetensors.index.json"));
    } else {
      EXPECT_EQ(rep.files, 1u);
      auto file = SafetensorsFile::read(o.output + "/model.safetensors");
      ASSERT_TRUE(file.is_ok());
      const BlockTensors& b = f.whole->block(1);
      const float* qkv = f.whole->master(b.qkv_w);
      const float* fc = f.whole->master(b.fc_w);
      struct Want {
        const char* name;
        std::vector<int64_t> shape;
        const float* from;
      } wants[] = {
          {"model.layers.1.self_attn.q_proj.weight", {32, 32}, qkv},
          {"model.layers.1.self_attn.k_proj.weight", {16, 32}, qkv + 32 * 32},
          {"model.layers.1.self_attn.v_proj.weight", {16, 32}, qkv + 48 * 32},
          {"model.layers.1.mlp.gate_proj.weight", {48, 32}, fc},
          {"model.layers.1.mlp.up_proj.weight", {48, 32}, fc + 48 * 32},
          {"model.layers.1.self_attn.v_proj.bias", {16}, f.whole->master(b.qkv_b) + 48},
          {"lm_head.weight", {96, 32}, f.whole->master(f.whole->lm_head())},
      };
      for (const Want& w : wants) {
        auto v = file->view(w.name);
        ASSERT_TRUE(v.is_ok()) << w.name;
        EXPECT_EQ(v->shape, w.shape) << w.name;
        size_t n = 1;
        for (int64_t d : w.shape) n *= static_cast<size_t>(d);
        EXPECT_EQ(0, std::memcmp(v->data, w.from, n * 4)) << w.name;
      }
      EXPECT_FALSE(file->has("model.layers.0.self_attn.qkv.weight"));
    }
    auto one = import(o.output, {}, mc);
    ASSERT_TRUE(one);
    expect_same_weights(*f.whole, *one);
    for (int r = 0; r < 2; ++r) {
      auto slice = import(o.output, TpShard{r, 2}, mc);
      ASSERT_TRUE(slice);
      expect_same_weights(*f.whole, *slice, TpShard{r, 2});
    }
    // Read back as a model directory: the shape Kiln trained.
    auto back = read_hf_config(o.output);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(model_shape_json(*back), model_shape_json(mc));
  }
  // A llama directory does not import into a GPT-2 (the architecture is named).
  auto p = std::make_unique<ParamStore>(model(), Precision::kFp32, false, nullptr, TpShard{});
  auto src =
      HfSource::open(f.root + "/hf" + std::to_string(uint64_t{5} << 30), *p, "model.init_from");
  ASSERT_FALSE(src.is_ok());
  EXPECT_NE(src.status().to_string().find("model.arch"), std::string::npos)
      << src.status().to_string();
  fs::remove_all(f.root);
}

TEST(HfExport, ShardsWithAnIndexAndBf16) {
  Fixture f = make_checkpoint("shards");
  HfExportOptions o;
  o.output = f.root + "/hf";
  o.max_shard_bytes = 40000;  // several files
  HfExportReport rep;
  ASSERT_TRUE(export_hf(f.step, o, &rep).is_ok());
  EXPECT_GT(rep.files, 2u);
  EXPECT_FALSE(fs::exists(o.output + "/model.safetensors"));
  auto idx = nlohmann::json::parse(*read_file(o.output + "/model.safetensors.index.json"));
  EXPECT_EQ(idx["metadata"]["total_size"], rep.bytes);
  EXPECT_EQ(idx["weight_map"].size(), f.whole->tensors().size());
  EXPECT_EQ(idx["weight_map"]["transformer.wte.weight"],
            "model-00001-of-0000" + std::to_string(rep.files) + ".safetensors");
  auto one = import(o.output);
  ASSERT_TRUE(one);
  expect_same_weights(*f.whole, *one);

  HfExportOptions b = o;
  b.output = f.root + "/bf16";
  b.dtype = "bf16";
  b.max_shard_bytes = uint64_t{1} << 30;
  ASSERT_TRUE(export_hf(f.step, b).is_ok());
  auto cfg = nlohmann::json::parse(*read_file(b.output + "/config.json"));
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  auto half = import(b.output);
  ASSERT_TRUE(half);
  for (size_t i = 0; i < f.whole->tensors().size(); ++i) {
    const size_t n = f.whole->tensors()[i].numel;
    std::vector<bf16> r(n);
    std::vector<float> want(n);
    cpu::cast(r.data(), f.whole->master(static_cast<int>(i)), n);
    cpu::cast(want.data(), r.data(), n);
    ASSERT_EQ(0, std::memcmp(want.data(), half->master(static_cast<int>(i)), n * 4))
        << f.whole->tensors()[i].name;
  }
  fs::remove_all(f.root);
}

// A copy of a good export with one file rewritten by `edit`; the import's error text.
std::string import_error(const std::string& good, const std::string& bad_dir,
                         const std::function<void(const std::string&)>& edit,
                         StatusCode* code = nullptr) {
  fs::remove_all(bad_dir);
  fs::copy(good, bad_dir, fs::copy_options::recursive);
  edit(bad_dir);
  ParamStore p(model(), Precision::kFp32);
  auto src = HfSource::open(bad_dir, p, "model.init_from");
  if (src.is_ok()) return "";
  if (code) *code = src.status().code();
  return src.status().to_string();
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& fn) {
  auto j = nlohmann::json::parse(*read_file(dir + "/config.json"));
  fn(j);
  ASSERT_TRUE(write_file_atomic(dir + "/config.json", j.dump()).is_ok());
}

// Rewrites model.safetensors with fn applied to its tensor list (views of the original bytes).
void edit_tensors(const std::string& dir, const std::function<void(std::vector<TensorView>&)>& fn) {
  auto f = SafetensorsFile::read(dir + "/model.safetensors");
  ASSERT_TRUE(f.is_ok());
  std::vector<TensorView> views;
  for (const std::string& n : f->names()) views.push_back(*f->view(n));
  fn(views);
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", views, {{"format", "pt"}}).is_ok());
}

TEST(HfImport, RefusesWhatKilnCannotRepresentNamingFileAndField) {
  Fixture f = make_checkpoint("refuse");
  const std::string good = f.root + "/hf", bad = f.root + "/bad";
  HfExportOptions o;
  o.output = good;
  ASSERT_TRUE(export_hf(f.step, o).is_ok());
  ASSERT_EQ(import_error(good, bad, [](const std::string&) {}), "");  // the copy itself is fine

  StatusCode code{};
  std::string e = import_error(
      good, bad,
      [](const std::string& d) {
        edit_config(d, [](nlohmann::json& j) { j["model_type"] = "llama_moe"; });
      },
      &code);
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("model_type"), std::string::npos) << e;
  EXPECT_NE(e.find("llama_moe"), std::string::npos) << e;
  EXPECT_EQ(code, StatusCode::kConfig);

  for (auto [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"activation_function", "relu"},
           {"layer_norm_epsilon", 1e-6},
           {"n_inner", 100},
           {"tie_word_embeddings", false},
           {"scale_attn_by_inverse_layer_idx", true},
           {"rope_scaling", nlohmann::json{{"type", "linear"}}}}) {
    e = import_error(good, bad, [&](const std::string& d) {
      edit_config(d, [&](nlohmann::json& j) { j[field] = value; });
    });
    EXPECT_NE(e.find("config.json"), std::string::npos) << field << ": " << e;
    EXPECT_NE(e.find("'" + field + "'"), std::string::npos) << field << ": " << e;
  }
  // Another shape than the run's: the field and the config key to set.
  e = import_error(good, bad, [](const std::string& d) {
    edit_config(d, [](nlohmann::json& j) { j["n_layer"] = 3; });
  });
  EXPECT_NE(e.find("'n_layer'"), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_layers"), std::string::npos) << e;

  // A missing tensor.
  e = import_error(good, bad, [](const std::string& d) {
    edit_tensors(d, [](std::vector<TensorView>& v) {
      std::erase_if(v,
                    [](const TensorView& t) { return t.name == "transformer.h.1.mlp.c_fc.bias"; });
    });
  });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("transformer.h.1.mlp.c_fc.bias"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  // A shape disagreeing with config.json (n_embd 32: c_fc is [32, 128]).
  std::vector<float> wrong(32 * 64, 0.0f);
  e = import_error(good, bad, [&](const std::string& d) {
    edit_tensors(d, [&](std::vector<TensorView>& v) {
      for (TensorView& t : v) {
        if (t.name == "transformer.h.0.mlp.c_fc.weight") {
          t.shape = {32, 64};
          t.data = wrong.data();
          t.bytes = wrong.size() * 4;
        }
      }
    });
  });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("transformer.h.0.mlp.c_fc.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[32, 128]"), std::string::npos) << e;

  // An untied LM head, and a tensor with no place in the model.
  std::vector<float> head(96 * 32, 0.5f);
  e = import_error(good, bad, [&](const std::string& d) {
    edit_tensors(d, [&](std::vector<TensorView>& v) {
      v.push_back({"lm_head.weight", "F32", {96, 32}, head.data(), head.size() * 4});
    });
  });
  EXPECT_NE(e.find("lm_head.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("tied"), std::string::npos) << e;
  e = import_error(good, bad, [&](const std::string& d) {
    edit_tensors(d, [&](std::vector<TensorView>& v) {
      v.push_back({"transformer.h.0.attn.q_norm.weight", "F32", {32}, head.data(), 32 * 4});
    });
  });
  EXPECT_NE(e.find("transformer.h.0.attn.q_norm.weight"), std::string::npos) << e;

  // Accepted: the attention-mask buffers of GPT-2 files, names without "transformer.", and a
  // tied head equal to wte.
  e = import_error(good, bad, [&](const std::string& d) {
    edit_tensors(d, [&](std::vector<TensorView>& v) {
      std::vector<TensorView> out;
      for (TensorView t : v) {
        if (t.name == "transformer.wte.weight") {
          TensorView h = t;
          h.name = "lm_head.weight";
          out.push_back(h);
        }
        if (t.name.rfind("transformer.", 0) == 0) t.name = t.name.substr(12);
        out.push_back(t);
      }
      out.push_back({"h.0.attn.bias", "F32", {1, 1}, head.data(), 4});
      v = out;
    });
  });
  EXPECT_EQ(e, "");
  fs::remove_all(f.root);
}

}  // namespace
}  // namespace kiln::engine
