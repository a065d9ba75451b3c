// The `kiln` front end as a user runs it: help everywhere, version, exit codes.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/kiln_cli.h"
#include "tests/test_paths.h"

namespace {

using kiln::testing_cli::run_kiln;

TEST(Cli, HelpAndVersion) {
  auto help = run_kiln("--help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* cmd :
       {"prep", "inspect", "tokenizer", "tagger", "stream", "train", "mix", "plan"}) {
    EXPECT_NE(help.output.find(cmd), std::string::npos) << cmd;
    auto sub = run_kiln(std::string(cmd) + " --help");
    EXPECT_EQ(sub.exit_code, 0) << cmd << ": " << sub.output;
    EXPECT_NE(sub.output.find("Usage"), std::string::npos) << cmd;
  }
  auto version = run_kiln("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.output.find("kiln "), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run_kiln("").exit_code, 2);
  EXPECT_EQ(run_kiln("no-such-command").exit_code, 2);
  EXPECT_EQ(run_kiln("prep --no-such-flag").exit_code, 2);
  // CLI::Range lets "nan" through: a NaN timeout left prep's watchdog spinning, never firing.
  auto nan = run_kiln("prep --input /no/such --output /tmp/kiln_cli_nan --collective-timeout nan");
  EXPECT_EQ(nan.exit_code, 2) << nan.output;
  EXPECT_NE(nan.output.find("not a finite number"), std::string::npos) << nan.output;
}

}  // namespace

namespace {

TEST(Cli, MissingPathsAreUsageErrors) {
  EXPECT_EQ(run_kiln("inspect /no/such/dir").exit_code, 2);
  EXPECT_EQ(run_kiln("stream /no/such/dir --steps 1").exit_code, 2);
  auto enc = run_kiln("tokenizer encode --tokenizer /no/such/tok.json < /dev/null");
  EXPECT_EQ(enc.exit_code, 2) << enc.output;
  auto train = run_kiln(
      "train --set data.manifest=/no/such/manifest.json --set run.dir=/tmp/kiln_cli_test_run "
      "--overwrite");
  EXPECT_EQ(train.exit_code, 2) << train.output;
  EXPECT_NE(train.output.find("data.manifest"), std::string::npos) << train.output;
}

TEST(Cli, PlanPrintsEveryLayoutAndNamesBadFlags) {
  auto missing = run_kiln("plan --config /no/such/x.yaml --world 8");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("--config"), std::string::npos) << missing.output;
  auto bad = run_kiln(std::string("plan --config ") + kiln::test::source_dir() +
                      "/configs/train/tiny.yaml --world 2 --memory-per-device lots");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("--memory-per-device"), std::string::npos) << bad.output;
  auto json = run_kiln(std::string("plan --config ") + kiln::test::source_dir() +
                       "/configs/train/tiny.yaml --world 2 --memory-per-device 1GiB --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  auto arr = nlohmann::json::parse(json.output);
  // tp 1 (dp 2: ZeRO 0-3) and tp 2 (dp 1: ZeRO 0), three checkpointing modes each.
  ASSERT_EQ(arr.size(), 15u);
  int suggested = 0;
  for (const auto& p : arr) {
    EXPECT_EQ(p["tp"].get<int>() * p["dp"].get<int>(), 2);
    const auto& b = p["bytes_per_rank"];
    EXPECT_EQ(b["total"].get<uint64_t>(), b["params"].get<uint64_t>() + b["grads"].get<uint64_t>() +
                                              b["optimizer"].get<uint64_t>() +
                                              b["activations"].get<uint64_t>() +
                                              b["buffers"].get<uint64_t>());
    EXPECT_EQ(p["fits"].get<bool>(), b["total"].get<uint64_t>() <= (uint64_t{1} << 30));
    suggested += p["suggested"].get<bool>();
  }
  EXPECT_EQ(suggested, 1);
}

}  // namespace

namespace {

TEST(Cli, UnknownConfigKeyFailsWithExitTwoAndNamesIt) {
  const std::string cfg = "/tmp/kiln_cli_test_bad_config.yaml";
  FILE* f = std::fopen(cfg.c_str(), "w");
  std::fputs("dedup:\n  treshold: 0.7\n", f);
  std::fclose(f);
  auto prep = run_kiln("prep --config " + cfg + " --input /tmp --output /tmp/kiln_cli_test_out");
  EXPECT_EQ(prep.exit_code, 2) << prep.output;
  EXPECT_NE(prep.output.find("dedup.treshold"), std::string::npos) << prep.output;
  EXPECT_NE(prep.output.find("did you mean 'dedup.threshold'"), std::string::npos) << prep.output;

  auto train = run_kiln("train --set model.n_layer=2");
  EXPECT_EQ(train.exit_code, 2) << train.output;
  EXPECT_NE(train.output.find("model.n_layer"), std::string::npos) << train.output;
  EXPECT_NE(train.output.find("did you mean 'model.n_layers'"), std::string::npos) << train.output;
}

}  // namespace
