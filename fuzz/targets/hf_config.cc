// Fuzz target: a Hugging Face directory's config.json (engine/checkpoint/hf.h read_hf_config),
// GPT-2 or Llama. Invariants on an accepted config: every size is positive and within
// read_hf_config's bound (so the arithmetic on them stays inside 64 bits), n_heads divides
// d_model and the key/value heads divide n_heads; the ids it reports are -1 or in the vocabulary.
#include <filesystem>

#include "engine/checkpoint/hf.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  fuzz::quiet_logs();
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/hf_config";
    std::filesystem::create_directories(d);
    return d;
  }();
  fuzz::write_scratch("hf_config/config.json", fuzz::as_view(data, size));
  engine::HfModelInfo info;
  auto m = engine::read_hf_config(dir, &info);
  if (!m.is_ok()) return 0;
  constexpr int64_t kMax = int64_t{1} << 31;
  for (int64_t v : {m->vocab_size, m->d_model, m->n_layers, m->n_heads, m->seq_len}) {
    FUZZ_REQUIRE(v > 0 && v <= kMax);
  }
  FUZZ_REQUIRE(m->d_model % m->n_heads == 0);
  FUZZ_REQUIRE(m->kv_heads() > 0 && m->n_heads % m->kv_heads() == 0);
  FUZZ_REQUIRE(info.eos_id == -1 || (info.eos_id >= 0 && info.eos_id < m->vocab_size));
  FUZZ_REQUIRE(info.bos_id == -1 || (info.bos_id >= 0 && info.bos_id < m->vocab_size));
  (void)engine::check_model_shape(*m);
  return 0;
}
