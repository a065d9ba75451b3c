#include "engine/checkpoint/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.h"
#include "kernels/dtype.h"

namespace kiln::engine {
namespace fs = std::filesystem;

namespace {

// ggml_type values (ggml.h) and general.file_type values (llama.h's LLAMA_FTYPE_*).
enum GgmlType : uint32_t { kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30 };
enum GgufValue : uint32_t { kU32 = 4, kI32 = 5, kF32v = 6, kBool = 7, kString = 8, kArray = 9 };
constexpr uint32_t kAlignment = 32;
constexpr size_t kQ8Block = 32, kQ8BlockBytes = 34;

// Kiln name pattern ('#': the layer) -> llama.cpp's, for tensors written whole.
struct GgufNameRule {
  const char* kiln;
  const char* gguf;
};
constexpr GgufNameRule kGgufNames[] = {
    {"wte", "token_embd.weight"},
    {"wpe", "position_embd.weight"},
    {"blocks.#.ln1.weight", "blk.#.attn_norm.weight"},
    {"blocks.#.ln1.bias", "blk.#.attn_norm.bias"},
    {"blocks.#.attn.qkv.weight", "blk.#.attn_qkv.weight"},  // gpt2; llama: split below
    {"blocks.#.attn.qkv.bias", "blk.#.attn_qkv.bias"},
    {"blocks.#.attn.proj.weight", "blk.#.attn_output.weight"},
    {"blocks.#.attn.proj.bias", "blk.#.attn_output.bias"},
    {"blocks.#.ln2.weight", "blk.#.ffn_norm.weight"},
    {"blocks.#.ln2.bias", "blk.#.ffn_norm.bias"},
    {"blocks.#.mlp.fc.weight", "blk.#.ffn_up.weight"},  // gpt2; llama: gate then up
    {"blocks.#.mlp.fc.bias", "blk.#.ffn_up.bias"},
    {"blocks.#.mlp.proj.weight", "blk.#.ffn_down.weight"},
    {"blocks.#.mlp.proj.bias", "blk.#.ffn_down.bias"},
    {"ln_f.weight", "output_norm.weight"},
    {"ln_f.bias", "output_norm.bias"},
    {"lm_head.weight", "output.weight"},
};

bool match(const std::string& name, const std::string& pattern, std::string* layer) {
  const size_t hash = pattern.find('#');
  if (hash == std::string::npos) return name == pattern;
  const std::string head = pattern.substr(0, hash), tail = pattern.substr(hash + 1);
  if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  *layer = name.substr(head.size(), name.size() - head.size() - tail.size());
  return !layer->empty() && std::all_of(layer->begin(), layer->end(), ::isdigit);
}

std::string fill(const char* pattern, const std::string& layer) {
  std::string p(pattern);
  const size_t hash = p.find('#');
  if (hash != std::string::npos) p.replace(hash, 1, layer);
  return p;
}

// Little-endian serialisation of GGUF values.
struct Buf {
  std::string s;
  template <typename T>
  void pod(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& v) {
    pod<uint64_t>(v.size());
    s += v;
  }
  uint64_t count = 0;  // key-value pairs
  void key(const std::string& k, uint32_t type) {
    str(k);
    pod<uint32_t>(type);
    ++count;
  }
  void kv_u32(const std::string& k, uint64_t v) {
    key(k, kU32);
    pod<uint32_t>(static_cast<uint32_t>(v));
  }
  void kv_f32(const std::string& k, double v) {
    key(k, kF32v);
    pod<float>(static_cast<float>(v));
  }
  void kv_bool(const std::string& k, bool v) {
    key(k, kBool);
    pod<uint8_t>(v ? 1 : 0);
  }
  void kv_str(const std::string& k, const std::string& v) {
    key(k, kString);
    str(v);
  }
  void kv_strs(const std::string& k, const std::vector<std::string>& v) {
    key(k, kArray);
    pod<uint32_t>(kString);
    pod<uint64_t>(v.size());
    for (const auto& x : v) str(x);
  }
  void kv_i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, kArray);
    pod<uint32_t>(kI32);
    pod<uint64_t>(v.size());
    for (int32_t x : v) pod<int32_t>(x);
  }
};

uint64_t align_up(uint64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }

struct OutTensor {
  int kiln = 0;
  GgufPart part;
  uint32_t type = kF32;
  uint64_t bytes = 0, offset = 0;
};

uint64_t tensor_bytes(uint32_t type, size_t numel) {
  switch (type) {
    case kF32:
      return numel * 4;
    case kQ8_0:
      return numel / kQ8Block * kQ8BlockBytes;
    default:
      return numel * 2;
  }
}

}  // namespace

Result<std::vector<GgufPart>> gguf_tensor_parts(const ModelConfig& m, const ParamTensor& t) {
  const std::vector<int64_t>& s = t.global_shape;
  auto dims_of = [](const std::vector<int64_t>& shape) {
    return std::vector<int64_t>(shape.rbegin(), shape.rend());  // ggml: innermost first
  };
  std::string layer;
  if (m.llama() && (match(t.name, "blocks.#.attn.qkv.weight", &layer) ||
                    match(t.name, "blocks.#.attn.qkv.bias", &layer))) {
    const bool w = t.name.ends_with(".weight");
    const int64_t hd = m.head_dim(), cols = w ? s[1] : 1;
    const int64_t rows[3] = {m.n_heads * hd, m.kv_heads() * hd, m.kv_heads() * hd};
    const int64_t heads[3] = {m.n_heads, m.kv_heads(), 0};
    const char* names[3] = {"attn_q", "attn_k", "attn_v"};
    std::vector<GgufPart> parts;
    size_t first = 0;
    for (int i = 0; i < 3; ++i) {
      GgufPart p;
      p.name = "blk." + layer + "." + names[i] + (w ? ".weight" : ".bias");
      p.first = first;
      p.numel = size_t(rows[i] * cols);
      p.dims = w ? std::vector<int64_t>{cols, rows[i]} : std::vector<int64_t>{rows[i]};
      p.rope_heads = heads[i];
      first += p.numel;
      parts.push_back(std::move(p));
    }
    return parts;
  }
  if (m.llama() && (match(t.name, "blocks.#.mlp.fc.weight", &layer) ||
                    match(t.name, "blocks.#.mlp.fc.bias", &layer))) {
    const bool w = t.name.ends_with(".weight");
    const int64_t f = m.ffn(), cols = w ? s[1] : 1;
    std::vector<GgufPart> parts;
    const char* names[2] = {"ffn_gate", "ffn_up"};
    for (int i = 0; i < 2; ++i) {
      GgufPart p;
      p.name = "blk." + layer + "." + names[i] + (w ? ".weight" : ".bias");
      p.first = size_t(i * f * cols);
      p.numel = size_t(f * cols);
      p.dims = w ? std::vector<int64_t>{cols, f} : std::vector<int64_t>{f};
      parts.push_back(std::move(p));
    }
    return parts;
  }
  for (const GgufNameRule& r : kGgufNames) {
    if (!match(t.name, r.kiln, &layer)) continue;
    GgufPart p;
    p.name = fill(r.gguf, layer);
    p.numel = t.numel;
    p.dims = dims_of(s);
    return std::vector<GgufPart>{std::move(p)};
  }
  return Status::not_found("no GGUF name for Kiln tensor '" + t.name + "'");
}

void permute_rope_rows(const float* in, float* out, int64_t heads, int64_t head_dim, size_t cols) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t sgn = 0; sgn < 2; ++sgn) {
        const float* src = in + size_t(h * head_dim + sgn * half + j) * cols;
        float* dst = out + size_t(h * head_dim + 2 * j + sgn) * cols;
        std::memcpy(dst, src, cols * sizeof(float));
      }
}

void quantize_q8_0(const float* x, size_t n, uint8_t* out) {
  for (size_t b = 0; b < n / kQ8Block; ++b) {
    const float* v = x + b * kQ8Block;
    float amax = 0.0f;
    for (size_t j = 0; j < kQ8Block; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* blk = out + b * kQ8BlockBytes;
    const uint16_t dh = float_to_fp16(d).bits;
    std::memcpy(blk, &dh, 2);
    for (size_t j = 0; j < kQ8Block; ++j) {
      const int8_t q = static_cast<int8_t>(std::lround(v[j] * id));
      std::memcpy(blk + 2 + j, &q, 1);
    }
  }
}

Status export_gguf(const std::string& source, const GgufExportOptions& o,
                   const GgufVocabReader& vocab_reader, GgufExportReport* report) {
  const std::string& dt = o.dtype;
  if (dt != "f32" && dt != "f16" && dt != "bf16" && dt != "q8_0")
    return Status::usage("--dtype must be f32, f16, bf16 or q8_0 for --format gguf, not '" + dt +
                         "'");
  std::error_code ec;
  if (fs::exists(o.output, ec) && !o.overwrite)
    return Status::usage(o.output + " exists (--overwrite replaces it)");
  KILN_ASSIGN_OR_RETURN(ModelWeights w, open_model_weights(source));
  const ModelConfig& m = w.model;
  const std::string arch = m.llama() ? "llama" : "gpt2";
  if (!m.llama() && !m.bias)
    return Status::usage(
        "llama.cpp's gpt2 architecture needs the biases of every layer; a GPT-2 model trained "
        "with model.bias: false has none (train it as model.arch: llama, or with biases)");
  if (m.llama() && m.head_dim() % 2 != 0)
    return Status::usage("head_dim " + std::to_string(m.head_dim()) + " is odd: RoPE needs pairs");
  if (!vocab_reader) return Status::usage("no tokenizer for the GGUF vocabulary");
  auto vr = vocab_reader(w);
  if (!vr.is_ok()) {
    if (vr.status().code() == StatusCode::kNotFound)
      return Status::usage("a GGUF file needs the model's tokenizer and this model has none (" +
                           vr.status().message() + "); give --tokenizer FILE");
    return std::move(vr).take_status();
  }
  GgufVocab vocab = std::move(vr).value();
  if (int64_t(vocab.tokens.size()) != m.vocab_size)
    return Status::usage("the tokenizer has " + std::to_string(vocab.tokens.size()) +
                         " tokens, the model's vocabulary " + std::to_string(m.vocab_size) +
                         ": llama.cpp needs one token per embedding row (--tokenizer)");
  if (vocab.token_types.size() != vocab.tokens.size())
    return Status::internal("token types and tokens differ in number");

  const uint32_t mat_type = dt == "f32" ? kF32 : dt == "f16" ? kF16 : dt == "bf16" ? kBF16 : kQ8_0;
  // The tensors in Kiln's order, under llama.cpp's names.
  std::vector<OutTensor> tensors;
  uint64_t data_bytes = 0;
  for (size_t i = 0; i < w.layout->tensors().size(); ++i) {
    const ParamTensor& t = w.layout->tensors()[i];
    KILN_ASSIGN_OR_RETURN(std::vector<GgufPart> parts, gguf_tensor_parts(m, t));
    for (GgufPart& p : parts) {
      OutTensor ot;
      ot.kiln = int(i);
      const bool matrix = p.dims.size() == 2;
      ot.type = matrix ? mat_type : kF32;
      if (ot.type == kQ8_0 && p.dims[0] % int64_t(kQ8Block) != 0) ot.type = kF16;
      ot.part = std::move(p);
      ot.bytes = tensor_bytes(ot.type, ot.part.numel);
      ot.offset = data_bytes;
      data_bytes = align_up(data_bytes + ot.bytes);
      tensors.push_back(std::move(ot));
    }
  }

  Buf kv;
  kv.kv_str("general.architecture", arch);
  kv.kv_str("general.name", "kiln-" + arch);
  kv.kv_u32("general.file_type", dt == "f32" ? 0 : dt == "f16" ? 1 : dt == "bf16" ? 32 : 7);
  if (mat_type == kQ8_0) kv.kv_u32("general.quantization_version", 2);
  kv.kv_u32("general.alignment", kAlignment);
  kv.kv_u32(arch + ".context_length", uint64_t(m.seq_len));
  kv.kv_u32(arch + ".embedding_length", uint64_t(m.d_model));
  kv.kv_u32(arch + ".block_count", uint64_t(m.n_layers));
  kv.kv_u32(arch + ".feed_forward_length", uint64_t(m.ffn()));
  kv.kv_u32(arch + ".attention.head_count", uint64_t(m.n_heads));
  kv.kv_u32(arch + ".attention.head_count_kv", uint64_t(m.kv_heads()));
  if (m.llama()) {
    kv.kv_f32("llama.attention.layer_norm_rms_epsilon", m.norm_eps);
    kv.kv_f32("llama.rope.freq_base", m.rope_theta);
    kv.kv_u32("llama.rope.dimension_count", uint64_t(m.head_dim()));
    kv.kv_u32("llama.vocab_size", uint64_t(m.vocab_size));
  } else {
    kv.kv_f32("gpt2.attention.layer_norm_epsilon", 1e-5);  // kernels/ops.h layernorm_forward
  }
  kv.kv_str("tokenizer.ggml.model", "gpt2");
  kv.kv_str("tokenizer.ggml.pre", vocab.pre);
  kv.kv_strs("tokenizer.ggml.tokens", vocab.tokens);
  kv.kv_i32s("tokenizer.ggml.token_type", vocab.token_types);
  kv.kv_strs("tokenizer.ggml.merges", vocab.merges);
  if (vocab.bos_id >= 0) kv.kv_u32("tokenizer.ggml.bos_token_id", uint64_t(vocab.bos_id));
  if (vocab.eos_id >= 0) kv.kv_u32("tokenizer.ggml.eos_token_id", uint64_t(vocab.eos_id));
  if (vocab.pad_id >= 0) kv.kv_u32("tokenizer.ggml.padding_token_id", uint64_t(vocab.pad_id));
  kv.kv_bool("tokenizer.ggml.add_bos_token", false);
  kv.kv_bool("tokenizer.ggml.add_eos_token", false);
  if (!vocab.chat_template.empty()) kv.kv_str("tokenizer.chat_template", vocab.chat_template);

  Buf head;
  head.s = "GGUF";
  head.pod<uint32_t>(3);
  head.pod<uint64_t>(tensors.size());
  head.pod<uint64_t>(kv.count);
  head.s += kv.s;
  for (const OutTensor& ot : tensors) {
    head.str(ot.part.name);
    head.pod<uint32_t>(uint32_t(ot.part.dims.size()));
    for (int64_t d : ot.part.dims) head.pod<uint64_t>(uint64_t(d));
    head.pod<uint32_t>(ot.type);
    head.pod<uint64_t>(ot.offset);
  }
  head.s.resize(align_up(head.s.size()), '\0');

  AtomicFile file;
  KILN_RETURN_IF_ERROR(file.open(o.output));
  KILN_RETURN_IF_ERROR(file.write(head.s));
  uint64_t written = 0;  // bytes of the data section
  std::vector<float> buf, perm;
  std::vector<uint8_t> enc;
  for (const OutTensor& ot : tensors) {
    const GgufPart& p = ot.part;
    if (written < ot.offset) {
      KILN_RETURN_IF_ERROR(file.write(std::string(ot.offset - written, '\0')));
      written = ot.offset;
    }
    // Whole rows at a time (whole heads for q / k), about kStateChunk values.
    const size_t cols = p.dims.size() >= 2 ? size_t(p.dims[0]) : 1;
    size_t rows_per = std::max<size_t>(1, kStateChunk / cols);
    if (p.rope_heads) {
      const size_t hd = size_t(m.head_dim());
      rows_per = std::max(hd, rows_per / hd * hd);
    }
    const size_t rows = p.numel / cols;
    for (size_t r0 = 0; r0 < rows; r0 += rows_per) {
      const size_t nr = std::min(rows_per, rows - r0), n = nr * cols;
      buf.resize(n);
      KILN_RETURN_IF_ERROR(read_tensor(w, ot.kiln, p.first + r0 * cols, n, buf.data()));
      const float* v = buf.data();
      if (p.rope_heads) {
        perm.resize(n);
        permute_rope_rows(buf.data(), perm.data(), int64_t(nr) / m.head_dim(), m.head_dim(), cols);
        v = perm.data();
      }
      const uint64_t nb = tensor_bytes(ot.type, n);
      enc.resize(nb);
      switch (ot.type) {
        case kF32:
          std::memcpy(enc.data(), v, nb);
          break;
        case kF16:
          for (size_t i = 0; i < n; ++i) {
            const uint16_t h = float_to_fp16(v[i]).bits;
            std::memcpy(enc.data() + 2 * i, &h, 2);
          }
          break;
        case kBF16:
          for (size_t i = 0; i < n; ++i) {
            const uint16_t h = float_to_bf16(v[i]).bits;
            std::memcpy(enc.data() + 2 * i, &h, 2);
          }
          break;
        case kQ8_0:
          quantize_q8_0(v, n, enc.data());
          break;
      }
      KILN_RETURN_IF_ERROR(
          file.write(std::string_view(reinterpret_cast<const char*>(enc.data()), nb)));
      written += nb;
    }
  }
  if (written < data_bytes)
    KILN_RETURN_IF_ERROR(file.write(std::string(data_bytes - written, '\0')));
  KILN_RETURN_IF_ERROR(file.commit());
  if (report) {
    report->tensors = tensors.size();
    report->bytes = head.s.size() + data_bytes;
    report->arch = arch;
  }
  return Status::ok();
}

}  // namespace kiln::engine
