// kiln eval CKPT_OR_DIR (--data OUT | --jsonl FILE | --tasks FILE...) [--json]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/bounded_read.h"
#include "common/json.h"
#include "engine/checkpoint/hf.h"
#include "engine/infer/eval_tasks.h"
#include "format/manifest.h"
#include "format/npy.h"
#include "format/shard_reader.h"
#include "kernels/ops.h"
#include "tools/kiln/command.h"
#include "tools/kiln/model_io.h"

namespace kiln::cli {
namespace {
namespace fs = std::filesystem;

struct EvalArgs {
  std::string model;
  std::string data;
  std::string jsonl;
  std::vector<std::string> tasks;
  std::string tokenizer;
  int64_t max_docs = 0;
  bool json = false;
  int threads = 0;
  std::string device;  // "": the run's config.yaml device, else cpu
};

using Losses = std::map<std::string, engine::TextLoss>;

// The longest line of --jsonl or a task file read (a file without newlines is refused, not held).
constexpr size_t kMaxEvalLineBytes = size_t{64} << 20;

int64_t docs_in(const Losses& l) {
  int64_t n = 0;
  for (const auto& [d, v] : l) n += v.docs;
  return n;
}

// The memory preflight of the windows eval runs, as they grow: the model was loaded with one
// position's; a document whose window (at most seq_len + 1 tokens) is longer than any before is
// checked before it runs.
int64_t g_checked_positions = 1;
Status check_window(engine::GptInference& model, size_t tokens, const std::string& key) {
  const int64_t window =
      std::min<int64_t>(model.model().seq_len + 1, static_cast<int64_t>(tokens) + 1);
  if (window <= g_checked_positions) return Status::ok();
  KILN_RETURN_IF_ERROR(engine::check_inference_memory(model.model(), window, model.device(), key));
  g_checked_positions = window;
  return Status::ok();
}

Status add_doc(engine::GptInference& model, int32_t bos, const std::vector<int32_t>& ids,
               size_t bytes, engine::TextLoss* out, const std::string& key) {
  KILN_RETURN_IF_ERROR(check_window(model, ids.size(), key));
  int64_t n = 0;
  out->nats += engine::sequence_nll(model, bos, ids, &n);
  out->tokens += n;
  out->bytes += static_cast<int64_t>(bytes);
  ++out->docs;
  return Status::ok();
}

// The validation split of a `kiln prep` dataset: each document's stored tokens and text bytes.
Status eval_dataset(const EvalArgs& a, engine::GptInference& model, int32_t bos, Losses* out) {
  KILN_ASSIGN_OR_RETURN(Manifest m, read_manifest(a.data));
  const Manifest val = select_split(m, true);
  if (val.shards.empty()) {
    return Status::usage(a.data +
                         " has no validation split (kiln prep with split.val_fraction > 0 "
                         "writes one); use --jsonl for other text")
        .with_key("--data");
  }
  std::map<std::string, int64_t> docs;
  ShardSample sample;
  std::vector<uint32_t> ids32;
  for (const ManifestShard& s : val.shards) {
    if (a.max_docs > 0 && docs[s.domain] >= a.max_docs) continue;
    KILN_ASSIGN_OR_RETURN(std::string path, val.checked_shard_path(s));
    KILN_ASSIGN_OR_RETURN(auto reader, ShardReader::open(path, Manifest::reader_options(s, true)));
    while (true) {
      KILN_ASSIGN_OR_RETURN(bool more, reader->next(&sample));
      if (!more) break;
      if (a.max_docs > 0 && docs[s.domain] >= a.max_docs) break;
      const ShardMember* txt = sample.find("txt");
      const ShardMember* tok = sample.find("tokens.npy");
      if (!txt || !tok) {
        return Status::data("sample " + sample.key + " lacks .txt or .tokens.npy").with_file(path);
      }
      KILN_RETURN_IF_ERROR(npy_decode(tok->data, &ids32).with_file(path).with_key(sample.key));
      std::vector<int32_t> ids;
      for (uint32_t id : ids32) {
        if (id >= static_cast<uint32_t>(model.model().vocab_size)) {
          return Status::data("token id " + std::to_string(id) +
                              " is outside the model's "
                              "vocabulary of " +
                              std::to_string(model.model().vocab_size))
              .with_file(path)
              .with_key(sample.key);
        }
        ids.push_back(static_cast<int32_t>(id));
      }
      KILN_RETURN_IF_ERROR(add_doc(model, bos, ids, txt->data.size(), &(*out)[s.domain], "--data"));
      ++docs[s.domain];
    }
  }
  return Status::ok();
}

// JSONL text: {"text": str, "domain": str (optional)} per line.
Status eval_jsonl(const EvalArgs& a, engine::GptInference& model, const prep::Tokenizer& tok,
                  int32_t bos, Losses* out) {
  std::ifstream in(a.jsonl, std::ios::binary);
  if (!in) return Status::from_errno("open", a.jsonl);
  std::string line;
  long no = 0;
  bool too_long = false;
  std::map<std::string, int64_t> docs;
  while (read_line_capped(in, kMaxEvalLineBytes, &line, &too_long)) {
    ++no;
    if (too_long) {
      return Status::data("a line longer than " + std::to_string(kMaxEvalLineBytes) +
                          " bytes (a file without newlines?)")
          .with_file(a.jsonl)
          .with_line(no);
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto parsed = parse_untrusted_json(line);
    if (!parsed.is_ok()) return std::move(parsed).take_status().with_file(a.jsonl).with_line(no);
    const nlohmann::json& j = *parsed;
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
      return Status::data("each line needs a \"text\" string")
          .with_file(a.jsonl)
          .with_line(no)
          .with_key("text");
    }
    std::string domain = "all";
    if (j.contains("domain")) {
      if (!j["domain"].is_string()) {
        return Status::data("must be a string").with_file(a.jsonl).with_line(no).with_key("domain");
      }
      domain = j["domain"].get<std::string>();
    }
    if (a.max_docs > 0 && docs[domain] >= a.max_docs) continue;
    const std::string text = j["text"].get<std::string>();
    std::vector<int32_t> ids;
    for (uint32_t id : tok.encode(text)) ids.push_back(static_cast<int32_t>(id));
    KILN_RETURN_IF_ERROR(add_doc(model, bos, ids, text.size(), &(*out)[domain], "--jsonl"));
    ++docs[domain];
  }
  return Status::ok();
}

Status run_eval(const EvalArgs& a) {
  if (a.threads > 0) cpu::set_num_threads(a.threads);
  const int given = !a.data.empty() + !a.jsonl.empty() + !a.tasks.empty();
  if (given == 0) return Status::usage("give --data OUT, --jsonl FILE or --tasks FILE...");
  KILN_ASSIGN_OR_RETURN(engine::ModelWeights w, engine::open_model_weights(a.model));
  std::unique_ptr<prep::Tokenizer> tok;
  if (!a.jsonl.empty() || !a.tasks.empty() || !a.tokenizer.empty() || !w.tokenizer.empty()) {
    KILN_ASSIGN_OR_RETURN(auto t, model_tokenizer(w, a.tokenizer));
    tok = std::make_unique<prep::Tokenizer>(std::move(t));
  }
  int64_t eos = tok && tok->eos_id() >= 0 ? tok->eos_id() : w.eos_id;
  if (!a.data.empty() && eos < 0) {
    auto m = read_manifest(a.data);
    if (m.is_ok()) eos = m->tokenizer.eos_id;
  }
  const int32_t bos = eos >= 0 && eos < w.model.vocab_size ? static_cast<int32_t>(eos) : -1;
  // Read the task files before the model (a bad line is reported at once).
  std::vector<std::pair<std::string, std::vector<engine::McExample>>> tasks;
  for (const std::string& f : a.tasks) {
    KILN_ASSIGN_OR_RETURN(auto ex, engine::read_mc_tasks(f));
    tasks.emplace_back(fs::path(f).stem().string(), std::move(ex));
  }
  // The task examples' windows: at most one token per UTF-8 byte of the context and the longest
  // choice, plus the end-of-text token and a leading space's.
  int64_t positions = 1;
  for (const auto& [name, ex] : tasks) {
    for (const engine::McExample& e : ex) {
      size_t longest = 0;
      for (const std::string& c : e.choices) longest = std::max(longest, c.size());
      positions = std::max(positions, static_cast<int64_t>(e.context.size() + longest) + 3);
    }
  }
  positions = std::min(positions, w.model.seq_len + 1);
  g_checked_positions = positions;
  KILN_ASSIGN_OR_RETURN(
      auto model, load_inference(w, a.device, positions, tasks.empty() ? "MODEL" : "--tasks"));
  Losses losses;
  // No documents to score is an error (bad data, exit 3), not a report without figures.
  auto none = [](const std::string& flag, const std::string& file, const std::string& what) {
    return Status::data("no documents to evaluate: " + what).with_file(file).with_key(flag);
  };
  if (!a.data.empty()) {
    KILN_RETURN_IF_ERROR(eval_dataset(a, *model, bos, &losses));
    if (docs_in(losses) == 0) {
      return none("--data", a.data, "its validation split holds no documents");
    }
  }
  if (!a.jsonl.empty()) {
    const int64_t before = docs_in(losses);
    KILN_RETURN_IF_ERROR(eval_jsonl(a, *model, *tok, bos, &losses));
    if (docs_in(losses) == before) {
      return none("--jsonl", a.jsonl, "the file has no non-blank lines");
    }
  }
  if (!losses.empty()) {
    int64_t tokens = 0;
    for (const auto& [d, l] : losses) tokens += l.tokens;
    if (tokens == 0) {
      return Status::data(
                 "no tokens to score: every document is empty (or one token with no end-of-text "
                 "token before it)")
          .with_key(a.jsonl.empty() ? "--data" : "--jsonl");
    }
  }
  nlohmann::ordered_json out;
  out["model"] = w.path;
  if (w.step >= 0) out["step"] = w.step;
  if (!losses.empty()) {
    engine::TextLoss total;
    nlohmann::ordered_json per = nlohmann::ordered_json::object();
    for (const auto& [d, l] : losses) {
      per[d] = {{"loss", l.loss()},
                {"bits_per_byte", l.bits_per_byte()},
                {"tokens", l.tokens},
                {"bytes", l.bytes},
                {"docs", l.docs}};
      total.nats += l.nats;
      total.tokens += l.tokens;
      total.bytes += l.bytes;
      total.docs += l.docs;
    }
    out["domains"] = per;
    out["total"] = {{"loss", total.loss()},
                    {"bits_per_byte", total.bits_per_byte()},
                    {"tokens", total.tokens},
                    {"bytes", total.bytes},
                    {"docs", total.docs}};
  }
  if (!tasks.empty()) {
    nlohmann::ordered_json per = nlohmann::ordered_json::object();
    auto encode = [&](std::string_view text) {
      std::vector<int32_t> ids;
      for (uint32_t id : tok->encode(text)) ids.push_back(static_cast<int32_t>(id));
      return ids;
    };
    for (const auto& [name, ex] : tasks) {
      const engine::McResult r = engine::score_mc(*model, ex, encode, bos);
      per[name] = {{"examples", r.examples}, {"acc", r.acc}, {"acc_norm", r.acc_norm}};
    }
    out["tasks"] = per;
  }
  if (a.json) {
    std::printf("%s\n", out.dump().c_str());
    return Status::ok();
  }
  std::printf("model %s%s\n", w.path.c_str(),
              w.step >= 0 ? (" (step " + std::to_string(w.step) + ")").c_str() : "");
  if (out.contains("domains")) {
    std::printf("%-20s %10s %14s %12s %12s %8s\n", "domain", "loss", "bits/byte", "tokens", "bytes",
                "docs");
    auto row = [](const std::string& name, const nlohmann::ordered_json& r) {
      std::printf("%-20s %10.4f %14.4f %12lld %12lld %8lld\n", name.c_str(),
                  r["loss"].get<double>(), r["bits_per_byte"].get<double>(),
                  r["tokens"].get<long long>(), r["bytes"].get<long long>(),
                  r["docs"].get<long long>());
    };
    for (auto it = out["domains"].begin(); it != out["domains"].end(); ++it) row(it.key(), *it);
    row("total", out["total"]);
  }
  if (out.contains("tasks")) {
    std::printf("%-20s %10s %10s %10s\n", "task", "examples", "acc", "acc_norm");
    for (auto it = out["tasks"].begin(); it != out["tasks"].end(); ++it) {
      std::printf("%-20s %10lld %10.4f %10.4f\n", it.key().c_str(),
                  (*it)["examples"].get<long long>(), (*it)["acc"].get<double>(),
                  (*it)["acc_norm"].get<double>());
    }
  }
  return Status::ok();
}

}  // namespace

RunFn add_eval_command(CLI::App& root) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* app = root.add_subcommand(
      "eval",
      "evaluate a model: loss and bits per byte per domain on a dataset's validation split or a "
      "JSONL file, and multiple-choice accuracy (acc, acc_norm) on task files");
  app->add_option("MODEL", a->model,
                  "RUN, RUN/checkpoints/step-NNNNNNNN, a consolidated .safetensors or an HF "
                  "directory")
      ->required();
  app->add_option("--data", a->data, "a `kiln prep` output: its validation split, per domain");
  app->add_option("--jsonl", a->jsonl, "JSONL text: {\"text\": ..., \"domain\": ... (optional)}");
  app->add_option("--tasks", a->tasks,
                  "multiple-choice task files, JSONL {\"context\", \"choices\", \"label\"}")
      ->take_all();
  app->add_option("--tokenizer", a->tokenizer,
                  "tokenizer file (default: the run's, or the HF directory's)");
  app->add_option("--max-docs", a->max_docs, "documents per domain at most (0: all)")
      ->default_val(0);
  app->add_flag("--json", a->json, "print one JSON object");
  app->add_option("--threads", a->threads, "host threads for the kernels (0: all cores)")
      ->default_val(0);
  app->add_option("--device", a->device,
                  "cpu | cuda (default: the device in the run's config.yaml, else cpu)");
  return [a] { return run_eval(*a); };
}

}  // namespace kiln::cli
