// kiln tokenizer train | encode | decode — see dataprep/tokenizer/tokenizer.h and docs/TOKENIZER.md.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/json.h"
#include "common/log.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "dataprep/tokenizer/tokenizer_io.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

struct TokenizerFlags {
  // train
  size_t vocab_size = 0;
  std::vector<std::string> inputs;
  std::string output;
  std::vector<std::string> specials;
  uint64_t min_frequency = 2;
  std::string pretokenizer = "llama3";
  std::string pattern;
  uint32_t cjk_chunk = 0;
  std::string max_bytes = "0";
  std::string max_text_bytes = "1G";
  std::string export_dir;
  // encode / decode
  std::string tokenizer, vocab, merges;
  bool jsonl = false;
  std::string special_tokens = "text";
};

Result<prep::Tokenizer> load_for_use(const TokenizerFlags& f) {
  if (!f.tokenizer.empty()) {
    if (!f.vocab.empty() || !f.merges.empty())
      return Status::usage("give either --tokenizer or --vocab with --merges, not both");
    return prep::Tokenizer::load(f.tokenizer);
  }
  if (f.vocab.empty() || f.merges.empty())
    return Status::usage("give --tokenizer FILE, or --vocab vocab.json with --merges merges.txt");
  return prep::Tokenizer::load_gpt2(f.vocab, f.merges);
}

std::string read_stdin() {
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), stdin)) > 0) data.append(buf, n);
  return data;
}

Status run_train(const TokenizerFlags& f) {
  prep::TokenizerTrainOptions opts;
  opts.vocab_size = f.vocab_size;
  opts.min_frequency = f.min_frequency;
  if (!f.specials.empty()) opts.special_tokens = f.specials;
  if (!f.pattern.empty()) {
    auto spec = prep::pretokenizer_for_pattern(f.pattern);
    if (!spec.is_ok()) return Status::usage("--pattern: " + spec.status().message());
    opts.pretokenizer = std::move(spec).value();
  } else {
    auto spec = prep::pretokenizer_by_name(f.pretokenizer, f.cjk_chunk);
    if (!spec.is_ok()) return Status::usage("--pretokenizer: " + spec.status().message());
    opts.pretokenizer = std::move(spec).value();
  }
  KILN_ASSIGN_OR_RETURN(uint64_t max_bytes, parse_size("--max-bytes", f.max_bytes));
  KILN_ASSIGN_OR_RETURN(uint64_t max_text_bytes, parse_size("--max-text-bytes", f.max_text_bytes));
  if (max_text_bytes == 0) return Status::usage("--max-text-bytes must be positive");
  auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(prep::TrainingTexts input, prep::read_training_texts(f.inputs, max_bytes, max_text_bytes));
  if (input.texts.empty()) return Status::data("no text found in the inputs");
  if (input.skipped_lines)
    KILN_LOG_WARN("skipped {} JSONL lines without a string \"text\"", input.skipped_lines);
  if (input.truncated) KILN_LOG_INFO("stopped reading at --max-bytes {}", max_bytes);
  std::vector<std::string_view> views(input.texts.begin(), input.texts.end());
  auto t1 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(prep::Tokenizer tok, prep::Tokenizer::train(views, opts));
  auto t2 = std::chrono::steady_clock::now();
  KILN_RETURN_IF_ERROR(tok.save(f.output));
  if (!f.export_dir.empty())
    KILN_RETURN_IF_ERROR(tok.save_gpt2(f.export_dir + "/vocab.json", f.export_dir + "/merges.txt"));
  double read_s = std::chrono::duration<double>(t1 - t0).count();
  double train_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("trained %zu tokens (%zu merges) on %zu texts, %.1f MiB from %llu files "
              "(read %.1f s, train %.1f s) -> %s\n",
              tok.vocab_size(), tok.num_merges(), input.texts.size(),
              double(input.bytes) / (1 << 20), (unsigned long long)input.files, read_s, train_s,
              f.output.c_str());
  if (tok.vocab_size() < f.vocab_size)
    std::printf("note: the text has too few repeated pairs for %zu tokens\n", f.vocab_size);
  return Status::ok();
}

void append_ids(const std::vector<uint32_t>& ids, std::string* out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out->push_back(' ');
    *out += std::to_string(ids[i]);
  }
  out->push_back('\n');
}

Status run_encode(const TokenizerFlags& f) {
  auto mode = prep::parse_special_tokens(f.special_tokens);
  if (!mode.is_ok()) return Status::usage("--special-tokens: " + mode.status().message());
  KILN_ASSIGN_OR_RETURN(prep::Tokenizer tok, load_for_use(f));
  tok.set_special_tokens(*mode);
  std::string text = read_stdin();
  std::string out;
  std::vector<uint32_t> ids;
  if (!f.jsonl) {
    KILN_RETURN_IF_ERROR(tok.encode(text, &ids));
    out.reserve(ids.size() * 6 + 1);
    append_ids(ids, &out);
  } else {
    // One JSON object with a string "text" per line -> one line of ids per line.
    size_t pos = 0, line_no = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      ++line_no;
      auto j = parse_untrusted_json(line);
      if (!j.is_ok() || !j->is_object() || !j->contains("text") || !(*j)["text"].is_string())
        return Status::data("standard input line " + std::to_string(line_no) +
                            ": not a JSON object with a string \"text\"");
      ids.clear();
      Status st = tok.encode((*j)["text"].get_ref<const std::string&>(), &ids);
      if (!st.is_ok()) return std::move(st).with_line(long(line_no));
      append_ids(ids, &out);
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return Status::ok();
}

Status run_decode(const TokenizerFlags& f) {
  KILN_ASSIGN_OR_RETURN(prep::Tokenizer tok, load_for_use(f));
  KILN_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, prep::parse_token_ids(read_stdin()));
  KILN_ASSIGN_OR_RETURN(std::string text, tok.decode(ids));
  std::fwrite(text.data(), 1, text.size(), stdout);
  return Status::ok();
}

void add_use_flags(CLI::App* app, TokenizerFlags* f) {
  app->add_option("--tokenizer", f->tokenizer,
                  "tokenizer file, kind detected: a Hugging Face tokenizer.json (byte-level BPE), "
                  "a SentencePiece .model, Kiln's older JSON, or a vocab.json with merges.txt "
                  "beside it")
      ->check(CLI::ExistingFile);
  app->add_option("--vocab", f->vocab, "GPT-2 style vocab.json (with --merges)")
      ->check(CLI::ExistingFile);
  app->add_option("--merges", f->merges, "GPT-2 style merges.txt (with --vocab)")
      ->check(CLI::ExistingFile);
}

}  // namespace

RunFn add_tokenizer_command(CLI::App& root) {
  auto flags = std::make_shared<TokenizerFlags>();
  CLI::App* cmd = root.add_subcommand("tokenizer", "train a BPE tokenizer, encode and decode text");
  cmd->require_subcommand(1);

  CLI::App* train = cmd->add_subcommand("train", "train a byte-level BPE tokenizer on text files");
  train->add_option("--vocab-size", flags->vocab_size,
                    "vocabulary size, including special and byte tokens")
      ->required()
      ->check(CLI::Range(size_t(257), size_t(1) << 31));
  train->add_option("--input", flags->inputs,
                    "text / JSONL files or folders (JSONL: the \"text\" field; .gz/.zst/.xz/.bz2 ok)")
      ->required()
      ->take_all();
  train
      ->add_option("--output", flags->output,
                   "tokenizer file to write (Hugging Face tokenizer.json format)")
      ->required();
  train->add_option("--special", flags->specials,
                    "special tokens, ids 0.. in order; the first is end-of-text "
                    "(default: <|endoftext|>)")
      ->take_all();
  train->add_option("--min-frequency", flags->min_frequency,
                    "stop when the most frequent pair occurs fewer times")
      ->capture_default_str();
  train
      ->add_option("--pretokenizer", flags->pretokenizer,
                   "llama3 (Llama 3's pattern: llama.cpp's llama-bpe), gpt2 or kiln-v1 (Kiln's "
                   "own, which llama.cpp cannot reproduce)")
      ->capture_default_str();
  train->add_option("--pattern", flags->pattern,
                    "pre-tokenize with this regular expression instead (as a tokenizer.json's "
                    "Split pattern, e.g. Llama 3's; see docs/TOKENIZER.md)");
  train->add_option("--cjk-chunk", flags->cjk_chunk,
                    "kiln-v1: max CJK characters per pre-token (0 = whole runs)")
      ->capture_default_str();
  train->add_option("--max-bytes", flags->max_bytes, "read at most this much text (0 = all; K/M/G)")
      ->capture_default_str();
  train->add_option("--max-text-bytes", flags->max_text_bytes,
                    "refuse a text file or JSONL line longer than this after decompression (K/M/G)")
      ->capture_default_str();
  train->add_option("--export-gpt2", flags->export_dir,
                    "also write vocab.json and merges.txt into this folder");

  CLI::App* encode = cmd->add_subcommand(
      "encode", "read text on standard input, print its token ids space-separated on one line");
  add_use_flags(encode, flags.get());
  encode->add_flag("--jsonl", flags->jsonl,
                   "standard input is JSONL (a string \"text\" per line): print one line of ids "
                   "per input line");
  encode
      ->add_option("--special-tokens", flags->special_tokens,
                   "special-token text in the input: 'text' encodes it as ordinary text (a "
                   "document cannot inject a special id), 'parse' makes it the special token "
                   "(as Hugging Face's encode; chat data)")
      ->capture_default_str();
  CLI::App* decode = cmd->add_subcommand(
      "decode", "read token ids (whitespace-separated) on standard input, print the text");
  add_use_flags(decode, flags.get());

  return [flags, train, encode, decode] {
    if (train->parsed()) return run_train(*flags);
    if (encode->parsed()) return run_encode(*flags);
    if (decode->parsed()) return run_decode(*flags);
    return Status::usage("choose train, encode or decode");
  };
}

}  // namespace kiln::cli
