#include "engine/checkpoint/hf.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/atomic_file.h"
#include "common/bounded_read.h"
#include "common/json.h"
#include "common/log.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/safetensors.h"
#include "kernels/ops.h"

namespace kiln::engine {
namespace fs = std::filesystem;

namespace {

// GPT-2 (transformers' GPT2LMHeadModel state dict). Kiln's matrices are (out, in); GPT-2's Conv1D
// weights are (in, out): transposed. lm_head.weight is tied to wte and not stored.
constexpr HfNameRule kGpt2Names[] = {
    {"wte", "transformer.wte.weight", false},
    {"wpe", "transformer.wpe.weight", false},
    {"blocks.#.ln1.weight", "transformer.h.#.ln_1.weight", false},
    {"blocks.#.ln1.bias", "transformer.h.#.ln_1.bias", false},
    {"blocks.#.attn.qkv.weight", "transformer.h.#.attn.c_attn.weight", true},
    {"blocks.#.attn.qkv.bias", "transformer.h.#.attn.c_attn.bias", false},
    {"blocks.#.attn.proj.weight", "transformer.h.#.attn.c_proj.weight", true},
    {"blocks.#.attn.proj.bias", "transformer.h.#.attn.c_proj.bias", false},
    {"blocks.#.ln2.weight", "transformer.h.#.ln_2.weight", false},
    {"blocks.#.ln2.bias", "transformer.h.#.ln_2.bias", false},
    {"blocks.#.mlp.fc.weight", "transformer.h.#.mlp.c_fc.weight", true},
    {"blocks.#.mlp.fc.bias", "transformer.h.#.mlp.c_fc.bias", false},
    {"blocks.#.mlp.proj.weight", "transformer.h.#.mlp.c_proj.weight", true},
    {"blocks.#.mlp.proj.bias", "transformer.h.#.mlp.c_proj.bias", false},
    {"ln_f.weight", "transformer.ln_f.weight", false},
    {"ln_f.bias", "transformer.ln_f.bias", false},
};
// The prefix transformers' GPT2LMHeadModel puts before the base model's names; files saved from
// GPT2Model (the original "gpt2" repository) have none.
constexpr const char* kGpt2Prefix = "transformer.";
constexpr const char* kGpt2TiedHead = "lm_head.weight";

constexpr double kLayerNormEps = 1e-5;  // kernels/ops.h layernorm_forward

// The largest config.json / model.safetensors.index.json read (a Llama-405B index is about
// 100 KiB), and the largest integer a config.json size field may hold (read_hf_config; the
// model's own bounds are check_model_shape's).
constexpr uint64_t kMaxHfJsonBytes = 64ull << 20;
constexpr int64_t kMaxHfConfigInteger = int64_t{1} << 31;

// Llama (transformers' LlamaForCausalLM state dict). Linear weights are (out, in) as in Kiln, so
// nothing is transposed; Kiln's fused tensors are Hugging Face's separate ones stacked by rows:
// attn.qkv is q_proj, k_proj, v_proj (n_heads, n_kv_heads, n_kv_heads head_dim rows, already in
// the rotate-half order transformers' RoPE uses, so no permutation), mlp.fc is gate_proj then
// up_proj (ffn rows each). Biases (model.bias: attention_bias and mlp_bias) follow their weights.
// lm_head.weight is stored when the head is untied.
struct HfLlamaRule {
  const char* kiln;
  const char* hf[3];  // one name, or the row blocks of a fused tensor in order
};
constexpr HfLlamaRule kLlamaNames[] = {
    {"wte", {"model.embed_tokens.weight"}},
    {"blocks.#.ln1.weight", {"model.layers.#.input_layernorm.weight"}},
    {"blocks.#.attn.qkv.weight",
     {"model.layers.#.self_attn.q_proj.weight", "model.layers.#.self_attn.k_proj.weight",
      "model.layers.#.self_attn.v_proj.weight"}},
    {"blocks.#.attn.qkv.bias",
     {"model.layers.#.self_attn.q_proj.bias", "model.layers.#.self_attn.k_proj.bias",
      "model.layers.#.self_attn.v_proj.bias"}},
    {"blocks.#.attn.proj.weight", {"model.layers.#.self_attn.o_proj.weight"}},
    {"blocks.#.attn.proj.bias", {"model.layers.#.self_attn.o_proj.bias"}},
    {"blocks.#.ln2.weight", {"model.layers.#.post_attention_layernorm.weight"}},
    {"blocks.#.mlp.fc.weight",
     {"model.layers.#.mlp.gate_proj.weight", "model.layers.#.mlp.up_proj.weight"}},
    {"blocks.#.mlp.fc.bias",
     {"model.layers.#.mlp.gate_proj.bias", "model.layers.#.mlp.up_proj.bias"}},
    {"blocks.#.mlp.proj.weight", {"model.layers.#.mlp.down_proj.weight"}},
    {"blocks.#.mlp.proj.bias", {"model.layers.#.mlp.down_proj.bias"}},
    {"ln_f.weight", {"model.norm.weight"}},
    {"lm_head.weight", {"lm_head.weight"}},
};
// LlamaModel files (no LM head) name the base model without "model.".
constexpr const char* kLlamaPrefix = "model.";

// "blocks.3.attn.qkv.weight" matched against "blocks.#.attn.qkv.weight": the layer, or -1.
bool match_rule(const std::string& name, const char* pattern, std::string* layer) {
  const std::string p(pattern);
  const size_t hash = p.find('#');
  if (hash == std::string::npos) return name == p;
  const std::string head = p.substr(0, hash), tail = p.substr(hash + 1);
  if (name.size() <= head.size() + tail.size()) return false;
  if (name.compare(0, head.size(), head) != 0) return false;
  if (name.compare(name.size() - tail.size(), tail.size(), tail) != 0) return false;
  *layer = name.substr(head.size(), name.size() - head.size() - tail.size());
  return !layer->empty() && std::all_of(layer->begin(), layer->end(), ::isdigit);
}

std::string fill_rule(const char* pattern, const std::string& layer) {
  std::string p(pattern);
  const size_t hash = p.find('#');
  if (hash != std::string::npos) p.replace(hash, 1, layer);
  return p;
}

std::vector<int64_t> hf_shape(const ParamTensor& t, bool transpose) {
  std::vector<int64_t> s = t.global_shape;
  if (transpose) std::swap(s[0], s[1]);
  return s;
}

Status fs_error(const std::string& what, const fs::path& p, const std::error_code& ec) {
  return Status::io(what + ": " + ec.message()).with_file(p.string());
}

const char* torch_dtype_name(const std::string& st_dtype) {
  return st_dtype == "BF16" ? "bfloat16" : st_dtype == "F16" ? "float16" : "float32";
}

}  // namespace

Result<std::vector<HfPart>> hf_tensor_parts(const ModelConfig& m, const ParamTensor& t) {
  std::vector<HfPart> parts;
  // The whole tensor's elements (t may be a tensor-parallel slice: numel is the slice's).
  size_t whole = 1;
  for (int64_t d : t.global_shape) whole *= static_cast<size_t>(d);
  if (!m.llama()) {
    HfPart p;
    KILN_ASSIGN_OR_RETURN(p.name, hf_tensor_name(t.name, &p.transpose));
    p.first = 0;
    p.numel = whole;
    p.shape = hf_shape(t, p.transpose);
    parts.push_back(std::move(p));
    return parts;
  }
  for (const HfLlamaRule& r : kLlamaNames) {
    std::string layer;
    if (!match_rule(t.name, r.kiln, &layer)) continue;
    const int n = r.hf[2] ? 3 : r.hf[1] ? 2 : 1;
    const int64_t hd = m.head_dim();
    std::vector<int64_t> rows = {t.global_shape[0]};
    if (n == 3) rows = {m.n_heads * hd, m.kv_heads() * hd, m.kv_heads() * hd};
    if (n == 2) rows = {m.ffn(), m.ffn()};
    const size_t width = whole / static_cast<size_t>(t.global_shape[0]);
    size_t at = 0;
    for (int i = 0; i < n; ++i) {
      HfPart p;
      p.name = fill_rule(r.hf[i], layer);
      p.first = at;
      p.numel = static_cast<size_t>(rows[static_cast<size_t>(i)]) * width;
      p.shape = t.global_shape;
      p.shape[0] = rows[static_cast<size_t>(i)];
      at += p.numel;
      parts.push_back(std::move(p));
    }
    KILN_CHECK(at == whole, "hf_tensor_parts: row blocks do not cover " + t.name);
    return parts;
  }
  return Status::not_found("no Hugging Face name for Kiln tensor " + t.name);
}

Result<std::string> hf_tensor_name(const std::string& kiln_name, bool* transpose) {
  for (const HfNameRule& r : kGpt2Names) {
    std::string layer;
    if (match_rule(kiln_name, r.kiln, &layer)) {
      if (transpose) *transpose = r.transpose;
      return fill_rule(r.hf, layer);
    }
  }
  return Status::not_found("no Hugging Face name for Kiln tensor " + kiln_name);
}

namespace {

// Meta's original Llama release (params.json + consolidated.NN.pth, no config.json).
bool is_meta_layout(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && !fs::exists(dir / "config.json", ec) &&
         (fs::exists(dir / "params.json", ec) || fs::exists(dir / "consolidated.00.pth", ec));
}

}  // namespace

Status refuse_meta_layout(const std::string& dir, const std::string& key) {
  if (!is_meta_layout(dir)) return Status::ok();
  // Its q and k rows pair adjacent elements for RoPE (interleaved); Hugging Face's converter
  // permutes them into the rotate-half order every HF Llama directory has (docs/MODELS.md
  // "Interleaved RoPE").
  return Status::usage(
             (key.empty() ? "" : key + ": ") +
             "Meta's original Llama layout (params.json, consolidated.*.pth) is not read: convert "
             "it with transformers' convert_llama_weights_to_hf.py (which permutes the q/k rows "
             "from Meta's interleaved RoPE pairs to Hugging Face's rotate-half order) and give "
             "the directory it writes")
      .with_file((fs::path(dir) / "params.json").string());
}

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return (fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec)) ||
         is_meta_layout(path);
}

Result<ModelConfig> read_hf_config(const std::string& dir, HfModelInfo* info) {
  const std::string path = (fs::path(dir) / "config.json").string();
  KILN_ASSIGN_OR_RETURN(std::string text, read_file_capped(path, kMaxHfJsonBytes));
  auto parsed = parse_untrusted_json(text);
  if (!parsed.is_ok())
    return std::move(parsed).take_status().prefixed("config.json").with_file(path);
  const nlohmann::json j = std::move(parsed).value();
  if (!j.is_object()) return Status::config("config.json is not a JSON object").with_file(path);
  auto refuse = [&](const std::string& field, const std::string& why) {
    return Status::config(why).with_file(path).with_key(field);
  };
  auto shown = [&](const char* field) {
    return j.contains(field) ? json_shown(j.at(field)) : std::string("absent");
  };
  if (!j.contains("model_type") || !j.at("model_type").is_string()) {
    return refuse("model_type", "missing: Kiln reads model_type \"gpt2\"");
  }
  const std::string type = j.at("model_type").get<std::string>();
  if (type != "gpt2" && type != "llama") {
    return refuse("model_type", "\"" + type +
                                    "\" is not an architecture Kiln can represent (supported: "
                                    "\"gpt2\", \"llama\")");
  }
  ModelConfig m;
  auto integer = [&](const char* field, int64_t* out, bool required, int64_t fallback) -> Status {
    if (!j.contains(field) || j.at(field).is_null()) {
      if (required) return refuse(field, "missing");
      *out = fallback;
      return Status::ok();
    }
    try {
      *out = json_integer<int64_t>(j.at(field), field);
    } catch (const std::exception&) {
      return refuse(field, "must be an integer, found " + shown(field));
    }
    if (*out <= 0) return refuse(field, "must be positive, found " + shown(field));
    // (the model's own bounds are check_model_shape's; this one keeps the arithmetic on the
    // fields here - 4 x n_embd, products of sizes - inside 64 bits)
    if (*out > kMaxHfConfigInteger) {
      return refuse(field, "is " + shown(field) + ", over the limit of " +
                               std::to_string(kMaxHfConfigInteger) + " of any model Kiln builds");
    }
    return Status::ok();
  };
  auto fill_info = [&](const ModelConfig& mm) {
    if (!info) return;
    HfModelInfo out;
    auto id = [&](const char* field) -> int64_t {
      if (!j.contains(field) || !j.at(field).is_number_integer()) return -1;
      const int64_t v = j.at(field).get<int64_t>();
      return v >= 0 && v < mm.vocab_size ? v : -1;
    };
    out.bos_id = id("bos_token_id");
    out.eos_id = id("eos_token_id");
    if (j.contains("torch_dtype") && j.at("torch_dtype").is_string()) {
      out.torch_dtype = j.at("torch_dtype").get<std::string>();
    }
    *info = out;
  };
  // Fields that name a feature Kiln's models lack: refused when present and not off.
  auto absent = [&](const char* field) -> Status {
    if (!j.contains(field)) return Status::ok();
    const auto& v = j.at(field);
    const bool off = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                     (v.is_number() && v.get<double>() == 0);
    if (off) return Status::ok();
    return refuse(field, shown(field) + ": not part of a model Kiln can represent");
  };
  if (type == "llama") {
    m.arch = Arch::kLlama;
    KILN_RETURN_IF_ERROR(integer("vocab_size", &m.vocab_size, true, 0));
    KILN_RETURN_IF_ERROR(integer("hidden_size", &m.d_model, true, 0));
    KILN_RETURN_IF_ERROR(integer("num_hidden_layers", &m.n_layers, true, 0));
    KILN_RETURN_IF_ERROR(integer("num_attention_heads", &m.n_heads, true, 0));
    KILN_RETURN_IF_ERROR(integer("num_key_value_heads", &m.n_kv_heads, false, m.n_heads));
    KILN_RETURN_IF_ERROR(integer("intermediate_size", &m.ffn_hidden, true, 0));
    KILN_RETURN_IF_ERROR(integer("max_position_embeddings", &m.seq_len, false, 2048));
    if (m.d_model % m.n_heads != 0) {
      return refuse("num_attention_heads", "num_attention_heads " + std::to_string(m.n_heads) +
                                               " does not divide hidden_size " +
                                               std::to_string(m.d_model));
    }
    if (m.n_heads % m.n_kv_heads != 0) {
      return refuse("num_key_value_heads", "num_key_value_heads " + std::to_string(m.n_kv_heads) +
                                               " does not divide num_attention_heads " +
                                               std::to_string(m.n_heads));
    }
    if (j.contains("head_dim") && !j.at("head_dim").is_null()) {
      int64_t hd = 0;
      KILN_RETURN_IF_ERROR(integer("head_dim", &hd, false, 0));
      if (hd != m.d_model / m.n_heads) {
        return refuse("head_dim", shown("head_dim") +
                                      ": Kiln's head width is hidden_size / num_attention_heads (" +
                                      std::to_string(m.d_model / m.n_heads) + ")");
      }
    }
    if (j.contains("hidden_act") && j.at("hidden_act") != "silu") {
      return refuse("hidden_act", shown("hidden_act") + ": Kiln's SwiGLU uses SiLU (\"silu\")");
    }
    auto number = [&](const char* field, double fallback, double* out) -> Status {
      if (!j.contains(field) || j.at(field).is_null()) {
        *out = fallback;
        return Status::ok();
      }
      if (!j.at(field).is_number() || !(j.at(field).get<double>() > 0) ||
          !std::isfinite(j.at(field).get<double>())) {
        return refuse(field, "must be a positive number, found " + shown(field));
      }
      *out = j.at(field).get<double>();
      return Status::ok();
    };
    double eps = 0;
    KILN_RETURN_IF_ERROR(number("rope_theta", 10000.0, &m.rope_theta));
    KILN_RETURN_IF_ERROR(number("rms_norm_eps", 1e-6, &eps));
    m.norm_eps = static_cast<float>(eps);
    auto boolean = [&](const char* field, bool fallback, bool* out) -> Status {
      if (!j.contains(field) || j.at(field).is_null()) {
        *out = fallback;
        return Status::ok();
      }
      if (!j.at(field).is_boolean())
        return refuse(field, "must be true or false, found " + shown(field));
      *out = j.at(field).get<bool>();
      return Status::ok();
    };
    bool attn_bias = false, mlp_bias = false;
    KILN_RETURN_IF_ERROR(boolean("tie_word_embeddings", false, &m.tie_embeddings));
    KILN_RETURN_IF_ERROR(boolean("attention_bias", false, &attn_bias));
    KILN_RETURN_IF_ERROR(boolean("mlp_bias", false, &mlp_bias));
    if (attn_bias != mlp_bias) {
      return refuse(attn_bias ? "attention_bias" : "mlp_bias",
                    std::string("attention_bias ") + (attn_bias ? "true" : "false") +
                        " with mlp_bias " + (mlp_bias ? "true" : "false") +
                        ": Kiln's model.bias gives every linear layer a bias or none");
    }
    m.bias = attn_bias;
    for (const char* f :
         {"rope_scaling", "sliding_window", "use_sliding_window", "num_experts",
          "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "n_routed_experts",
          "layer_types", "no_rope_layers", "attn_logit_softcapping", "final_logit_softcapping",
          "qk_layernorm", "use_qk_norm"}) {
      KILN_RETURN_IF_ERROR(absent(f));
    }
    fill_info(m);
    return m;
  }
  KILN_RETURN_IF_ERROR(integer("vocab_size", &m.vocab_size, true, 0));
  KILN_RETURN_IF_ERROR(integer("n_embd", &m.d_model, true, 0));
  KILN_RETURN_IF_ERROR(integer("n_layer", &m.n_layers, true, 0));
  KILN_RETURN_IF_ERROR(integer("n_head", &m.n_heads, true, 0));
  KILN_RETURN_IF_ERROR(integer("n_positions", &m.seq_len, true, 0));
  if (m.d_model % m.n_heads != 0) {
    return refuse("n_head", "n_head " + std::to_string(m.n_heads) + " does not divide n_embd " +
                                std::to_string(m.d_model));
  }
  if (j.contains("n_inner") && !j.at("n_inner").is_null()) {
    int64_t inner = 0;
    KILN_RETURN_IF_ERROR(integer("n_inner", &inner, false, 0));
    if (inner != 4 * m.d_model) {
      return refuse("n_inner", shown("n_inner") + ": Kiln's MLP is 4 x n_embd (" +
                                   std::to_string(4 * m.d_model) + ")");
    }
  }
  // GPT-2's GELU is the tanh approximation; "gelu_new", "gelu_pytorch_tanh" and "gelu_fast" are
  // that function (the last two are other evaluations of the same formula).
  if (j.contains("activation_function")) {
    const auto& a = j.at("activation_function");
    if (!a.is_string() || (a != "gelu_new" && a != "gelu_pytorch_tanh" && a != "gelu_fast")) {
      return refuse("activation_function",
                    shown("activation_function") +
                        ": Kiln's MLP uses the tanh-approximated GELU (\"gelu_new\")");
    }
  }
  if (j.contains("layer_norm_epsilon")) {
    const auto& e = j.at("layer_norm_epsilon");
    if (!e.is_number() || std::abs(e.get<double>() - kLayerNormEps) > 1e-12) {
      return refuse("layer_norm_epsilon",
                    shown("layer_norm_epsilon") + ": Kiln's LayerNorm uses eps 1e-05");
    }
  }
  auto flag = [&](const char* field, bool want) -> Status {
    if (!j.contains(field) || j.at(field).is_null()) return Status::ok();
    if (!j.at(field).is_boolean() || j.at(field).get<bool>() != want) {
      return refuse(field, shown(field) + ": Kiln's GPT-2 needs " + (want ? "true" : "false"));
    }
    return Status::ok();
  };
  KILN_RETURN_IF_ERROR(flag("tie_word_embeddings", true));
  KILN_RETURN_IF_ERROR(flag("add_cross_attention", false));
  KILN_RETURN_IF_ERROR(flag("scale_attn_weights", true));
  KILN_RETURN_IF_ERROR(flag("scale_attn_by_inverse_layer_idx", false));
  for (const char* f : {"rope_scaling", "sliding_window", "num_experts"}) {
    if (j.contains(f) && !j.at(f).is_null()) {
      return refuse(f, shown(f) + ": not part of a model Kiln can represent");
    }
  }
  fill_info(m);
  return m;
}

// ---- import ---------------------------------------------------------------------------------

struct HfSource::Impl {
  std::string dir, key;
  const ParamStore* params = nullptr;
  std::map<std::string, SafetensorsFile> files;  // by file name
  struct Where {
    const SafetensorsFile* file = nullptr;
    std::string name, dtype;
    std::vector<int64_t> shape;  // as stored
    bool transpose = false;
    size_t first = 0, numel = 0;  // the Kiln tensor's elements it holds
  };
  std::vector<std::vector<Where>> where;  // per ParamStore tensor: its Hugging Face parts
  uint64_t bytes_read = 0;
  std::vector<char> raw;
  std::vector<float> block;

  // n elements of `dtype` at raw as fp32. Only the dtypes readable() accepts: every tensor's
  // dtype is checked with it when the directory is opened (an unchecked U8 tensor once was read
  // here as F16, twice the bytes its buffer held).
  static bool readable(const std::string& dtype) {
    return dtype == "F32" || dtype == "BF16" || dtype == "F16";
  }
  static void widen(const std::string& dtype, const void* raw, size_t n, float* out) {
    KILN_CHECK(readable(dtype), "HfSource: widen of unchecked dtype " + dtype);
    if (dtype == "F32") {
      std::memcpy(out, raw, n * sizeof(float));
    } else if (dtype == "BF16") {
      cpu::cast(out, static_cast<const bf16*>(raw), n);
    } else {
      cpu::cast(out, static_cast<const fp16*>(raw), n);
    }
  }
  // A data error naming the file and tensor when `dtype` is not one widen() reads.
  static Status check_dtype(const SafetensorsFile& f, const std::string& name,
                            const std::string& dtype) {
    if (readable(dtype)) return Status::ok();
    return Status::data("tensor " + name + " is stored as " + dtype +
                        ": Kiln reads F32, BF16 or F16 weights")
        .with_file(f.path())
        .with_key(name);
  }
  Status read_whole(const Where& w, size_t first, size_t n, float* out);
  Status read_transposed(const Where& w, const ParamTensor& t, size_t first, size_t n, float* out);
};

HfSource::HfSource() : impl_(std::make_unique<Impl>()) {}
HfSource::~HfSource() = default;
uint64_t HfSource::bytes_read() const { return impl_->bytes_read; }

Result<std::unique_ptr<HfSource>> HfSource::open(const std::string& dir, const ParamStore& params,
                                                 const std::string& key) {
  KILN_RETURN_IF_ERROR(refuse_meta_layout(dir, key));
  const std::string config_path = (fs::path(dir) / "config.json").string();
  KILN_ASSIGN_OR_RETURN(ModelConfig hf, read_hf_config(dir));
  const ModelConfig& m = params.model();
  // config.json's field, Kiln's key, and both values as text.
  struct Field {
    const char* hf;
    const char* kiln;
    std::string theirs, ours;
  };
  auto txt = [](auto v) { return fmt::format("{}", v); };
  std::vector<Field> fields;
  if (hf.arch != m.arch) {
    fields.push_back({"model_type", "model.arch", arch_name(hf.arch), arch_name(m.arch)});
  } else if (!m.llama()) {
    fields = {{"vocab_size", "model.vocab_size", txt(hf.vocab_size), txt(m.vocab_size)},
              {"n_embd", "model.d_model", txt(hf.d_model), txt(m.d_model)},
              {"n_layer", "model.n_layers", txt(hf.n_layers), txt(m.n_layers)},
              {"n_head", "model.n_heads", txt(hf.n_heads), txt(m.n_heads)},
              {"n_positions", "model.seq_len", txt(hf.seq_len), txt(m.seq_len)}};
  } else {  // (no position table: max_position_embeddings need not be model.seq_len)
    fields = {{"vocab_size", "model.vocab_size", txt(hf.vocab_size), txt(m.vocab_size)},
              {"hidden_size", "model.d_model", txt(hf.d_model), txt(m.d_model)},
              {"num_hidden_layers", "model.n_layers", txt(hf.n_layers), txt(m.n_layers)},
              {"num_attention_heads", "model.n_heads", txt(hf.n_heads), txt(m.n_heads)},
              {"num_key_value_heads", "model.n_kv_heads", txt(hf.kv_heads()), txt(m.kv_heads())},
              {"intermediate_size", "model.ffn_hidden", txt(hf.ffn()), txt(m.ffn())},
              {"rope_theta", "model.rope_theta", txt(hf.rope_theta), txt(m.rope_theta)},
              {"rms_norm_eps", "model.norm_eps", txt(hf.norm_eps), txt(m.norm_eps)},
              {"tie_word_embeddings", "model.tie_embeddings", txt(hf.tie_embeddings),
               txt(m.tie_embeddings)},
              {"attention_bias", "model.bias", txt(hf.bias), txt(m.bias)}};
  }
  for (const Field& f : fields) {
    if (f.theirs != f.ours) {
      return Status::config(std::string(f.hf) + " is " + f.theirs + " but " + f.kiln + " is " +
                            f.ours + " (" + key + " " + dir + "; set --set " + f.kiln + "=" +
                            f.theirs + ")")
          .with_file(config_path)
          .with_key(f.hf);
    }
  }
  std::unique_ptr<HfSource> src(new HfSource());
  Impl& im = *src->impl_;
  im.dir = dir;
  im.key = key;
  im.params = &params;
  // The weight files: one model.safetensors, or an index naming shards.
  const fs::path root(dir);
  std::map<std::string, std::string> weight_map;  // tensor -> file name
  std::error_code ec;
  const fs::path index_path = root / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    KILN_ASSIGN_OR_RETURN(std::string text, read_file_capped(index_path.string(), kMaxHfJsonBytes));
    auto parsed = parse_untrusted_json(text);
    if (!parsed.is_ok()) return std::move(parsed).take_status().with_file(index_path.string());
    const nlohmann::json& j = *parsed;
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object()) {
      return Status::data("no weight_map object")
          .with_file(index_path.string())
          .with_key("weight_map");
    }
    for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
      const std::string file = it.value().is_string() ? it.value().get<std::string>() : "";
      if (file.empty() || file.find('/') != std::string::npos || file[0] == '.') {
        return Status::data("weight_map entry " + json_shown(it.value()) +
                            " is not a file name in the directory")
            .with_file(index_path.string())
            .with_key("weight_map." + it.key());
      }
      weight_map[it.key()] = file;
    }
  } else if (fs::exists(root / "model.safetensors", ec)) {
    KILN_ASSIGN_OR_RETURN(SafetensorsFile f,
                          SafetensorsFile::read_header((root / "model.safetensors").string()));
    for (const std::string& n : f.names()) weight_map[n] = "model.safetensors";
    im.files.emplace("model.safetensors", std::move(f));
  } else {
    std::string why = "no model.safetensors or model.safetensors.index.json";
    if (fs::exists(root / "pytorch_model.bin", ec)) {
      why += " (pytorch_model.bin is a pickle Kiln does not read: convert it to safetensors)";
    }
    return Status::data(why).with_file(dir).with_key(key);
  }
  for (const auto& [name, file] : weight_map) {
    if (im.files.count(file)) continue;
    KILN_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::read_header((root / file).string()));
    im.files.emplace(file, std::move(f));
  }
  // Every Kiln tensor's Hugging Face tensors, with or without the base model's prefix
  // ("transformer." for GPT-2, "model." for Llama).
  const char* prefix = m.llama() ? kLlamaPrefix : kGpt2Prefix;
  std::map<std::string, bool> used;
  for (const auto& [name, file] : weight_map) used[name] = false;
  for (const ParamTensor& t : params.tensors()) {
    KILN_ASSIGN_OR_RETURN(std::vector<HfPart> parts, hf_tensor_parts(m, t));
    std::vector<Impl::Where> ws;
    for (const HfPart& part : parts) {
      const std::string& name = part.name;
      std::string found = weight_map.count(name) ? name : "";
      if (found.empty() && name.rfind(prefix, 0) == 0) {
        const std::string bare = name.substr(std::strlen(prefix));
        if (weight_map.count(bare)) found = bare;
      }
      if (found.empty()) {
        return Status::data("missing tensor " + name + " (Kiln's " + t.name + ")")
            .with_file(index_path.string().size() && fs::exists(index_path, ec)
                           ? index_path.string()
                           : (root / "model.safetensors").string())
            .with_key(name);
      }
      used[found] = true;
      Impl::Where w;
      w.file = &im.files.at(weight_map.at(found));
      w.name = found;
      w.transpose = part.transpose;
      w.first = part.first;
      w.numel = part.numel;
      if (!w.file->has(found)) {
        return Status::data("model.safetensors.index.json puts tensor " + found + " in " +
                            weight_map.at(found) + ", which does not hold it")
            .with_file(index_path.string())
            .with_key("weight_map." + found);
      }
      KILN_ASSIGN_OR_RETURN(auto info, w.file->info(found));
      w.dtype = info.first;
      w.shape = info.second;
      const std::vector<int64_t>& want = part.shape;
      KILN_RETURN_IF_ERROR(Impl::check_dtype(*w.file, found, w.dtype));
      if (w.shape != want) {
        std::string sa = "[", sb = "[";
        for (size_t i = 0; i < w.shape.size(); ++i)
          sa += (i ? ", " : "") + std::to_string(w.shape[i]);
        for (size_t i = 0; i < want.size(); ++i) sb += (i ? ", " : "") + std::to_string(want[i]);
        return Status::data("shape " + sa + "] disagrees with config.json (d_model " +
                            std::to_string(m.d_model) + ", vocab_size " +
                            std::to_string(m.vocab_size) + ", heads " + std::to_string(m.n_heads) +
                            "/" + std::to_string(m.kv_heads()) + ", ffn " +
                            std::to_string(m.ffn()) + "): expected " + sb + "]")
            .with_file(w.file->path())
            .with_key(found);
      }
      ws.push_back(std::move(w));
    }
    im.where.push_back(std::move(ws));
  }
  // What is left: the attention masks GPT-2 files carry as buffers ("h.N.attn.bias",
  // "h.N.attn.masked_bias"), and an LM head that must equal wte (tied); anything else is a tensor
  // Kiln's model has no place for.
  for (const auto& [name, was_used] : used) {
    if (was_used) continue;
    // (and the RoPE frequencies older Llama files carry: "layers.N.self_attn.rotary_emb.inv_freq").
    const bool mask =
        name.size() > 10 && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
                             name.ends_with(".rotary_emb.inv_freq"));
    if (mask) continue;
    const std::string file = (root / weight_map.at(name)).string();
    if (name == kGpt2TiedHead) {
      // Compare with wte in chunks: an untied head is not representable.
      const Impl::Where& wte = im.where[static_cast<size_t>(params.wte())].front();
      const SafetensorsFile& hf = im.files.at(weight_map.at(name));
      KILN_ASSIGN_OR_RETURN(auto info, hf.info(name));
      KILN_RETURN_IF_ERROR(Impl::check_dtype(hf, name, info.first));
      if (info.second != wte.shape) {
        return Status::config(
                   "the LM head's shape differs from the token embedding's: Kiln ties "
                   "them (tie_word_embeddings)")
            .with_file(file)
            .with_key(name);
      }
      const size_t total = static_cast<size_t>(wte.shape[0] * wte.shape[1]);
      std::vector<char> a, b;
      std::vector<float> fa, fb;
      for (size_t at = 0; at < total; at += kStateChunk) {
        const size_t k = std::min(kStateChunk, total - at);
        a.resize(k * safetensors_dtype_size(info.first));
        b.resize(k * safetensors_dtype_size(wte.dtype));
        fa.resize(k);
        fb.resize(k);
        KILN_RETURN_IF_ERROR(hf.read_range(name, info.first, info.second, at, k, a.data()));
        KILN_RETURN_IF_ERROR(wte.file->read_range(wte.name, wte.dtype, wte.shape, at, k, b.data()));
        Impl::widen(info.first, a.data(), k, fa.data());
        Impl::widen(wte.dtype, b.data(), k, fb.data());
        if (std::memcmp(fa.data(), fb.data(), k * sizeof(float)) != 0) {
          return Status::config("differs from " + wte.name +
                                ": Kiln's LM head is tied to the token embedding (an untied "
                                "head cannot be represented)")
              .with_file(file)
              .with_key(name);
        }
      }
      continue;
    }
    return Status::data("tensor " + name + " is not part of a " + arch_name(m.arch) +
                        " model Kiln can represent")
        .with_file(file)
        .with_key(name);
  }
  return src;
}

Status HfSource::Impl::read_whole(const Where& w, size_t first, size_t n, float* out) {
  const size_t es = safetensors_dtype_size(w.dtype);
  if (w.dtype == "F32") {
    KILN_RETURN_IF_ERROR(w.file->read_range(w.name, w.dtype, w.shape, first, n, out));
  } else {
    raw.resize(n * es);
    KILN_RETURN_IF_ERROR(w.file->read_range(w.name, w.dtype, w.shape, first, n, raw.data()));
    widen(w.dtype, raw.data(), n, out);
  }
  bytes_read += n * es;
  return Status::ok();
}

// Kiln's (R, K) matrix element (r, c) is the stored (K, R) element (c, r). The elements
// [first, first + n) of Kiln's row-major order span rows r0..r1; the stored block rows (Kiln's
// columns) c0..c1 x columns r0..r1 is read (only those bytes) and transposed.
Status HfSource::Impl::read_transposed(const Where& w, const ParamTensor& t, size_t first, size_t n,
                                       float* out) {
  if (n == 0) return Status::ok();
  const size_t cols = static_cast<size_t>(t.global_shape[1]);
  const size_t r0 = first / cols, r1 = (first + n - 1) / cols;
  const size_t c0 = r0 == r1 ? first % cols : 0;
  const size_t c1 = r0 == r1 ? (first + n - 1) % cols + 1 : cols;
  const size_t nr = r1 - r0 + 1, nc = c1 - c0;
  const size_t R = static_cast<size_t>(t.global_shape[0]);
  // Stored rows c0..c1 (Kiln's columns), stored columns r0..r1 (Kiln's rows): one read per stored
  // row, or - when the rows wanted are most of them (over 3/4: a whole-tensor read, not a
  // tensor-parallel slice) - the stored rows whole in one read.
  const bool whole_rows = 4 * nr > 3 * R;
  const size_t q0 = whole_rows ? 0 : r0, nq = whole_rows ? R : nr;
  const size_t es = safetensors_dtype_size(w.dtype);
  raw.resize(nq * nc * es);
  KILN_RETURN_IF_ERROR(w.file->read_block(w.name, w.dtype, w.shape, c0, nc, q0, nq, raw.data()));
  bytes_read += nq * nc * es;
  block.resize(nq * nc);
  widen(w.dtype, raw.data(), nq * nc, block.data());  // block[(c - c0) * nq + (r - q0)]
  for (size_t i = 0; i < n; ++i) {
    const size_t g = first + i, r = g / cols, c = g % cols;
    out[i] = block[(c - c0) * nq + (r - q0)];
  }
  return Status::ok();
}

Status HfSource::read(int unit, ParamField f, size_t begin, size_t n, float* dst) {
  std::fill(dst, dst + n, 0.0f);
  if (f != ParamField::kMaster) return Status::ok();  // moments start at zero
  Impl& im = *impl_;
  const ParamStore& params = *im.params;
  const size_t end = begin + n;
  for (int ti : params.units()[static_cast<size_t>(unit)].tensors) {
    const ParamTensor& pt = params.tensors()[static_cast<size_t>(ti)];
    const size_t a = std::max(begin, pt.offset), b = std::min(end, pt.offset + pt.numel);
    if (a >= b) continue;
    const size_t la = a - pt.offset, lb = b - pt.offset;  // this rank's slice elements
    const std::vector<Impl::Where>& ws = im.where[static_cast<size_t>(ti)];
    Status st = Status::ok();
    // This rank's runs of whole-tensor elements (a tensor-parallel slice of a fused q/k/v takes
    // rows of each block), each cut where one Hugging Face part ends and the next begins.
    for_each_slice_run(pt, params.tp_shard(), [&](size_t whole, size_t local, size_t count) {
      const size_t lo = std::max(local, la), hi = std::min(local + count, lb);
      if (lo >= hi || !st.is_ok()) return;
      const size_t from = whole + (lo - local), to = from + (hi - lo);
      for (const Impl::Where& w : ws) {
        const size_t x = std::max(from, w.first), y = std::min(to, w.first + w.numel);
        if (x >= y || !st.is_ok()) continue;
        float* out = dst + (a - begin) + (lo - la) + (x - from);
        st = w.transpose ? im.read_transposed(w, pt, x, y - x, out)
                         : im.read_whole(w, x - w.first, y - x, out);
      }
    });
    if (!st.is_ok()) return std::move(st).with_key(im.key);
  }
  return Status::ok();
}

// ---- model weights from any source ----------------------------------------------------------

namespace {

// The tokenizer a run trained with: the step directory's config.yaml names data.manifest, whose
// tokenizer entry names the file (relative to the manifest). "" when any step fails.
std::string run_tokenizer(const fs::path& step_dir, int64_t* eos_id) {
  std::error_code ec;
  const fs::path cfg = step_dir / "config.yaml";
  if (!fs::exists(cfg, ec)) return "";
  try {
    YAML::Node root = YAML::LoadFile(cfg.string());
    const YAML::Node man = root["data"]["manifest"];
    if (!man || !man.IsScalar() || man.as<std::string>().empty()) return "";
    fs::path mpath = man.as<std::string>();
    if (fs::is_directory(mpath, ec)) mpath /= "manifest.json";
    auto text = read_file(mpath.string());
    if (!text.is_ok()) return "";
    nlohmann::json j = parse_untrusted_json_or_discarded(*text);
    if (!j.is_object() || !j.contains("tokenizer") || !j["tokenizer"].is_object()) return "";
    const auto& t = j["tokenizer"];
    if (t.contains("eos_id") && t["eos_id"].is_number_integer())
      *eos_id = t["eos_id"].get<int64_t>();
    if (!t.contains("path") || !t["path"].is_string()) return "";
    const fs::path tok = mpath.parent_path() / t["path"].get<std::string>();
    return fs::exists(tok, ec) ? tok.string() : "";
  } catch (const std::exception&) {
    return "";
  }
}

// The step directory's config.yaml `device` (the device the run trained on), "" when absent.
std::string run_device(const fs::path& step_dir) {
  std::error_code ec;
  const fs::path cfg = step_dir / "config.yaml";
  if (!fs::exists(cfg, ec)) return "";
  try {
    const YAML::Node d = YAML::LoadFile(cfg.string())["device"];
    return d && d.IsScalar() ? d.as<std::string>() : "";
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

Result<ModelWeights> open_model_weights(const std::string& path_in) {
  ModelWeights w;
  std::error_code ec;
  fs::path path(path_in);
  if (!fs::exists(path, ec)) return Status::usage("no such file or directory: " + path_in);
  // A run directory: its latest checkpoint.
  if (fs::is_directory(path, ec) && fs::exists(path / "checkpoints" / "latest", ec)) {
    KILN_ASSIGN_OR_RETURN(std::string latest, latest_checkpoint(path.string()));
    path = latest;
  }
  w.path = path.string();
  if (fs::is_directory(path, ec) && fs::exists(path / "state.json", ec)) {
    KILN_ASSIGN_OR_RETURN(auto shape, checkpoint_model(path.string()));
    w.model = shape.first;
    w.precision = shape.second;
    w.layout = std::make_unique<ParamStore>(w.model, Precision::kFp32, false, nullptr, TpShard{},
                                            /*allocate=*/false);
    TrainerState state;
    KILN_ASSIGN_OR_RETURN(auto reader, CheckpointReader::open(path.string(), *w.layout, &state));
    w.step = state.step;
    w.source = std::move(reader);
    w.kind = "checkpoint";
    w.tokenizer = run_tokenizer(path, &w.eos_id);
    w.device = run_device(path);
    return w;
  }
  if (is_hf_dir(path.string())) {
    KILN_RETURN_IF_ERROR(refuse_meta_layout(path.string(), ""));
    HfModelInfo info;
    KILN_ASSIGN_OR_RETURN(w.model, read_hf_config(path.string(), &info));
    KILN_RETURN_IF_ERROR(check_model_shape(w.model).with_file((path / "config.json").string()));
    w.layout = std::make_unique<ParamStore>(w.model, Precision::kFp32, false, nullptr, TpShard{},
                                            /*allocate=*/false);
    KILN_ASSIGN_OR_RETURN(auto src, HfSource::open(path.string(), *w.layout, path.string()));
    w.source = std::move(src);
    w.kind = "hf";
    w.eos_id = info.eos_id;
    if (info.torch_dtype == "bfloat16") w.precision = Precision::kBf16;
    // The export's tokenizer.json (or SentencePiece tokenizer.model); directories exported
    // before it existed carry Kiln's own file or the GPT-2 pair.
    for (const char* name :
         {"tokenizer.json", "tokenizer.model", "kiln_tokenizer.json", "vocab.json"}) {
      if (fs::exists(path / name, ec)) {
        w.tokenizer = (path / name).string();
        break;
      }
    }
    return w;
  }
  if (fs::is_regular_file(path, ec)) {
    KILN_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::read_header(path.string()));
    auto m = f.metadata().find("model");
    if (m == f.metadata().end()) {
      return Status::data("no \"model\" metadata: not a `kiln checkpoint consolidate` file")
          .with_file(path.string());
    }
    nlohmann::json j = parse_untrusted_json_or_discarded(m->second);
    try {
      w.model.vocab_size = json_integer_at<int64_t>(j, "vocab_size");
      w.model.d_model = json_integer_at<int64_t>(j, "d_model");
      w.model.n_layers = json_integer_at<int64_t>(j, "n_layers");
      w.model.n_heads = json_integer_at<int64_t>(j, "n_heads");
      w.model.seq_len = json_integer_at<int64_t>(j, "seq_len");
      if (j.contains("arch")) {  // checkpoint.cc's model_json: the architecture's options
        const std::string arch = j.at("arch").get<std::string>();
        if (arch != "gpt2" && arch != "llama") {
          return Status::data("model.arch '" + arch + "' is not gpt2 or llama")
              .with_file(path.string());
        }
        w.model.arch = arch == "llama" ? Arch::kLlama : Arch::kGpt2;
        w.model.n_kv_heads = json_integer_at<int64_t>(j, "n_kv_heads");
        w.model.ffn_hidden = json_integer_at<int64_t>(j, "ffn_hidden");
        w.model.rope_theta = j.at("rope_theta").get<double>();
        const double eps = j.at("norm_eps").get<double>();  // (a float cast of 1e300 is UB)
        if (!(eps > 0 && eps < 1)) throw std::runtime_error("norm_eps must be in (0, 1)");
        w.model.norm_eps = static_cast<float>(eps);
        w.model.tie_embeddings = j.at("tie_embeddings").get<bool>();
        w.model.bias = j.at("bias").get<bool>();
      }
    } catch (const std::exception& e) {
      return Status::data(std::string("malformed \"model\" metadata: ") + e.what())
          .with_file(path.string());
    }
    KILN_RETURN_IF_ERROR(check_model_shape(w.model).with_file(path.string()));
    if (auto p = f.metadata().find("precision"); p != f.metadata().end()) {
      w.precision = p->second == "bf16"   ? Precision::kBf16
                    : p->second == "fp16" ? Precision::kFp16
                                          : Precision::kFp32;
    }
    if (auto s = f.metadata().find("step"); s != f.metadata().end()) {
      w.step = std::atoll(s->second.c_str());
    }
    w.layout = std::make_unique<ParamStore>(w.model, Precision::kFp32, false, nullptr, TpShard{},
                                            /*allocate=*/false);
    KILN_ASSIGN_OR_RETURN(
        auto reader, CheckpointReader::open_consolidated(path.string(), *w.layout, path.string()));
    w.source = std::move(reader);
    w.kind = "consolidated";
    return w;
  }
  return Status::usage(path_in +
                       " is neither a checkpoint (RUN or RUN/checkpoints/step-NNNNNNNN), a "
                       "consolidated safetensors file, nor a Hugging Face directory (config.json)");
}

Status read_tensor(ModelWeights& w, int t, size_t first, size_t n, float* dst) {
  const ParamTensor& pt = w.layout->tensors()[static_cast<size_t>(t)];
  KILN_CHECK(first + n <= pt.numel, "read_tensor: range outside the tensor");
  for (size_t done = 0; done < n;) {
    const size_t k = std::min(kStateChunk, n - done);
    KILN_RETURN_IF_ERROR(
        w.source->read(pt.unit, ParamField::kMaster, pt.offset + first + done, k, dst + done));
    done += k;
  }
  return Status::ok();
}

// ---- export ---------------------------------------------------------------------------------

namespace {

struct OutTensor {
  int kiln = 0;
  std::string name;
  bool transpose = false;
  size_t first = 0, numel = 0;  // the Kiln tensor's elements it holds
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

nlohmann::ordered_json llama_config(const ModelConfig& m, const std::string& torch_dtype,
                                    int64_t eos) {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = m.ffn();
  j["num_hidden_layers"] = m.n_layers;
  j["num_attention_heads"] = m.n_heads;
  j["num_key_value_heads"] = m.kv_heads();
  j["head_dim"] = m.head_dim();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.seq_len;
  j["initializer_range"] = std::stod(fmt::format("{}", m.init_std));
  // The float Kiln computes with, printed shortest (1e-05, not 9.99999974737875e-06).
  j["rms_norm_eps"] = std::stod(fmt::format("{}", m.norm_eps));
  j["rope_theta"] = m.rope_theta;
  j["rope_scaling"] = nullptr;
  j["attention_bias"] = m.bias;
  j["mlp_bias"] = m.bias;
  j["attention_dropout"] = 0.0;
  j["pretraining_tp"] = 1;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["use_cache"] = true;
  if (eos >= 0) {
    j["bos_token_id"] = eos;
    j["eos_token_id"] = eos;
  } else {
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = nullptr;
  }
  j["torch_dtype"] = torch_dtype;
  return j;
}

nlohmann::ordered_json gpt2_config(const ModelConfig& m, const std::string& torch_dtype,
                                   int64_t eos) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = m.vocab_size;
  j["n_positions"] = m.seq_len;
  j["n_ctx"] = m.seq_len;
  j["n_embd"] = m.d_model;
  j["n_layer"] = m.n_layers;
  j["n_head"] = m.n_heads;
  j["n_inner"] = nullptr;
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = kLayerNormEps;
  j["initializer_range"] = std::stod(fmt::format("{}", m.init_std));  // 0.02, not 0.0199999...
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  if (eos >= 0) {
    j["bos_token_id"] = eos;
    j["eos_token_id"] = eos;
  } else {
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = nullptr;
  }
  j["torch_dtype"] = torch_dtype;
  return j;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

Status export_hf(const std::string& source, const HfExportOptions& o, HfExportReport* report,
                 const HfTokenizerWriter& tokenizer) {
  if (o.dtype != "fp32" && o.dtype != "bf16") {
    return Status::usage("--dtype must be fp32 or bf16, not '" + o.dtype + "'");
  }
  if (o.max_shard_bytes == 0) return Status::usage("--max-shard-size must be positive");
  KILN_ASSIGN_OR_RETURN(ModelWeights w, open_model_weights(source));
  const fs::path out(o.output);
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec))) {
    if (!o.overwrite) {
      return Status::usage(o.output + " exists and is not empty (--overwrite replaces it)");
    }
  }
  const std::string st_dtype = o.dtype == "bf16" ? "BF16" : "F32";
  const size_t es = safetensors_dtype_size(st_dtype);
  // The tensors in Kiln's order, under their Hugging Face names, cut into shards of at most
  // max_shard_bytes (a tensor larger than the limit is a shard of its own).
  std::vector<OutTensor> tensors;
  for (size_t i = 0; i < w.layout->tensors().size(); ++i) {
    const ParamTensor& t = w.layout->tensors()[i];
    KILN_ASSIGN_OR_RETURN(std::vector<HfPart> parts, hf_tensor_parts(w.model, t));
    for (HfPart& p : parts) {
      OutTensor ot;
      ot.kiln = static_cast<int>(i);
      ot.name = std::move(p.name);
      ot.transpose = p.transpose;
      ot.first = p.first;
      ot.numel = p.numel;
      ot.shape = std::move(p.shape);
      ot.bytes = p.numel * es;
      tensors.push_back(std::move(ot));
    }
  }
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!shards.back().empty() && in_shard + tensors[i].bytes > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += tensors[i].bytes;
    total += tensors[i].bytes;
  }
  const fs::path tmp =
      out.parent_path() / ("." + out.filename().string() + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return fs_error("create output directory", tmp, ec);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code e;
      if (!p.empty()) fs::remove_all(p, e);
    }
  } cleanup{tmp};

  std::vector<float> buf, tbuf;
  std::vector<bf16> half;
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        shards.size() == 1 ? "model.safetensors" : shard_name(s, shards.size());
    std::vector<SafetensorsWriter::Spec> specs;
    for (size_t i : shards[s]) specs.push_back({tensors[i].name, st_dtype, tensors[i].shape});
    SafetensorsWriter writer;
    KILN_RETURN_IF_ERROR(writer.open((tmp / file).string(), specs, meta));
    auto emit = [&](const float* v, size_t n) -> Status {
      if (st_dtype == "F32") return writer.append(v, n * sizeof(float));
      half.resize(n);
      cpu::cast(half.data(), v, n);
      return writer.append(half.data(), n * sizeof(bf16));
    };
    for (size_t i : shards[s]) {
      const OutTensor& ot = tensors[i];
      const ParamTensor& t = w.layout->tensors()[static_cast<size_t>(ot.kiln)];
      weight_map[ot.name] = file;
      if (!ot.transpose) {  // the same layout (or a block of its rows): in chunks
        for (size_t at = 0; at < ot.numel; at += kStateChunk) {
          const size_t k = std::min(kStateChunk, ot.numel - at);
          buf.resize(k);
          KILN_RETURN_IF_ERROR(read_tensor(w, ot.kiln, ot.first + at, k, buf.data()));
          KILN_RETURN_IF_ERROR(emit(buf.data(), k));
        }
        continue;
      }
      // A matrix stored transposed: the whole matrix (the largest one bounds the memory).
      const size_t R = static_cast<size_t>(t.global_shape[0]);
      const size_t C = static_cast<size_t>(t.global_shape[1]);
      buf.resize(t.numel);
      tbuf.resize(t.numel);
      KILN_RETURN_IF_ERROR(read_tensor(w, ot.kiln, 0, t.numel, buf.data()));
      for (size_t r = 0; r < R; ++r)
        for (size_t c = 0; c < C; ++c) tbuf[c * R + r] = buf[r * C + c];
      KILN_RETURN_IF_ERROR(emit(tbuf.data(), t.numel));
    }
    KILN_RETURN_IF_ERROR(writer.commit());
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    KILN_RETURN_IF_ERROR(
        write_file_atomic((tmp / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  }
  const std::string torch_dtype = torch_dtype_name(st_dtype);
  KILN_RETURN_IF_ERROR(
      write_file_atomic((tmp / "config.json").string(),
                        (w.model.llama() ? llama_config(w.model, torch_dtype, w.eos_id)
                                         : gpt2_config(w.model, torch_dtype, w.eos_id))
                                .dump(2) +
                            "\n"));
  nlohmann::ordered_json gen;
  gen["bos_token_id"] = w.eos_id >= 0 ? nlohmann::ordered_json(w.eos_id) : nullptr;
  gen["eos_token_id"] = w.eos_id >= 0 ? nlohmann::ordered_json(w.eos_id) : nullptr;
  gen["max_length"] = w.model.seq_len;
  KILN_RETURN_IF_ERROR(
      write_file_atomic((tmp / "generation_config.json").string(), gen.dump(2) + "\n"));
  bool wrote_tokenizer = false;
  if (tokenizer) {
    Status st = tokenizer(tmp.string(), w);
    if (!st.is_ok() && st.code() != StatusCode::kNotFound) return st;
    wrote_tokenizer = st.is_ok();
  }
  KILN_RETURN_IF_ERROR(fsync_dir(tmp.string()));
  if (fs::exists(out, ec)) {
    fs::remove_all(out, ec);
    if (ec) return fs_error("remove the old output", out, ec);
  }
  KILN_RETURN_IF_ERROR(rename_durable(tmp.string(), out.string()));
  cleanup.p.clear();
  if (report) {
    report->tensors = tensors.size();
    report->files = shards.size();
    report->bytes = total;
    report->tokenizer = wrote_tokenizer;
  }
  return Status::ok();
}

}  // namespace kiln::engine
