// `kiln eval`'s measures, on token ids through an encode function (the caller's tokenizer):
//
//   text loss   each text is scored after an end-of-text token (when the tokenizer has one, so
//               its first token is predicted too), in windows of at most seq_len predictions;
//               loss = nats per token, bits per byte = total nats / ln 2 / total UTF-8 bytes.
//   multiple    JSONL lines {"context": str, "choices": [str, ...], "label": int}; each choice
//   choice      is scored by the log-likelihood of its tokens after the context's, as
//               lm-eval-harness does: context and choice encoded separately (a trailing space of
//               the context moved to the front of the choice; an empty context is the
//               end-of-text token), the input cut on the left to the model's context. acc: the
//               argmax of the log-likelihoods is the label; acc_norm: the argmax of
//               log-likelihood / the choice's length in UTF-8 bytes (lm-eval-harness divides by
//               Python's len(), characters: the same for ASCII). Ties go to the first choice.
// Bad task lines are kData errors naming the file, line and field.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/infer/gpt_infer.h"

namespace kiln::engine {

using EncodeFn = std::function<std::vector<int32_t>(std::string_view)>;

// Sum of -log p (nats) over every token of `ids`, after `bos` when bos >= 0 (else the first
// token is context only). *counted: the tokens predicted.
double sequence_nll(GptInference& model, int32_t bos, const std::vector<int32_t>& ids,
                    int64_t* counted);
// Sum of -log p of `cont` after `ctx` (ctx + cont cut on the left to seq_len + 1 tokens).
double continuation_nll(GptInference& model, const std::vector<int32_t>& ctx,
                        const std::vector<int32_t>& cont);

struct TextLoss {
  double nats = 0;
  int64_t tokens = 0;
  int64_t bytes = 0;
  int64_t docs = 0;
  double loss() const { return tokens ? nats / static_cast<double>(tokens) : 0; }
  double bits_per_byte() const;
};

struct McExample {
  std::string context;
  std::vector<std::string> choices;
  int64_t label = 0;
};
// Reads a task file (JSONL, one example a line; blank lines skipped).
Result<std::vector<McExample>> read_mc_tasks(const std::string& path);

struct McResult {
  int64_t examples = 0;
  double acc = 0, acc_norm = 0;
};

// An example as token ids (the encoding rules above applied).
struct McTokens {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> choices;
  std::vector<size_t> choice_bytes;  // UTF-8 bytes of each choice as given
  int64_t label = 0;
};
std::vector<McTokens> tokenize_mc(const std::vector<McExample>& examples, const EncodeFn& encode,
                                  int32_t eos);
// acc and acc_norm from each choice's negative log-likelihood (nll[e][c]).
McResult mc_result(const std::vector<McTokens>& examples,
                   const std::vector<std::vector<double>>& nll);
// One choice as a training-model row of seq_len positions: inputs and targets of (context +
// choice) cut on the left to seq_len + 1 tokens, targets -1 but at the choice's tokens, padded
// (input 0, target -1) on the right. The sum of the row's per-token losses is the choice's nll.
void mc_row(const McTokens& example, size_t choice, int64_t seq_len, int32_t* inputs,
            int32_t* targets);

McResult score_mc(GptInference& model, const std::vector<McExample>& examples,
                  const EncodeFn& encode, int32_t eos);

}  // namespace kiln::engine
