// Issue 39 (prep): `kiln prep` loads and checks every input it is given - tokenizer, domain rules,
// tagger model, the filters' models and lists, the config - before it writes anything. Through the
// CLI as a user meets it: the exit code, a message naming the file and the key, an output folder
// that was never created (or, with --overwrite, an earlier dataset left byte-identical), and the
// corrected command then runs in the same output folder (no "unfinished prep run" refusal).
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/dataprep/prep_test_util.h"
#include "tests/kiln_cli.h"

namespace kiln {
namespace {
using namespace testing_prep;
using testing_cli::run_kiln;

class PrepBadInputs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir("prep_bad_inputs");
    CorpusGen gen(11);
    write_corpus(gen.make(120, 0.2, {0.0, 0.05}, 2), *tmp_ / "in", 2);
    // A real tokenizer.json, trained by kiln on the corpus, for the corrected reruns.
    const auto r = run_kiln("tokenizer train --vocab-size 300 --input " + *tmp_ / "in" +
                            " --output " + *tmp_ / "good.json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    write_file(*tmp_ / "broken.json", "{\"model\": {\"type\": \"BPE\"");
    write_file(*tmp_ / "rules.yaml", "rules: [{name: a\n");
    std::string junk(1000, '\0');
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 131 + 7);
    write_file(*tmp_ / "junk.bin", junk);
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static std::string prep(const std::string& out, const std::string& extra) {
    return "prep --input " + *tmp_ / "in" + " --output " + out + " " + extra;
  }
  // Runs a bad command: the exit code, every fragment in the message, nothing at `out`.
  static void refused(const std::string& name, const std::string& extra, int code,
                      const std::vector<std::string>& fragments) {
    const std::string out = *tmp_ / name;
    const auto r = run_kiln(prep(out, extra));
    EXPECT_EQ(r.exit_code, code) << name << ": " << r.output;
    for (const std::string& f : fragments)
      EXPECT_NE(r.err.find(f), std::string::npos) << name << ": no '" << f << "' in " << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << name << ": the refused run wrote " << out;
  }
  static TempDir* tmp_;
};
TempDir* PrepBadInputs::tmp_ = nullptr;

TEST_F(PrepBadInputs, BrokenTokenizerWritesNothingAndTheCorrectedRerunRuns) {
  const std::string out = *tmp_ / "tok";
  refused("tok", "--tokenizer " + *tmp_ / "broken.json", 3,
          {"broken.json", "tokenizer.path", "not valid JSON"});
  // The same output folder with the corrected flag: a fresh run, not "an unfinished prep run".
  const auto r = run_kiln(prep(out, "--tokenizer " + *tmp_ / "good.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(out + "/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.json"));
}

TEST_F(PrepBadInputs, MissingTokenizerIsAConfigError) {
  refused("tok_missing", "--tokenizer " + *tmp_ / "no-such.json", 2,
          {"no-such.json", "tokenizer.path"});
}

TEST_F(PrepBadInputs, BrokenDomainRulesWithALoadedOrATrainedTokenizer) {
  refused("rules_loaded",
          "--tokenizer " + *tmp_ / "good.json" + " --set domains.rules=" + *tmp_ / "rules.yaml", 2,
          {"rules.yaml", "domains.rules"});
  // Training the tokenizer happens after the scan; the rules are still checked first.
  refused("rules_trained", "--vocab-size 300 --set domains.rules=" + *tmp_ / "rules.yaml", 2,
          {"rules.yaml", "domains.rules"});
}

TEST_F(PrepBadInputs, DamagedTaggerModel) {
  refused("model", "--tokenizer none --set domains.model=" + *tmp_ / "junk.bin", 3,
          {"junk.bin", "domains.model", "not a fastText model"});
}

TEST_F(PrepBadInputs, FilterModelAndListFiles) {
  refused("lid",
          "--tokenizer none --set 'filters=[{name: language, model: " + *tmp_ / "junk.bin" + "}]'",
          2, {"filters[0].model", "junk.bin"});
  refused(
      "list",
      "--tokenizer none --set 'filters=[{name: url, domains_file: " + *tmp_ / "no-list.txt" + "}]'",
      2, {"filters[0].domains_file", "no-list.txt"});
}

TEST_F(PrepBadInputs, ConfigErrors) {
  refused("key", "--tokenizer none --set dedup.tresholds=1", 2,
          {"dedup.tresholds", "did you mean"});
  refused("value", "--tokenizer none --set shards.level=40", 2, {"shards.level"});
}

TEST_F(PrepBadInputs, OverwriteWithABrokenTokenizerKeepsTheEarlierDataset) {
  const std::string out = *tmp_ / "kept";
  auto r = run_kiln(prep(out, "--tokenizer " + *tmp_ / "good.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto before = output_tree(out);
  r = run_kiln(prep(out, "--overwrite --tokenizer " + *tmp_ / "broken.json"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.err.find("tokenizer.path"), std::string::npos) << r.err;
  EXPECT_EQ(output_tree(out), before) << "a refused --overwrite changed the earlier dataset";
}

}  // namespace
}  // namespace kiln
