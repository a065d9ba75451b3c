// Fuzz target: the weight files of a Hugging Face directory as HfSource reads them
// (engine/checkpoint/hf.h): model.safetensors.index.json and a safetensors shard (its header
// through SafetensorsFile::read_header, its tensors by byte ranges, widened from F32/BF16/F16).
// Input: byte 0 picks the model (even: a GPT-2 of vocab 8, n_embd 4, 1 layer, 1 head, 4
// positions; odd: a Llama of the same sizes, ffn 8, untied head); then the index text, the line
// "#kiln-fuzz-shard", and the shard's bytes. An empty index means none (the shard is then
// model.safetensors); with an index, the shard is a.safetensors. Invariant: a directory that
// opens reads every tensor of the model without error, all values finite or not (ASan checks
// the bytes read were inside the file).
#include <filesystem>

#include "engine/checkpoint/hf.h"
#include "engine/model/params.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  namespace fs = std::filesystem;
  fuzz::quiet_logs();
  if (size < 1) return 0;
  const bool llama = data[0] & 1;
  auto [index, shard] = fuzz::split_two(fuzz::as_view(data + 1, size - 1), "\n#kiln-fuzz-shard\n");
  const std::string dir = fuzz::scratch_dir() + "/hf_weights";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  engine::ModelConfig m;
  m.vocab_size = 8;
  m.d_model = 4;
  m.n_layers = 1;
  m.n_heads = 1;
  m.seq_len = 4;
  if (llama) {
    m.arch = engine::Arch::kLlama;
    m.ffn_hidden = 8;
    m.tie_embeddings = false;
    m.norm_eps = 1e-6f;
    fuzz::write_scratch("hf_weights/config.json",
                        R"({"model_type": "llama", "vocab_size": 8, "hidden_size": 4,
                            "num_hidden_layers": 1, "num_attention_heads": 1,
                            "num_key_value_heads": 1, "intermediate_size": 8,
                            "max_position_embeddings": 4, "rms_norm_eps": 1e-06,
                            "rope_theta": 10000.0, "tie_word_embeddings": false})");
  } else {
    fuzz::write_scratch("hf_weights/config.json",
                        R"({"model_type": "gpt2", "vocab_size": 8, "n_embd": 4, "n_layer": 1,
                            "n_head": 1, "n_positions": 4})");
  }
  if (index.empty()) {
    fuzz::write_scratch("hf_weights/model.safetensors", shard);
  } else {
    fuzz::write_scratch("hf_weights/model.safetensors.index.json", index);
    fuzz::write_scratch("hf_weights/a.safetensors", shard);
  }
  engine::ParamStore params(m, engine::Precision::kFp32);
  auto src = engine::HfSource::open(dir, params, "fuzz");
  if (!src.is_ok()) return 0;
  FUZZ_REQUIRE(params.fill(**src).is_ok());
  return 0;
}
