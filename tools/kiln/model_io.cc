#include "tools/kiln/model_io.h"

namespace kiln::cli {

Result<prep::Tokenizer> model_tokenizer(const engine::ModelWeights& w,
                                        const std::string& flag_path) {
  const std::string path = flag_path.empty() ? w.tokenizer : flag_path;
  if (path.empty()) {
    return Status::not_found("no tokenizer found beside " + w.path +
                             " (the run's data.manifest names none, or the directory has no "
                             "tokenizer file): give --tokenizer FILE")
        .with_key("--tokenizer");
  }
  KILN_ASSIGN_OR_RETURN(prep::Tokenizer tok, prep::Tokenizer::load(path));
  if (static_cast<int64_t>(tok.vocab_size()) > w.model.vocab_size) {
    return Status::usage("the tokenizer has " + std::to_string(tok.vocab_size()) +
                         " tokens, more than the model's vocabulary of " +
                         std::to_string(w.model.vocab_size))
        .with_file(path);
  }
  return tok;
}

Result<std::unique_ptr<engine::GptInference>> load_inference(engine::ModelWeights& w,
                                                             const std::string& flag,
                                                             int64_t positions,
                                                             const std::string& key) {
  const bool from_run = flag.empty() && !w.device.empty();
  const std::string name = !flag.empty() ? flag : from_run ? w.device : "cpu";
  const std::string where =
      from_run ? " (the device of the run's config.yaml; --device cpu overrides it)" : "";
  auto device = engine::parse_device(name, "--device");
  if (!device.is_ok()) {
    return Status::usage("--device '" + name + "' is not one of cpu | cuda" + where)
        .with_key("--device");
  }
  // (a device that cannot be used is reported by load below, naming --device)
  Status memory = engine::check_inference_memory(w.model, positions, *device, key);
  if (!memory.is_ok() && memory.key() != "device") return memory;
  auto model = engine::GptInference::load(w, *device);
  if (!model.is_ok() && model.status().key() == "device") {
    return Status(model.status()).with_key("--device").prefixed("--device " + name + where);
  }
  return model;
}

Status write_hf_tokenizer_files(const std::string& dir, const engine::ModelWeights& w,
                                const std::string& flag_path) {
  auto tok = model_tokenizer(w, flag_path);
  if (!tok.is_ok()) return std::move(tok).take_status();
  prep::HfTokenizerConfig config;
  config.model_max_length = static_cast<uint64_t>(w.model.seq_len);
  return prep::write_hf_tokenizer(*tok, dir, config);
}

}  // namespace kiln::cli
