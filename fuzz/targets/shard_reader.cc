// Fuzz target: the tar / tar.zst shard reader (format/shard_reader.h). Byte 0 picks the file type
// (even: .tar, odd: .tar.zst); the rest is the shard. Every sample is read to the end (members
// capped at 1 MiB, samples at 64 members / 4 MiB so the fuzzer cannot make it hold more);
// .tokens.npy members go through the .npy parser as the loader would. Invariants: keys and exts
// are valid, a sample never repeats an ext, errors stay errors.
#include <set>

#include "format/npy.h"
#include "format/shard_reader.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  if (size < 1) return 0;
  std::string path = fuzz::write_scratch(data[0] % 2 ? "shard.tar.zst" : "shard.tar",
                                         fuzz::as_view(data + 1, size - 1));
  ShardReaderOptions opt;
  opt.max_member_bytes = 1 << 20;
  opt.max_sample_bytes = 4 << 20;
  opt.max_sample_members = 64;
  auto reader = ShardReader::open(path, opt);
  if (!reader.is_ok()) return 0;
  ShardSample sample;
  std::vector<uint32_t> tokens;
  for (;;) {
    Result<bool> more = (*reader)->next(&sample);
    if (!more.is_ok()) {
      FUZZ_REQUIRE(!(*reader)->next(&sample).is_ok());  // an error is sticky
      break;
    }
    if (!*more) break;
    FUZZ_REQUIRE(validate_sample_key(sample.key).is_ok());
    FUZZ_REQUIRE(!sample.members.empty() && sample.members.size() <= 64);
    std::set<std::string> exts;
    for (const ShardMember& m : sample.members) {
      FUZZ_REQUIRE(validate_member_ext(m.ext).is_ok());
      FUZZ_REQUIRE(exts.insert(m.ext).second);
      if (m.ext == "tokens.npy") (void)npy_decode(m.data, &tokens);
    }
  }
  return 0;
}
