// `kiln train` and `kiln mix` end to end on a real `kiln prep` dataset: exit codes, the run
// directory contract, exact resume through the binary and across a live mixture change.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/config/train_config.h"
#include "engine/mixing/control_file.h"
#include "engine/model/rng.h"
#include "engine/train/trainer.h"
#include "tests/kiln_cli.h"
#include "tests/test_paths.h"

namespace kiln::engine {
namespace {
namespace fs = std::filesystem;

using testing_cli::CliRun;

CliRun kiln(const std::string& args) { return testing_cli::run_kiln(args); }

std::vector<nlohmann::json> metrics(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

class EngineCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ =
        (fs::temp_directory_path() / ("kiln_engine_cli_" + std::to_string(::getpid()))).string();
    fs::remove_all(root_);
    fs::create_directories(root_);
    // Two domains of distinct synthetic documents.
    const char* words[] = {"river",   "stone",  "light",   "forest",  "garden",
                           "window",  "silver", "morning", "winter",  "paper",
                           "candle",  "harbor", "meadow",  "thunder", "lantern",
                           "orchard", "valley", "compass", "feather", "mirror"};
    std::ofstream out(root_ + "/corpus.jsonl");
    for (int d = 0; d < 240; ++d) {
      std::string text;
      const bool code = d % 3 == 0;
      for (int s = 0; s < 30; ++s) {
        if (code) {
          text += "int f" + std::to_string(d * 100 + s) + "(int x) { return x * " +
                  std::to_string(random_bits(d, s, 0) % 97) + " + " +
                  words[random_bits(d, s, 1) % 20] + "; }\\n";
        } else {
          for (int w = 0; w < 8; ++w) text += std::string(words[random_bits(d, s, w) % 20]) + " ";
          text += ". ";
        }
      }
      out << "{\"id\": \"doc" << d << "\", \"domain\": \"" << (code ? "code" : "prose")
          << "\", \"text\": \"" << text << "\"}\n";
    }
    out.close();
    CliRun prep = kiln("prep --input " + root_ + "/corpus.jsonl --output " + root_ +
                       "/data --threads 2 --vocab-size 512");
    ASSERT_EQ(prep.exit_code, 0) << prep.output;
    manifest_ = root_ + "/data/manifest.json";
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string train_args(const std::string& dir) {
    return "train --config " + std::string(kiln::test::source_dir()) + "/configs/train/tiny.yaml" +
           " --set data.manifest=" + manifest_ + " --set run.dir=" + dir +
           " --set model.vocab_size=512 --set model.d_model=32 --set model.n_layers=2"
           " --set model.seq_len=32 --set data.micro_batch=4 --set schedule.total_steps=12"
           " --set run.threads=2 --set run.log_every=1";
  }

  static std::string root_;
  static std::string manifest_;
};
std::string EngineCli::root_;
std::string EngineCli::manifest_;

TEST_F(EngineCli, TrainResumeAndRunDirectory) {
  const std::string a = root_ + "/run_a", b = root_ + "/run_b";
  CliRun ra = kiln(train_args(a) + " --set run.steps=12");
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  EXPECT_NE(ra.output.find("step 12/12 | loss"), std::string::npos) << ra.output;
  CliRun rb = kiln(train_args(b) + " --set run.steps=6");
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  // Without --resume a used run directory is refused (exit 2).
  CliRun again = kiln(train_args(b) + " --set run.steps=12");
  EXPECT_EQ(again.exit_code, 2) << again.output;
  CliRun rr = kiln(train_args(b) + " --set run.steps=12 --resume");
  ASSERT_EQ(rr.exit_code, 0) << rr.output;
  EXPECT_NE(rr.output.find("resumed from"), std::string::npos);

  auto ma = metrics(a), mb = metrics(b);
  ASSERT_EQ(ma.size(), 12u);
  ASSERT_EQ(mb.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    // Doubles print round-trip exact: equal text is equal bits.
    EXPECT_EQ(ma[i]["loss"].dump(), mb[i]["loss"].dump()) << "step " << i + 1;
    EXPECT_EQ(ma[i]["tokens"], mb[i]["tokens"]);
  }
  EXPECT_TRUE(ma[0]["domain_loss"].contains("code"));
  EXPECT_TRUE(ma[0]["domain_loss"].contains("prose"));
  EXPECT_TRUE(ma[0]["loader_wait_ms"].is_number());
  EXPECT_TRUE(ma[0]["loss_scale"].is_null());
  EXPECT_LT(ma[11]["loss"].get<double>(), ma[0]["loss"].get<double>());
  EXPECT_TRUE(fs::exists(fs::path(b) / "config.yaml"));
  EXPECT_TRUE(fs::exists(fs::path(b) / "checkpoints" / "step-00000012" / "state.json"));

  // kiln mix.
  CliRun show = kiln("mix show " + b);
  EXPECT_EQ(show.exit_code, 0) << show.output;
  // The run publishes its starting weights in RUN/control/mixture.json.
  EXPECT_NE(show.output.find("control file"), std::string::npos) << show.output;
  {
    auto published = read_mixture(b);
    ASSERT_TRUE(published.is_ok() && published->has_value());
    double sum = 0;
    for (const auto& [d, v] : **published) sum += v;
    EXPECT_NEAR(sum, 1.0, 1e-12);
    EXPECT_TRUE((*published)->count("code") && (*published)->count("prose"));
  }
  EXPECT_NE(show.output.find("in effect at step 12"), std::string::npos) << show.output;
  // The data accounting comes from the latest checkpoint's trainer state.
  EXPECT_NE(show.output.find("data accounting at checkpoint step 12"), std::string::npos)
      << show.output;
  EXPECT_NE(show.output.find("loader weight history"), std::string::npos) << show.output;
  CliRun set = kiln("mix set " + b + " code=3 prose=1");
  EXPECT_EQ(set.exit_code, 0) << set.output;
  auto w = read_mixture(b);
  ASSERT_TRUE(w.is_ok() && w->has_value());
  EXPECT_DOUBLE_EQ((**w).at("code"), 3.0);
  EXPECT_NE(kiln("mix show " + b).output.find("75.0%"), std::string::npos);
  CliRun unknown = kiln("mix set " + b + " cdoe=1");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("did you mean 'code'"), std::string::npos) << unknown.output;
  EXPECT_EQ(kiln("mix set " + b + " code=-1").exit_code, 2);
  EXPECT_EQ(kiln("mix set " + b + " code").exit_code, 2);
  EXPECT_EQ(kiln("mix set " + root_ + "/no-such-run code=1").exit_code, 2);
  EXPECT_EQ((**read_mixture(b)).at("code"), 3.0);  // failed sets left the file alone

  // The resumed run picks the control file up at its next step.
  CliRun more = kiln(train_args(b) + " --set run.steps=14 --resume");
  ASSERT_EQ(more.exit_code, 0) << more.output;
  auto mc = metrics(b);
  ASSERT_EQ(mc.size(), 14u);
  EXPECT_DOUBLE_EQ(mc[12]["domain_weights"]["code"].get<double>(), 0.75);
}

TEST_F(EngineCli, ConfigErrorsExitTwo) {
  CliRun typo = kiln("train --set model.n_layer=2 --set run.dir=" + root_ + "/x");
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.output.find("model.n_layers"), std::string::npos) << typo.output;
  CliRun prec = kiln("train --set precision=fp8 --set run.dir=" + root_ + "/x");
  EXPECT_EQ(prec.exit_code, 2);
  EXPECT_NE(prec.output.find("precision"), std::string::npos) << prec.output;
  CliRun vocab = kiln("train --set data.manifest=" + manifest_ + " --set model.vocab_size=100" +
                      " --set run.dir=" + root_ + "/y");
  EXPECT_EQ(vocab.exit_code, 2) << vocab.output;
  EXPECT_NE(vocab.output.find("model.vocab_size"), std::string::npos) << vocab.output;
  CliRun mix = kiln("train --set data.manifest=" + manifest_ + " --set data.mixture.nope=1" +
                    " --set run.dir=" + root_ + "/z");
  EXPECT_EQ(mix.exit_code, 2) << mix.output;
  EXPECT_NE(mix.output.find("data.mixture.nope"), std::string::npos) << mix.output;
}

// device=cuda on a machine without a usable GPU (or a build without CUDA): exit 2, the message
// names `device` and the reason. Where a GPU is usable this checks nothing and says so.
// The memory preflight (engine/train/preflight.h) as a user meets it: a model far too large for
// the machine stops at once with exit 2 naming the budget and a layout that fits, before anything
// is allocated or written; a budget too small for the tiny model refuses it, and
// memory.check=false runs it anyway.
TEST_F(EngineCli, MemoryPreflightRefusesWhatCannotFit) {
  const std::string huge = root_ + "/run_huge";
  CliRun r = kiln("train --config " + std::string(kiln::test::source_dir()) +
                  "/configs/train/tiny.yaml --set data.manifest=" + manifest_ +
                  " --set model.vocab_size=512 --set model.d_model=16384 --set model.n_layers=256"
                  " --set model.n_heads=128 --set run.dir=" +
                  huge);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("key 'memory'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TiB per rank"), std::string::npos) << r.output;
  EXPECT_TRUE(r.output.find("MemAvailable") != std::string::npos ||
              r.output.find("cgroup limit") != std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(fs::path(huge) / "metrics.jsonl"));
  // With a budget that does not depend on this machine's free memory: the layout that fits.
  r = kiln("train --config " + std::string(kiln::test::source_dir()) +
           "/configs/train/tiny.yaml --set data.manifest=" + manifest_ +
           " --set model.vocab_size=512 --set model.d_model=16384 --set model.n_layers=256"
           " --set model.n_heads=128 --set memory.budget=64GiB --set run.dir=" +
           huge);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("(memory.budget; 10% held back"), std::string::npos) << r.output;
  // Sharded model states: ZeRO-3, or pipeline stages (each holds its share of the blocks).
  EXPECT_TRUE(r.output.find("--set parallel.zero_stage=3") != std::string::npos ||
              r.output.find("--set parallel.pp=") != std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ranks of this budget (kiln plan --world"), std::string::npos)
      << r.output;

  const std::string small = root_ + "/run_small_budget";
  r = kiln(train_args(small) + " --set run.steps=2 --set memory.budget=100KiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("memory.budget"), std::string::npos) << r.output;
  r = kiln(train_args(small) +
           " --set run.steps=2 --set memory.budget=100KiB --set memory.check=false");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = kiln(train_args(root_ + "/run_bad_budget") + " --set memory.budget=lots");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("memory.budget"), std::string::npos) << r.output;
  // kiln prep refuses a --memory the machine does not have (before reading any input).
  r = kiln("prep --input " + root_ + "/corpus.jsonl --output " + root_ +
           "/data_huge --memory 1000T");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--memory 1000T is more than this process can have"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(root_ + "/data_huge/manifest.json"));
}

TEST_F(EngineCli, CudaWithoutGpuExitsTwoNamingDevice) {
  CliRun r = kiln("train --set device=cuda --set run.steps=1 --set run.dir=" + root_ + "/gpu");
  if (r.exit_code == 0) GTEST_SKIP() << "a GPU is usable here: device=cuda trained";
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("device"), std::string::npos) << r.output;
  EXPECT_TRUE(r.output.find("no usable GPU") != std::string::npos ||
              r.output.find("no CUDA device") != std::string::npos ||
              r.output.find("built without CUDA") != std::string::npos)
      << r.output;
  CliRun bad = kiln("train --set device=tpu --set run.dir=" + root_ + "/tpu");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("device"), std::string::npos) << bad.output;
}

// A live weight change between two steps resumes exactly: the loader's weight history and the
// applied control file travel in the checkpoint.
TEST_F(EngineCli, LiveMixtureChangeResumesExactly) {
  auto make = [&](const std::string& dir) {
    auto cfg = load_train_config(
        std::string(kiln::test::source_dir()) + "/configs/train/tiny.yaml",
        {"data.manifest=" + manifest_, "run.dir=" + dir, "model.vocab_size=512", "model.d_model=32",
         "model.n_layers=1", "model.seq_len=32", "data.micro_batch=4", "run.steps=8",
         "schedule.total_steps=8", "run.threads=2"});
    KILN_CHECK(cfg.is_ok(), cfg.status().to_string());
    auto tc = parse_train_config(*cfg);
    KILN_CHECK(tc.is_ok(), tc.status().to_string());
    return *tc;
  };
  TrainOptions quiet;
  quiet.console = false;
  const std::string a = root_ + "/live_a", b = root_ + "/live_b";
  auto ta = Trainer::open(make(a), "", quiet);
  ASSERT_TRUE(ta.is_ok()) << ta.status().to_string();
  for (int s = 1; s <= 8; ++s) {
    if (s == 5) {
      ASSERT_TRUE(write_mixture(a, {{"prose", 1.0}}).is_ok());
    }
    ASSERT_TRUE((*ta)->step().is_ok());
  }
  {
    auto tb = Trainer::open(make(b), "", quiet);
    ASSERT_TRUE(tb.is_ok());
    for (int s = 1; s <= 4; ++s) ASSERT_TRUE((*tb)->step().is_ok());
    ASSERT_TRUE((*tb)->save().is_ok());
  }
  TrainOptions resume = quiet;
  resume.resume = true;
  auto tr = Trainer::open(make(b), "", resume);
  ASSERT_TRUE(tr.is_ok()) << tr.status().to_string();
  ASSERT_TRUE(write_mixture(b, {{"prose", 1.0}}).is_ok());
  for (int s = 5; s <= 8; ++s) ASSERT_TRUE((*tr)->step().is_ok());
  const auto& ha = (*ta)->history();
  const auto& hr = (*tr)->history();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(0, std::memcmp(&ha[4 + i].loss, &hr[i].loss, sizeof(double))) << "step " << 5 + i;
    EXPECT_DOUBLE_EQ(hr[i].domain_weights.at("prose"), 1.0);
    EXPECT_EQ(hr[i].domain_loss.count("code"), 0u);
  }
  EXPECT_GT(ha[3].domain_weights.at("code"), 0.0);

  // Resuming again from step 8 with the same control file does not re-apply it (no new change
  // in the loader's weight history).
  ASSERT_TRUE((*tr)->save().is_ok());
  auto state = (*tr)->state();
  auto again = Trainer::open(make(b), "", resume);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ((*again)->state().mixture_hash, state.mixture_hash);
  EXPECT_NE(state.mixture_hash, 0u);
}

}  // namespace
}  // namespace kiln::engine
