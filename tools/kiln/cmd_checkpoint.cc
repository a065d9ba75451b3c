// kiln checkpoint consolidate STEP_DIR -o model.safetensors
// kiln checkpoint export STEP_DIR --format hf -o DIR
// kiln checkpoint export STEP_DIR --format gguf -o FILE.gguf
#include <sys/resource.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/gguf.h"
#include "engine/checkpoint/hf.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/params.h"
#include "tools/kiln/command.h"
#include "tools/kiln/model_io.h"

namespace kiln::cli {
namespace {
namespace fs = std::filesystem;

struct ConsolidateArgs {
  std::string dir;
  std::string output;
};

// One file with every parameter of a complete checkpoint, loadable by one process (safetensors,
// fp32): the checkpoint is loaded as a resume would (checksums verified, per-rank partitions of
// any data-parallel size, TP slices and pipeline stages' units reassembled) and its master
// weights written per tensor.
Status run_consolidate(const ConsolidateArgs& a) {
  const fs::path dir(a.dir);
  std::error_code ec;
  if (!fs::exists(dir / "state.json", ec)) {
    return Status::usage(a.dir + " is not a complete checkpoint (no state.json; a checkpoint "
                         "directory is RUN/checkpoints/step-NNNNNNNN)");
  }
  KILN_ASSIGN_OR_RETURN(auto shape, engine::checkpoint_model(a.dir));
  engine::ParamStore params(shape.first, shape.second);
  engine::TrainerState state;
  engine::CheckpointLayout layout;
  KILN_RETURN_IF_ERROR(engine::load_checkpoint(a.dir, &params, &state, &layout));
  std::vector<engine::TensorView> views;
  for (size_t i = 0; i < params.tensors().size(); ++i) {
    const engine::ParamTensor& t = params.tensors()[i];
    views.push_back({t.name, "F32", t.shape, params.master(static_cast<int>(i)), t.numel * 4});
  }
  std::map<std::string, std::string> meta;
  meta["format"] = "kiln-consolidated/1";
  meta["precision"] = engine::precision_name(shape.second);
  meta["source"] = fs::absolute(dir, ec).string();
  meta["step"] = std::to_string(state.step);
  meta["model"] = engine::model_shape_json(shape.first);
  KILN_RETURN_IF_ERROR(engine::write_safetensors(a.output, views, meta));
  const long long files =
      layout.sharded() ? layout.partitions * layout.tp_partitions * layout.pp : 2;
  std::printf("%s: %zu tensors from %s (step %s, %lld file%s: dp %lld, tp %lld, ZeRO-%lld%s)\n",
              a.output.c_str(), views.size(), a.dir.c_str(), meta["step"].c_str(), files,
              files == 1 ? "" : "s", static_cast<long long>(layout.dp),
              static_cast<long long>(layout.tp), static_cast<long long>(layout.zero_stage),
              layout.pp > 1 ? (", pp " + std::to_string(layout.pp)).c_str() : "");
  return Status::ok();
}

struct ExportArgs {
  std::string source;
  std::string format = "hf";
  std::string dtype;  // "": the format's default (hf fp32, gguf f32)
  engine::HfExportOptions options;
  std::string max_shard = "5G";
};

// One GGUF file for llama.cpp (engine/checkpoint/gguf.h); the vocabulary from the model's
// tokenizer (gguf_vocab).
Status run_export_gguf(const ExportArgs& a) {
  engine::GgufExportOptions o;
  o.output = a.options.output;
  o.dtype = a.dtype.empty() ? "f32" : a.dtype;
  o.overwrite = a.options.overwrite;
  const auto t0 = std::chrono::steady_clock::now();
  std::string pre;
  auto vocab = [&](const engine::ModelWeights& w) -> Result<engine::GgufVocab> {
    auto v = gguf_vocab(w, a.options.tokenizer);
    if (v.is_ok()) pre = v->pre;
    return v;
  };
  engine::GgufExportReport report;
  KILN_RETURN_IF_ERROR(engine::export_gguf(a.source, o, vocab, &report));
  std::printf("%s: GGUF v3, %s, %zu tensors, %.1f MiB (%s), pre-tokenizer %s, in %.2f s\n",
              o.output.c_str(), report.arch.c_str(), report.tensors,
              static_cast<double>(report.bytes) / (1 << 20), o.dtype.c_str(), pre.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return Status::ok();
}

Status run_export(ExportArgs& a) {
  if (a.format == "gguf") return run_export_gguf(a);
  if (a.format != "hf")
    return Status::usage("--format must be hf (Hugging Face) or gguf (llama.cpp), not '" +
                         a.format + "'");
  if (!a.dtype.empty()) a.options.dtype = a.dtype;
  KILN_ASSIGN_OR_RETURN(a.options.max_shard_bytes, parse_size("--max-shard-size", a.max_shard));
  const auto t0 = std::chrono::steady_clock::now();
  engine::HfExportReport report;
  std::string tokenizer_note;
  auto tokenizer = [&](const std::string& dir, const engine::ModelWeights& w) -> Status {
    Status st = write_hf_tokenizer_files(dir, w, a.options.tokenizer);
    if (st.code() == StatusCode::kNotFound) {
      KILN_LOG_WARN("export without tokenizer files: {}", st.to_string());
    }
    return st;
  };
  KILN_RETURN_IF_ERROR(engine::export_hf(a.source, a.options, &report, tokenizer));
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("%s: %zu tensors, %.1f MiB in %zu file%s (%s)%s in %.2f s, peak RSS %.1f MiB\n",
              a.options.output.c_str(), report.tensors,
              static_cast<double>(report.bytes) / (1 << 20), report.files,
              report.files == 1 ? "" : "s", a.options.dtype.c_str(),
              report.tokenizer ? ", tokenizer" : ", no tokenizer",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              static_cast<double>(ru.ru_maxrss) / 1024.0);
  return Status::ok();
}

}  // namespace

RunFn add_checkpoint_command(CLI::App& root) {
  CLI::App* cmd = root.add_subcommand("checkpoint", "work with training checkpoints");
  cmd->require_subcommand(1);
  auto args = std::make_shared<ConsolidateArgs>();
  CLI::App* con = cmd->add_subcommand(
      "consolidate",
      "write one safetensors file with every parameter of a checkpoint (fp32), loadable by one "
      "process, after verifying its checksum");
  con->add_option("STEP_DIR", args->dir, "RUN/checkpoints/step-NNNNNNNN")->required();
  con->add_option("-o,--output", args->output, "the safetensors file to write")->required();
  auto ex = std::make_shared<ExportArgs>();
  CLI::App* exp = cmd->add_subcommand(
      "export",
      "write a Hugging Face model directory (config.json, model.safetensors, "
      "generation_config.json, tokenizer files) that transformers loads as it is, or a GGUF "
      "file that llama.cpp loads as it is, from a checkpoint of any layout, a run directory or "
      "a consolidated file, tensor by tensor");
  exp->add_option("STEP_DIR", ex->source,
                  "RUN/checkpoints/step-NNNNNNNN, RUN (its latest checkpoint) or a consolidated "
                  "safetensors file")
      ->required();
  exp->add_option("--format", ex->format, "output format: hf (Hugging Face) or gguf (llama.cpp)")
      ->default_val("hf");
  exp->add_option("-o,--output", ex->options.output,
                  "the directory to write (hf), or the .gguf file (gguf)")
      ->required();
  exp->add_option("--dtype", ex->dtype,
                  "tensor type written: fp32 (default) or bf16 for hf; f32 (default), f16, bf16 "
                  "or q8_0 for gguf");
  exp->add_option("--max-shard-size", ex->max_shard,
                  "largest model.safetensors; past it, model-NNNNN-of-NNNNN.safetensors files "
                  "and model.safetensors.index.json (bytes, or with K/M/G)")
      ->default_val("5G");
  exp->add_option("--tokenizer", ex->options.tokenizer,
                  "tokenizer file to export (default: the one of the run's data.manifest)");
  exp->add_flag("--overwrite", ex->options.overwrite, "replace an existing output");
  return [args, con, exp, ex]() -> Status {
    if (exp->parsed()) return run_export(*ex);
    return run_consolidate(*args);
  };
}

}  // namespace kiln::cli
