// Fuzz target: tokenizer files read by Tokenizer::from_json (dataprep/tokenizer/tokenizer.h):
// Hugging Face tokenizer.json and Kiln's older "kiln-tokenizer/1".
// Invariants on an accepted tokenizer: decode(encode(x)) == x for a fixed text and for the input
// itself (where round_trips(): no normalizer, no added prefix space), every id is below
// vocab_size, and to_json() loads back to the same bytes.
#include "dataprep/tokenizer/tokenizer.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string_view in = fuzz::as_view(data, size);
  auto tok = prep::Tokenizer::from_json(in, "fuzz.json");
  if (!tok.is_ok()) return 0;
  for (std::string_view text : {std::string_view("Hello, world! 123 \xe4\xb8\xad\xe6\x96\x87\n\t x"),
                                in.substr(0, 256)}) {
    std::vector<uint32_t> ids = tok->encode(text);
    for (uint32_t id : ids) FUZZ_REQUIRE(id < tok->vocab_size());
    auto back = tok->decode(ids);
    FUZZ_REQUIRE(back.is_ok() && (*back == text || !tok->round_trips()));
  }
  std::string json = tok->to_json();
  auto again = prep::Tokenizer::from_json(json, "again.json");
  FUZZ_REQUIRE(again.is_ok() && again->to_json() == json);
  return 0;
}
