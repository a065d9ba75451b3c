// Helpers shared by the engine tests: a small model, a fresh temporary run directory, a train
// config built from `--set` style overrides (the test's base settings, then its extra ones) and a
// quiet trainer.
#pragma once

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/train_config.h"
#include "engine/model/params.h"
#include "engine/train/trainer.h"

namespace kiln::engine::test {

// A model small enough for exact CPU checks (3 blocks, 67-token vocabulary, 20 positions).
inline ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 67;
  m.d_model = 32;
  m.n_layers = 3;
  m.n_heads = 4;
  m.seq_len = 20;
  return m;
}

// <tmp>/kiln_<suite>_<name>_<pid>, removed if it exists (not created).
inline std::string temp_dir(const std::string& suite, const std::string& name) {
  std::filesystem::path p = std::filesystem::temp_directory_path() /
                            ("kiln_" + suite + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

// Model states that tell every element apart: the weights initialised from `seed`, the AdamW
// moments a function of (tensor, element) (for checkpoint round trips and reshards).
inline void fill_distinct_states(ParamStore& params, uint64_t seed) {
  params.init(seed);
  for (size_t i = 0; i < params.tensors().size(); ++i) {
    const int ti = static_cast<int>(i);
    for (size_t k = 0; k < params.tensors()[i].numel; ++k) {
      params.exp_avg(ti)[k] = 0.001f * static_cast<float>(k) + static_cast<float>(i);
      params.exp_avg_sq(ti)[k] = std::sqrt(static_cast<float>(k + i));
    }
  }
}

// The config that `kiln train --set s ...` would run with, for sets = base then extra; a bad key or
// value stops the test binary with the config error.
inline TrainConfig config_from_sets(std::vector<std::string> sets,
                                    const std::vector<std::string>& extra) {
  sets.insert(sets.end(), extra.begin(), extra.end());
  auto cfg = load_train_config("", sets);
  KILN_CHECK(cfg.is_ok(), cfg.status().to_string());
  auto tc = parse_train_config(*cfg);
  KILN_CHECK(tc.is_ok(), tc.status().to_string());
  return *tc;
}

// A trainer for `c` without console output (resume: continue from the run directory's latest
// checkpoint); a failure to open stops the test binary with the error.
inline std::unique_ptr<Trainer> open_trainer(const TrainConfig& c, bool resume = false) {
  TrainOptions o;
  o.resume = resume;
  o.console = false;
  auto t = Trainer::open(c, "# test\n", o);
  KILN_CHECK(t.is_ok(), t.status().to_string());
  return std::move(t).value();
}

}  // namespace kiln::engine::test
