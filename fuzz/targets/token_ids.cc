// Fuzz target: `kiln tokenizer decode`'s id parser (parse_token_ids in
// dataprep/tokenizer/tokenizer_io.h), then decoding the ids with a small byte-level tokenizer.
// Invariants: accepted ids print and parse back equal; decoding either succeeds or names an id.
#include <string>

#include "dataprep/tokenizer/tokenizer.h"
#include "dataprep/tokenizer/tokenizer_io.h"
#include "fuzz/fuzz_util.h"

namespace {
const kiln::prep::Tokenizer& byte_tokenizer() {
  static const kiln::prep::Tokenizer tok = [] {
    std::vector<std::string> texts = {"the cat sat on the mat, the cat ate the rat"};
    std::vector<std::string_view> views(texts.begin(), texts.end());
    kiln::prep::TokenizerTrainOptions opt;
    opt.vocab_size = 300;
    auto t = kiln::prep::Tokenizer::train(views, opt);
    if (!t.is_ok()) std::abort();
    return std::move(t).value();
  }();
  return tok;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  auto ids = prep::parse_token_ids(fuzz::as_view(data, size));
  if (!ids.is_ok()) return 0;
  std::string printed;
  for (uint32_t id : *ids) printed += std::to_string(id) + " ";
  auto back = prep::parse_token_ids(printed);
  FUZZ_REQUIRE(back.is_ok() && *back == *ids);
  auto text = byte_tokenizer().decode(*ids);
  bool all_in_range = true;
  for (uint32_t id : *ids) all_in_range = all_in_range && id < byte_tokenizer().vocab_size();
  FUZZ_REQUIRE(text.is_ok() == all_in_range);
  return 0;
}
