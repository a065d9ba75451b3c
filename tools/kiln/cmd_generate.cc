// kiln generate CKPT_OR_DIR (--prompt TEXT | --prompts-file FILE | stdin) [sampling flags]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "common/atomic_file.h"
#include "common/bounded_read.h"
#include "common/log.h"
#include "engine/checkpoint/hf.h"
#include "engine/infer/gpt_infer.h"
#include "kernels/ops.h"
#include "tools/kiln/command.h"
#include "tools/kiln/model_io.h"

namespace kiln::cli {
namespace {

// The longest prompt read (a line of --prompts-file, or standard input): 64 MiB of text is
// millions of tokens, past any model's context.
constexpr size_t kMaxPromptBytes = size_t{64} << 20;

struct GenerateArgs {
  std::string model;
  std::vector<std::string> prompts;
  std::string prompts_file;
  std::string prompt_ids;
  std::string tokenizer;
  engine::GenerateOptions gen;
  bool ids = false;
  bool no_stop = false;
  bool no_cache = false;
  bool echo = true;
  bool stats = false;
  std::string logits;
  int threads = 0;
  std::string device;  // "": the run's config.yaml device, else cpu
};

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> out;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long long v = std::strtoll(word.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) {
      return Status::usage("--prompt-ids: '" + word + "' is not a token id");
    }
    out.push_back(static_cast<int32_t>(v));
  }
  if (out.empty()) return Status::usage("--prompt-ids: no ids");
  return out;
}

// A float32 .npy of shape (rows, cols).
Status write_npy_f32(const std::string& path, const std::vector<float>& v, size_t rows,
                     size_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + ", " + std::to_string(cols) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return write_file_atomic(path, out);
}

Status run_generate(GenerateArgs& a) {
  if (a.threads > 0) cpu::set_num_threads(a.threads);
  a.gen.use_cache = !a.no_cache;
  KILN_RETURN_IF_ERROR(engine::check_sampling(a.gen.sampling));
  if (a.gen.max_tokens < 0) return Status::usage("--max-tokens must be >= 0");
  KILN_ASSIGN_OR_RETURN(engine::ModelWeights w, engine::open_model_weights(a.model));
  // Token ids given directly need no tokenizer (but one is used for printing when found).
  std::unique_ptr<prep::Tokenizer> tok;
  {
    auto t = model_tokenizer(w, a.tokenizer);
    if (t.is_ok()) {
      tok = std::make_unique<prep::Tokenizer>(std::move(t).value());
    } else if (a.prompt_ids.empty() || !a.tokenizer.empty() ||
               t.status().code() != StatusCode::kNotFound) {
      return std::move(t).take_status();
    }
  }
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts;
  if (!a.prompt_ids.empty()) {
    KILN_ASSIGN_OR_RETURN(auto ids, parse_ids(a.prompt_ids));
    prompts.push_back(ids);
    texts.emplace_back();
  } else {
    if (!a.prompts_file.empty()) {
      std::ifstream in(a.prompts_file, std::ios::binary);
      if (!in) return Status::from_errno("open", a.prompts_file);
      std::string line;
      bool too_long = false;
      int64_t no = 0;
      while (read_line_capped(in, kMaxPromptBytes, &line, &too_long)) {
        ++no;
        if (too_long) {
          return Status::data("a prompt longer than " + std::to_string(kMaxPromptBytes) +
                              " bytes (a file without newlines?)")
              .with_file(a.prompts_file)
              .with_line(no);
        }
        if (!line.empty()) texts.push_back(line);
      }
      if (texts.empty())
        return Status::usage("--prompts-file " + a.prompts_file + " has no prompts");
    }
    for (const auto& p : a.prompts) texts.push_back(p);
    if (texts.empty()) {  // standard input, whole, as one prompt
      std::string text;
      char buf[1 << 16];
      while (std::cin.read(buf, sizeof buf) || std::cin.gcount() > 0) {
        text.append(buf, static_cast<size_t>(std::cin.gcount()));
        if (text.size() > kMaxPromptBytes) {
          return Status::data("the prompt on standard input is longer than " +
                              std::to_string(kMaxPromptBytes) + " bytes");
        }
      }
      texts.push_back(std::move(text));
    }
    for (const std::string& text : texts) {
      std::vector<int32_t> ids;
      for (uint32_t id : tok->encode(text)) ids.push_back(static_cast<int32_t>(id));
      if (ids.empty()) {  // an empty prompt starts after end-of-text, as GPT-2 was trained
        if (tok->eos_id() < 0) return Status::usage("an empty prompt needs an end-of-text token");
        ids.push_back(static_cast<int32_t>(tok->eos_id()));
      }
      prompts.push_back(std::move(ids));
    }
  }
  if (a.no_stop) {
    a.gen.eos_id = -1;
  } else {
    a.gen.eos_id = tok && tok->eos_id() >= 0 ? tok->eos_id() : w.eos_id;
  }
  // The positions the longest prompt and its new tokens reach (the KV cache is sized by them).
  int64_t positions = 1;
  for (const auto& p : prompts) {
    positions = std::max(positions, static_cast<int64_t>(p.size()) + a.gen.max_tokens);
  }
  positions = std::min(positions, w.model.seq_len);
  KILN_ASSIGN_OR_RETURN(auto model, load_inference(w, a.device, positions, "--max-tokens"));
  if (!a.logits.empty()) {  // the full forward's logits of the (first) prompt
    const auto& p = prompts[0];
    if (static_cast<int64_t>(p.size()) > w.model.seq_len) {
      return Status::usage("--logits: the prompt is longer than the model's context");
    }
    // The logits on the device and their host copy (a prompt of millions of tokens over a
    // large vocabulary is terabytes).
    const uint64_t bytes = 2 * p.size() * static_cast<uint64_t>(w.model.vocab_size) * 4;
    KILN_RETURN_IF_ERROR(engine::check_inference_memory(w.model, static_cast<int64_t>(p.size()),
                                                        model->device(), "--logits", bytes));
    std::vector<float> logits(p.size() * static_cast<size_t>(w.model.vocab_size));
    model->forward_full(p.data(), static_cast<int>(p.size()), logits.data());
    KILN_RETURN_IF_ERROR(
        write_npy_f32(a.logits, logits, p.size(), static_cast<size_t>(w.model.vocab_size)));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (a.echo && !a.ids && !texts[i].empty()) {
      std::fwrite(texts[i].data(), 1, texts[i].size(), stdout);
      std::fflush(stdout);
    }
    bool first = true;
    auto on_token = [&](int32_t id) {
      if (a.ids) {
        std::printf(first ? "%d" : " %d", id);
      } else if (tok && static_cast<size_t>(id) < tok->vocab_size() &&
                 !tok->is_special(static_cast<uint32_t>(id))) {
        const std::string& b = tok->token_bytes(static_cast<uint32_t>(id));
        std::fwrite(b.data(), 1, b.size(), stdout);
      } else if (!tok || static_cast<size_t>(id) >= tok->vocab_size()) {
        std::printf("<%d>", id);
      }
      first = false;
      std::fflush(stdout);
    };
    engine::GenerateStats st;
    KILN_RETURN_IF_ERROR(engine::generate(*model, prompts[i], a.gen, on_token, &st));
    std::printf("\n");
    std::fflush(stdout);
    const double rate = st.decode_s > 0 && st.new_tokens > 1
                            ? static_cast<double>(st.new_tokens - 1) / st.decode_s
                            : 0.0;
    const std::string line = "prompt " + std::to_string(st.prompt_tokens) + " tokens in " +
                             std::to_string(st.prefill_s) + " s; " + std::to_string(st.new_tokens) +
                             " new tokens, " + std::to_string(rate) +
                             " tokens/s after the first; stopped: " + st.stop;
    if (a.stats) {
      std::fprintf(stderr, "%s\n", line.c_str());
    } else {
      KILN_LOG_DEBUG("{}", line);
    }
  }
  return Status::ok();
}

}  // namespace

RunFn add_generate_command(CLI::App& root) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* app = root.add_subcommand(
      "generate",
      "generate text from a model (a checkpoint of any layout, a run directory, a consolidated "
      "file or a Hugging Face directory) with a KV cache on the CPU or a GPU, streamed to stdout");
  app->add_option("MODEL", a->model,
                  "RUN, RUN/checkpoints/step-NNNNNNNN, a consolidated .safetensors or an HF "
                  "directory")
      ->required();
  app->add_option("--prompt", a->prompts, "prompt text (repeatable); none: standard input");
  app->add_option("--prompts-file", a->prompts_file, "one prompt per line");
  app->add_option("--prompt-ids", a->prompt_ids, "the prompt as token ids, space-separated");
  app->add_option("--tokenizer", a->tokenizer,
                  "tokenizer file (default: the run's, or the HF directory's)");
  app->add_option("--max-tokens", a->gen.max_tokens, "tokens to generate at most")->default_val(64);
  app->add_option("--temperature", a->gen.sampling.temperature, "0: greedy")->default_val(1.0);
  app->add_option("--top-k", a->gen.sampling.top_k, "keep the k most likely tokens (0: all)")
      ->default_val(0);
  app->add_option("--top-p", a->gen.sampling.top_p, "nucleus sampling mass (1: all)")
      ->default_val(1.0);
  app->add_option("--repetition-penalty", a->gen.sampling.repetition_penalty,
                  "CTRL-style penalty on tokens seen so far (1: none)")
      ->default_val(1.0);
  app->add_option("--seed", a->gen.sampling.seed, "random seed of the sampler")->default_val(0);
  app->add_flag("--no-stop", a->no_stop, "do not stop at end-of-text");
  app->add_flag("--ids", a->ids, "print the new token ids instead of text");
  app->add_flag("!--no-echo", a->echo, "do not print the prompt before its continuation");
  app->add_flag("--no-cache", a->no_cache,
                "a full forward per token instead of the KV cache (slow; for checking)");
  app->add_flag("--stats", a->stats, "print prompt and generation speed on stderr");
  app->add_option("--logits", a->logits,
                  "also write the full forward's logits of the first prompt (.npy, float32, "
                  "tokens x vocab)");
  app->add_option("--threads", a->threads, "host threads for the kernels (0: all cores)")
      ->default_val(0);
  app->add_option("--device", a->device,
                  "cpu | cuda (default: the device in the run's config.yaml, else cpu)");
  return [a] { return run_generate(*a); };
}

}  // namespace kiln::cli
