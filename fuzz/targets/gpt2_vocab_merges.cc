// Fuzz target: a GPT-2 vocab.json + merges.txt pair (Tokenizer::load_gpt2). The input is the two
// files separated by the line "#kiln-fuzz-merges" (see the seeds). Invariants as for
// tokenizer_json: ids below vocab_size and decode(encode(x)) == x.
#include "dataprep/tokenizer/tokenizer.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  auto [vocab, merges] = fuzz::split_two(fuzz::as_view(data, size), "\n#kiln-fuzz-merges\n");
  std::string vocab_path = fuzz::write_scratch("vocab.json", vocab);
  std::string merges_path = fuzz::write_scratch("merges.txt", merges);
  auto tok = prep::Tokenizer::load_gpt2(vocab_path, merges_path);
  if (!tok.is_ok()) return 0;
  std::string_view text = "Hello, world! It's 2026 \xe4\xb8\xad\xe6\x96\x87  \n x";
  std::vector<uint32_t> ids = tok->encode(text);
  for (uint32_t id : ids) FUZZ_REQUIRE(id < tok->vocab_size());
  auto back = tok->decode(ids);
  FUZZ_REQUIRE(back.is_ok() && *back == text);
  return 0;
}
