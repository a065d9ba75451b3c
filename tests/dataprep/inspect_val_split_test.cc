// Regression: `kiln inspect --verify` on a dataset with a validation split (split.val_fraction,
// split.val_min_docs) found "problems" in every domain: the manifest's domain totals are of the
// training shards, while it compared them with stats.json's counts and the shards' samples that
// include the validation documents.
#include <gtest/gtest.h>

#include "tests/dataprep/prep_test_util.h"
#include "tests/test_paths.h"

namespace kiln {
namespace {

using namespace testing_prep;

TEST(InspectValSplit, VerifyFindsNoProblemsWithAValidationSplit) {
  TempDir tmp("inspect_val");
  CorpusGen gen(3);
  std::string jsonl;
  for (int i = 0; i < 300; ++i) {
    const auto words = i % 3 == 0 ? gen.cjk_tokens(120) : gen.english_tokens(120);
    std::string text;
    for (const auto& w : words) text += (text.empty() || i % 3 == 0 ? "" : " ") + w;
    jsonl += nlohmann::json({{"id", "d" + std::to_string(i)}, {"text", text}}).dump() + "\n";
  }
  write_file(tmp / "in.jsonl", jsonl);
  const std::string kiln = test::kiln_binary();
  ASSERT_EQ(
      run_shell(kiln + " prep --input " + (tmp / "in.jsonl") + " --output " + (tmp / "out") +
                " --vocab-size 300 --set split.val_fraction=0.05 --set split.val_min_docs=10" +
                " > " + (tmp / "log") + " 2>&1"),
      0)
      << read_text(tmp / "log");
  const int rc =
      run_shell(kiln + " inspect " + (tmp / "out") + " --verify > " + (tmp / "inspect") + " 2>&1");
  const std::string out = read_text(tmp / "inspect");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("0 problem(s)"), std::string::npos) << out;
  // (and the dataset has validation shards, so the check saw them)
  const auto manifest = nlohmann::json::parse(read_text(tmp / "out/manifest.json"));
  int val_shards = 0;
  for (const auto& sh : manifest["shards"]) val_shards += sh.value("split", "") == "val";
  EXPECT_GT(val_shards, 0);
}

}  // namespace
}  // namespace kiln
