#include "engine/infer/eval_tasks.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/bounded_read.h"
#include "common/json.h"

namespace kiln::engine {

double TextLoss::bits_per_byte() const {
  return bytes ? nats / std::log(2.0) / static_cast<double>(bytes) : 0;
}

double sequence_nll(GptInference& model, int32_t bos, const std::vector<int32_t>& ids,
                    int64_t* counted) {
  std::vector<int32_t> seq;
  if (bos >= 0) seq.push_back(bos);
  seq.insert(seq.end(), ids.begin(), ids.end());
  const size_t T = static_cast<size_t>(model.model().seq_len);
  double total = 0;
  int64_t n = 0;
  std::vector<float> nll(T);
  // Windows of T + 1 tokens (T predictions) overlapping by one token: every token after the first
  // is predicted exactly once.
  for (size_t start = 0; start + 1 < seq.size(); start += T) {
    const size_t len = std::min(T + 1, seq.size() - start);
    model.token_nll(seq.data() + start, static_cast<int>(len), nll.data());
    for (size_t i = 0; i + 1 < len; ++i) total += nll[i];
    n += static_cast<int64_t>(len - 1);
  }
  if (counted) *counted = n;
  return total;
}

double continuation_nll(GptInference& model, const std::vector<int32_t>& ctx,
                        const std::vector<int32_t>& cont) {
  std::vector<int32_t> seq = ctx;
  seq.insert(seq.end(), cont.begin(), cont.end());
  const size_t keep = static_cast<size_t>(model.model().seq_len) + 1;
  if (seq.size() > keep) seq.erase(seq.begin(), seq.end() - static_cast<std::ptrdiff_t>(keep));
  std::vector<float> nll(seq.size());
  model.token_nll(seq.data(), static_cast<int>(seq.size()), nll.data());
  // The continuation's tokens are the last cont.size() targets (all of them: cont is shorter than
  // the window unless the model's context is tiny, then its last tokens).
  const size_t targets = seq.size() - 1;
  const size_t from = targets - std::min(targets, cont.size());
  double total = 0;
  for (size_t i = from; i < targets; ++i) total += nll[i];
  return total;
}

Result<std::vector<McExample>> read_mc_tasks(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::from_errno("open", path);
  std::vector<McExample> out;
  std::string line;
  long no = 0;
  bool too_long = false;
  // (a line is one example: 64 MiB is far past any; a file without newlines is refused unread)
  constexpr size_t kMaxLine = size_t{64} << 20;
  while (read_line_capped(in, kMaxLine, &line, &too_long)) {
    ++no;
    if (too_long) {
      return Status::data("a line longer than " + std::to_string(kMaxLine) +
                          " bytes (a file without newlines?)")
          .with_file(path)
          .with_line(no);
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const std::string& field, const std::string& why) {
      return Status::data(why).with_file(path).with_line(no).with_key(field);
    };
    auto parsed = parse_untrusted_json(line);
    if (!parsed.is_ok()) return std::move(parsed).take_status().with_file(path).with_line(no);
    const nlohmann::json& j = *parsed;
    if (!j.is_object()) return bad("", "a task line must be a JSON object");
    McExample ex;
    if (!j.contains("context") || !j["context"].is_string()) {
      return bad("context", "missing or not a string");
    }
    ex.context = j["context"].get<std::string>();
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].size() < 2) {
      return bad("choices", "must be an array of at least two strings");
    }
    for (const auto& c : j["choices"]) {
      if (!c.is_string() || c.get<std::string>().empty()) {
        return bad("choices", "every choice must be a non-empty string");
      }
      ex.choices.push_back(c.get<std::string>());
    }
    if (!j.contains("label") || !j["label"].is_number_integer() || j["label"].get<int64_t>() < 0 ||
        j["label"].get<int64_t>() >= static_cast<int64_t>(ex.choices.size())) {
      return bad("label", "must be an integer index into choices (0.." +
                              std::to_string(ex.choices.size() - 1) + ")");
    }
    ex.label = j["label"].get<int64_t>();
    out.push_back(std::move(ex));
  }
  if (out.empty()) return Status::data("no examples").with_file(path);
  return out;
}

std::vector<McTokens> tokenize_mc(const std::vector<McExample>& examples, const EncodeFn& encode,
                                  int32_t eos) {
  std::vector<McTokens> out;
  for (const McExample& ex : examples) {
    // lm-eval-harness: trailing whitespace of the context goes to the continuation.
    std::string ctx = ex.context;
    std::string lead;
    while (!ctx.empty() &&
           std::string_view(" \t\n\r\f\v").find(ctx.back()) != std::string_view::npos) {
      lead.insert(lead.begin(), ctx.back());
      ctx.pop_back();
    }
    McTokens t;
    t.context = ctx.empty() ? std::vector<int32_t>() : encode(ctx);
    if (t.context.empty() && eos >= 0) t.context.push_back(eos);
    for (const std::string& c : ex.choices) {
      t.choices.push_back(encode(lead + c));
      t.choice_bytes.push_back(c.size());
    }
    t.label = ex.label;
    out.push_back(std::move(t));
  }
  return out;
}

McResult mc_result(const std::vector<McTokens>& examples,
                   const std::vector<std::vector<double>>& nll) {
  McResult r;
  int64_t right = 0, right_norm = 0;
  for (size_t e = 0; e < examples.size(); ++e) {
    size_t best = 0, best_norm = 0;
    double best_ll = -INFINITY, best_ll_norm = -INFINITY;
    for (size_t c = 0; c < examples[e].choices.size(); ++c) {
      const double ll = -nll[e][c];
      const double norm =
          ll / static_cast<double>(std::max<size_t>(1, examples[e].choice_bytes[c]));
      if (ll > best_ll) {
        best_ll = ll;
        best = c;
      }
      if (norm > best_ll_norm) {
        best_ll_norm = norm;
        best_norm = c;
      }
    }
    right += best == static_cast<size_t>(examples[e].label);
    right_norm += best_norm == static_cast<size_t>(examples[e].label);
    ++r.examples;
  }
  if (r.examples) {
    r.acc = static_cast<double>(right) / static_cast<double>(r.examples);
    r.acc_norm = static_cast<double>(right_norm) / static_cast<double>(r.examples);
  }
  return r;
}

void mc_row(const McTokens& ex, size_t choice, int64_t seq_len, int32_t* inputs, int32_t* targets) {
  const std::vector<int32_t>& cont = ex.choices[choice];
  std::vector<int32_t> seq = ex.context;
  seq.insert(seq.end(), cont.begin(), cont.end());
  const size_t T = static_cast<size_t>(seq_len);
  if (seq.size() > T + 1) seq.erase(seq.begin(), seq.end() - static_cast<std::ptrdiff_t>(T + 1));
  const size_t n = seq.size() - 1;  // predictions
  const size_t first = n - std::min(n, cont.size());
  for (size_t i = 0; i < T; ++i) {
    inputs[i] = i < n ? seq[i] : 0;
    targets[i] = i < n && i >= first ? seq[i + 1] : -1;
  }
}

McResult score_mc(GptInference& model, const std::vector<McExample>& examples,
                  const EncodeFn& encode, int32_t eos) {
  const std::vector<McTokens> toks = tokenize_mc(examples, encode, eos);
  std::vector<std::vector<double>> nll(toks.size());
  for (size_t e = 0; e < toks.size(); ++e) {
    for (const auto& cont : toks[e].choices) {
      nll[e].push_back(continuation_nll(model, toks[e].context, cont));
    }
  }
  return mc_result(toks, nll);
}

}  // namespace kiln::engine
