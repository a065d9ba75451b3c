// The `kiln` front end as a user runs it: help everywhere, version, exit codes.
#include <gtest/gtest.h>

#include <algorithm>
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
  // tp 1 (dp 2: ZeRO 0-3), tp 1 x pp 2 (dp 1: ZeRO 0, schedules 1f1b and gpipe) and tp 2
  // (dp 1: ZeRO 0), three checkpointing modes each.
  ASSERT_EQ(arr.size(), 21u);
  int suggested = 0;
  for (const auto& p : arr) {
    EXPECT_EQ(p["tp"].get<int>() * p["dp"].get<int>() * p["pp"].get<int>(), 2);
    ASSERT_EQ(p["stages"].size(), p["pp"].get<size_t>());
    const int m = p["micro_batches"].get<int>(), pp = p["pp"].get<int>();
    EXPECT_DOUBLE_EQ(p["bubble"].get<double>(), (pp - 1.0) / (m + pp - 1.0));
    // The row's memory is its worst stage's.
    uint64_t worst = 0;
    for (const auto& st : p["stages"]) {
      worst = std::max(worst, std::max(st["bytes_per_rank"]["total"].get<uint64_t>(),
                                       st["bytes_per_rank"]["startup"].get<uint64_t>()));
    }
    EXPECT_EQ(worst, std::max(p["bytes_per_rank"]["total"].get<uint64_t>(),
                              p["bytes_per_rank"]["startup"].get<uint64_t>()));
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

// Three dimensions as a user asks for them (a 64-block, 15B Llama on 16 GPUs in machines of 8):
// the JSON's per-stage figures; with a memory budget that only pipelined layouts meet, the table's
// pp and bubble columns and a pipelined suggestion with its flags and reason; --pp / --schedule /
// --global-batch filter the rows; bad values exit 2 naming the flag.
TEST(Cli, PlanSuggestsAPipelineWhenOnlyOneFits) {
  const std::string cfg = std::string("plan --config ") + kiln::test::source_dir() +
                          "/configs/train/llama-8b.yaml --set model.n_layers=64 "
                          "--set model.seq_len=4096 --world 16 ";
  auto json = run_kiln(cfg + "--memory-per-device 1TiB --global-batch 256 --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  auto peak = [](const nlohmann::json& p) {
    return std::max(p["bytes_per_rank"]["total"].get<uint64_t>(),
                    p["bytes_per_rank"]["startup"].get<uint64_t>());
  };
  uint64_t flat_min = UINT64_MAX, pipe_min = UINT64_MAX;
  for (const auto& p : nlohmann::json::parse(json.output)) {
    EXPECT_EQ(p["micro_batches"].get<int>() * p["dp"].get<int>(), 256);  // micro_batch 1
    if (p["tp"].get<int>() > 8) continue;  // never suggested: across machines
    uint64_t& min = p["pp"].get<int>() == 1 ? flat_min : pipe_min;
    min = std::min(min, peak(p));
  }
  ASSERT_LT(pipe_min, flat_min) << "stages hold a share of the model states each";
  const std::string budget = std::to_string((pipe_min + flat_min) / 2);
  auto text = run_kiln(cfg + "--memory-per-device " + budget + " --global-batch 256");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find(" pp "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("bubble"), std::string::npos) << text.output;
  const size_t at = text.output.find("suggested: --set parallel.tp=");
  ASSERT_NE(at, std::string::npos) << text.output;
  const std::string why = text.output.substr(at);
  EXPECT_EQ(why.find("--set parallel.pp=1 "), std::string::npos) << why;
  EXPECT_NE(why.find("--set parallel.pp_schedule=1f1b"), std::string::npos) << why;
  EXPECT_NE(why.find("fits in"), std::string::npos) << why;
  EXPECT_NE(why.find("micro-batches"), std::string::npos) << why;
  EXPECT_NE(why.find("in flight"), std::string::npos) << why;

  auto only = run_kiln(cfg + "--pp 4 --schedule gpipe --json");
  ASSERT_EQ(only.exit_code, 0) << only.output;
  for (const auto& p : nlohmann::json::parse(only.output)) {
    EXPECT_EQ(p["pp"].get<int>(), 4);
    EXPECT_EQ(p["pp_schedule"].get<std::string>(), "gpipe");
    // GPipe keeps every micro-batch on every stage.
    for (const auto& st : p["stages"]) EXPECT_EQ(st["in_flight"], p["micro_batches"]);
  }
  auto bad = run_kiln(cfg + "--schedule interleaved");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--schedule"), std::string::npos) << bad.output;
  auto odd = run_kiln(cfg + "--tp 1 --pp 1 --global-batch 3");  // dp 16 does not divide 3
  EXPECT_EQ(odd.exit_code, 2) << odd.output;
  EXPECT_NE(odd.output.find("--global-batch"), std::string::npos) << odd.output;
  auto deep = run_kiln(cfg + "--pp 128");
  EXPECT_EQ(deep.exit_code, 2) << deep.output;
  EXPECT_NE(deep.output.find("--pp 128"), std::string::npos) << deep.output;
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
