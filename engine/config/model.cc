#include "engine/config/model.h"

#include <array>
#include <cmath>

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

constexpr std::array<std::pair<const char*, Arch>, 2> kArchs{
    {{"gpt2", Arch::kGpt2}, {"llama", Arch::kLlama}}};
constexpr std::array<std::pair<const char*, InitScheme>, 2> kInits{
    {{"gpt2", InitScheme::kGpt2}, {"deepnet", InitScheme::kDeepNet}}};

// A boolean key that may be `auto` (the architecture's default: auto_value(model)).
Field<ModelConfig> auto_bool(std::string key, bool ModelConfig::*member,
                             bool (*auto_value)(const ModelConfig&), std::string comment) {
  return custom<ModelConfig>(
      std::move(key), [](const ModelConfig&) { return std::string("auto"); },
      [member, auto_value](const Config& cfg, const std::string& k, ModelConfig* m) -> Status {
        KILN_ASSIGN_OR_RETURN(std::string v, cfg.get<std::string>(k));
        if (v == "auto") {
          m->*member = auto_value(*m);
        } else if (v == "true") {
          m->*member = true;
        } else if (v == "false") {
          m->*member = false;
        } else {
          return bad(k, "'" + v + "' is not one of auto | true | false");
        }
        return Status::ok();
      },
      std::move(comment));
}

Status check_model(const ModelConfig& m) {
  if (!m.llama() && m.norm_eps != 1e-5f) {
    return bad("model.norm_eps", "applies to model.arch: llama (GPT-2's LayerNorm uses 1e-5)");
  }
  return check_model_shape(m);
}

}  // namespace

const Schema<ModelConfig>& model_schema() {
  using M = ModelConfig;
  static const Schema<M> schema{
      "model",
      {
          choice<M>("arch", &M::arch, Names<Arch>(kArchs), "gpt2 | llama"),
          integer<M>("vocab_size", &M::vocab_size),
          integer<M>("d_model", &M::d_model),
          integer<M>("n_layers", &M::n_layers),
          integer<M>("n_heads", &M::n_heads),
          integer<M>("seq_len", &M::seq_len),
          integer<M>("n_kv_heads", &M::n_kv_heads,
                     "key/value heads, grouped-query attention (0: n_heads)"),
          integer<M>("ffn_hidden", &M::ffn_hidden,
                     "MLP hidden units (0: 4 d_model for gpt2; 8/3 d_model rounded up to 256 for "
                     "llama)"),
          real<M>("rope_theta", &M::rope_theta, 1.0, 1e12, "llama: rotary base", Open::kLow),
          real<M>("norm_eps", &M::norm_eps, 0.0, 1.0,
                  "llama: RMSNorm eps (gpt2's LayerNorm uses 1e-5)", Open::kLow),
          auto_bool(
              "tie_embeddings", &M::tie_embeddings, [](const M& m) { return !m.llama(); },
              "auto (gpt2 true, llama false) | true | false"),
          auto_bool(
              "bias", &M::bias, [](const M& m) { return !m.llama(); },
              "auto (gpt2 true, llama false) | true | false"),
          auto_bool(
              "doc_mask", &M::doc_mask, [](const M& m) { return m.llama(); },
              "auto (gpt2 false, llama true) | true | false: attention and positions restart "
              "at document starts"),
          choice<M>("init", &M::init, Names<InitScheme>(kInits), "gpt2 | deepnet"),
          real<M>("init_std", &M::init_std, 0.0, 10.0, "", Open::kLow),
          text<M>("init_from", &M::init_from,
                  "start from these weights (a `kiln checkpoint consolidate` file or a Hugging "
                  "Face GPT-2 directory)"),
      },
      check_model};
  return schema;
}

const char* arch_name(Arch a) { return name_of(Names<Arch>(kArchs), a); }

int64_t llama_ffn_hidden(int64_t d_model) {
  const int64_t h = 2 * (4 * d_model) / 3;
  return (h + 255) / 256 * 256;
}

int64_t ModelConfig::ffn() const {
  if (ffn_hidden > 0) return ffn_hidden;
  return llama() ? llama_ffn_hidden(d_model) : 4 * d_model;
}

Status check_model_shape(const ModelConfig& m) {
  KILN_RETURN_IF_ERROR(check_range("model.vocab_size", m.vocab_size, 2, int64_t{1} << 31));
  KILN_RETURN_IF_ERROR(check_range("model.d_model", m.d_model, 1, 1 << 20));
  KILN_RETURN_IF_ERROR(check_range("model.n_layers", m.n_layers, 1, 1 << 16));
  KILN_RETURN_IF_ERROR(check_range("model.n_heads", m.n_heads, 1, 1 << 16));
  KILN_RETURN_IF_ERROR(check_range("model.seq_len", m.seq_len, 1, 1 << 24));
  if (m.d_model % m.n_heads != 0) {
    return bad("model.n_heads", "must divide model.d_model (" + std::to_string(m.d_model) + ")");
  }
  KILN_RETURN_IF_ERROR(check_range("model.n_kv_heads", m.n_kv_heads, 0, m.n_heads));
  if (m.n_heads % m.kv_heads() != 0) {
    return bad("model.n_kv_heads",
               "must divide model.n_heads (" + std::to_string(m.n_heads) + "), got " +
                   std::to_string(m.n_kv_heads) +
                   ": each key/value head serves n_heads / n_kv_heads query heads");
  }
  KILN_RETURN_IF_ERROR(check_range("model.ffn_hidden", m.ffn_hidden, 0, int64_t{1} << 24));
  if (m.llama() && m.head_dim() % 2 != 0) {
    return bad("model.n_heads",
               "gives an odd head dimension d_model / n_heads = " + std::to_string(m.head_dim()) +
                   ": rotary embeddings rotate pairs of channels, so "
                   "model.d_model / model.n_heads must be even");
  }
  if (!(m.rope_theta > 1.0) || !std::isfinite(m.rope_theta)) {
    return bad("model.rope_theta", "must be a finite number above 1");
  }
  if (!(m.norm_eps > 0.0f) || !std::isfinite(m.norm_eps)) {
    return bad("model.norm_eps", "must be a positive finite number");
  }
  return Status::ok();
}

Result<ModelConfig> parse_model_config(const Config& cfg) {
  return parse_section(cfg, model_schema());
}

}  // namespace kiln::engine
