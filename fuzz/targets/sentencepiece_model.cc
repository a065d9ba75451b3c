// Fuzz target: SentencePiece .model files (ModelProto bytes) read by
// Tokenizer::from_sentencepiece (dataprep/tokenizer/tokenizer.h, through libsentencepiece).
// Invariants on an accepted model: every id encode() gives is below vocab_size, and decode() of
// them succeeds.
#include "dataprep/tokenizer/tokenizer.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  fuzz::quiet_logs();
  auto tok =
      prep::Tokenizer::from_sentencepiece(std::string(fuzz::as_view(data, size)), "fuzz.model");
  if (!tok.is_ok()) return 0;
  for (std::string_view text :
       {std::string_view("Hello, world! 123 \xe4\xb8\xad\xe6\x96\x87\n\t x"),
        fuzz::as_view(data, std::min<size_t>(size, 64))}) {
    std::vector<uint32_t> ids = tok->encode(text);
    for (uint32_t id : ids) FUZZ_REQUIRE(id < tok->vocab_size());
    FUZZ_REQUIRE(tok->decode(ids).is_ok());
  }
  return 0;
}
