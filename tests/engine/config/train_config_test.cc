// The `kiln train` config schema: defaults, --set overrides, errors naming the key.
#include "engine/config/train_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_paths.h"

namespace kiln::engine {
namespace {
TEST(TrainConfig, DefaultsParse) {
  auto cfg = load_train_config("", {});
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto tc = parse_train_config(*cfg);
  ASSERT_TRUE(tc.is_ok()) << tc.status().to_string();
  EXPECT_EQ(tc->precision, Precision::kFp32);
  EXPECT_EQ(tc->schedule.total_steps, tc->run.steps);  // 0 means run.steps
  EXPECT_FLOAT_EQ(tc->optimizer.beta2, 0.95f);
  EXPECT_EQ(tc->loss_scale.initial, 65536.0);
  EXPECT_EQ(tc->loss_scale.growth_interval, 2000);
  EXPECT_EQ(tc->loss_scale.hysteresis, 2);
}
TEST(TrainConfig, SetsAndErrorsNameTheKey) {
  auto cfg = load_train_config("", {"precision=bf16", "model.n_layers=2", "data.mixture.code=0.7",
                                    "data.mixture.web=0.3", "schedule.type=wsd"});
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto tc = parse_train_config(*cfg);
  ASSERT_TRUE(tc.is_ok()) << tc.status().to_string();
  EXPECT_EQ(tc->precision, Precision::kBf16);
  EXPECT_EQ(tc->model.n_layers, 2);
  EXPECT_EQ(tc->schedule.kind, ScheduleKind::kWsd);
  EXPECT_DOUBLE_EQ(tc->data.mixture.at("code"), 0.7);

  auto unknown = load_train_config("", {"model.n_layer=2"});
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().to_string().find("model.n_layers"), std::string::npos);

  struct Bad {
    const char* set;
    const char* key;
  } bads[] = {{"precision=fp8", "precision"},
              {"model.n_heads=3", "model.n_heads"},
              {"optimizer.betas=[0.9]", "optimizer.betas"},
              {"activation_checkpointing=some", "activation_checkpointing"},
              {"schedule.type=cosin", "schedule.type"},
              {"data.mixture.web=-1", "data.mixture.web"},
              {"loss_scale.hysteresis=0", "loss_scale.hysteresis"},
              {"optimizer.lr=-1", "optimizer.lr"},
              {"parallel.pp=0", "parallel.pp"},
              {"parallel.pp_schedule=zb", "parallel.pp_schedule"}};
  for (const auto& b : bads) {
    auto c = load_train_config("", {b.set});
    ASSERT_TRUE(c.is_ok()) << b.set;
    auto t = parse_train_config(*c);
    ASSERT_FALSE(t.is_ok()) << b.set;
    EXPECT_EQ(t.status().code(), StatusCode::kConfig) << b.set;
    EXPECT_EQ(t.status().key(), b.key) << b.set << ": " << t.status().to_string();
  }
  auto c = load_train_config("", {"schedule.type=cosin"});
  EXPECT_NE(parse_train_config(*c).status().to_string().find("did you mean 'cosine'"),
            std::string::npos);
}

// Pipeline keys: the schedule, a split by hand that must cover the blocks, one block per stage at
// least.
TEST(TrainConfig, PipelineKeys) {
  auto ok =
      load_train_config("", {"model.n_layers=4", "parallel.pp=2", "parallel.pp_schedule=gpipe",
                             "parallel.pp_layers=[1, 3]", "eval.every_steps=0"});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  auto t = parse_train_config(*ok);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->parallel.pp, 2);
  EXPECT_EQ(t->parallel.pp_schedule, PpSchedule::kGPipe);
  EXPECT_EQ(t->parallel.pp_layers, (std::vector<int64_t>{1, 3}));
  auto dflt = parse_train_config(*load_train_config("", {}));
  ASSERT_TRUE(dflt.is_ok());
  EXPECT_EQ(dflt->parallel.pp, 1);
  EXPECT_EQ(dflt->parallel.pp_schedule, PpSchedule::k1F1B);
  EXPECT_TRUE(dflt->parallel.pp_layers.empty());
  for (std::vector<std::string> sets :
       {std::vector<std::string>{"model.n_layers=4", "parallel.pp=2", "parallel.pp_layers=[1, 2]"},
        {"model.n_layers=4", "parallel.pp=2", "parallel.pp_layers=[4]"},
        {"model.n_layers=4", "parallel.pp=2", "parallel.pp_layers=[0, 4]"},
        {"model.n_layers=4", "parallel.pp=2", "parallel.pp_layers=[a, 4]"}}) {
    auto c = load_train_config("", sets);
    ASSERT_TRUE(c.is_ok());
    auto bad = parse_train_config(*c);
    ASSERT_FALSE(bad.is_ok()) << sets.back();
    EXPECT_EQ(bad.status().key(), "parallel.pp_layers") << bad.status().to_string();
  }
  auto many = parse_train_config(*load_train_config("", {"model.n_layers=2", "parallel.pp=3"}));
  ASSERT_FALSE(many.is_ok());
  EXPECT_EQ(many.status().key(), "parallel.pp");
  // ZeRO-2/3 reduce per micro-batch: refused with a pipeline, saying why; ZeRO-1 is fine.
  for (const char* z : {"parallel.zero_stage=2", "parallel.zero_stage=3"}) {
    auto r = parse_train_config(
        *load_train_config("", {"model.n_layers=4", "parallel.pp=2", "eval.every_steps=0", z}));
    ASSERT_FALSE(r.is_ok()) << z;
    EXPECT_EQ(r.status().key(), "parallel.zero_stage");
    EXPECT_NE(r.status().message().find("per micro-batch"), std::string::npos)
        << r.status().to_string();
  }
  EXPECT_TRUE(
      parse_train_config(*load_train_config("", {"model.n_layers=4", "parallel.pp=2",
                                                 "eval.every_steps=0", "parallel.zero_stage=1"}))
          .is_ok());
  // Evaluation runs through the pipeline (the default eval.every_steps included).
  EXPECT_TRUE(
      parse_train_config(*load_train_config("", {"model.n_layers=4", "parallel.pp=2"})).is_ok());
}

// model.arch and the Llama keys: arch defaults (auto), and each bad value refused naming its key.
TEST(TrainConfig, LlamaKeys) {
  auto gpt = parse_train_config(*load_train_config("", {}));
  ASSERT_TRUE(gpt.is_ok());
  EXPECT_EQ(gpt->model.arch, Arch::kGpt2);
  EXPECT_TRUE(gpt->model.tie_embeddings && gpt->model.bias && !gpt->model.doc_mask);
  EXPECT_EQ(gpt->model.kv_heads(), gpt->model.n_heads);
  EXPECT_EQ(gpt->model.ffn(), 4 * gpt->model.d_model);

  auto cfg = load_train_config("", {"model.arch=llama", "model.d_model=2048", "model.n_heads=32",
                                    "model.n_kv_heads=8", "data.manifest=some/manifest.json"});
  auto llama = parse_train_config(*cfg);
  ASSERT_TRUE(llama.is_ok()) << llama.status().to_string();
  const ModelConfig& m = llama->model;
  EXPECT_EQ(m.arch, Arch::kLlama);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_FALSE(m.bias);
  EXPECT_TRUE(m.doc_mask);
  EXPECT_EQ(m.kv_heads(), 8);
  EXPECT_EQ(m.ffn(), 5632);  // 2/3 of 4 x 2048 = 5461.3, rounded up to 256 (Llama's rule)
  EXPECT_EQ(m.qkv_width(), (32 + 2 * 8) * 64);
  EXPECT_EQ(llama_ffn_hidden(4096), 11008);  // Llama 2 7B's width
  // GPT-2 takes model.doc_mask too (its learned positions restart at document starts).
  auto gpt_mask = parse_train_config(
      *load_train_config("", {"model.doc_mask=true", "data.manifest=some/manifest.json"}));
  ASSERT_TRUE(gpt_mask.is_ok()) << gpt_mask.status().to_string();
  EXPECT_TRUE(gpt_mask->model.doc_mask);

  struct Bad {
    std::vector<std::string> sets;
    const char* key;
  } bads[] = {
      {{"model.arch=mamba"}, "model.arch"},
      {{"model.arch=llama", "model.n_kv_heads=3", "model.doc_mask=false"}, "model.n_kv_heads"},
      {{"model.arch=llama", "model.n_kv_heads=8", "model.doc_mask=false"}, "model.n_kv_heads"},
      {{"model.arch=llama", "model.d_model=36", "model.doc_mask=false"}, "model.n_heads"},  // hs 9
      {{"model.arch=llama"}, "model.doc_mask"},     // synthetic data has no document starts
      {{"model.doc_mask=true"}, "model.doc_mask"},  // gpt2 too: synthetic data has no starts
      {{"model.bias=maybe"}, "model.bias"},
      {{"model.arch=llama", "model.rope_theta=0", "model.doc_mask=false"}, "model.rope_theta"},
      {{"model.norm_eps=1e-6"}, "model.norm_eps"},  // gpt2's LayerNorm eps is fixed
  };
  for (const auto& b : bads) {
    auto c = load_train_config("", b.sets);
    ASSERT_TRUE(c.is_ok()) << b.key;
    auto t = parse_train_config(*c);
    ASSERT_FALSE(t.is_ok()) << b.key;
    EXPECT_EQ(t.status().code(), StatusCode::kConfig) << b.key;
    EXPECT_EQ(t.status().key(), b.key) << t.status().to_string();
  }
}

// The config a default run prints to RUN/config.yaml, byte for byte: train_defaults.yaml is the
// file a run wrote before the schema became one table per section (main f1000cf), so the
// tables print the same keys, order and default values as the hand-written schema did.
TEST(TrainConfig, PrintedDefaultsAreUnchanged) {
  std::ifstream in(std::string(test::source_dir()) + "/tests/engine/config/train_defaults.yaml");
  ASSERT_TRUE(in.good());
  std::stringstream golden;
  golden << in.rdbuf();
  auto cfg = load_train_config("", {});
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->dump(), golden.str());
}

// One table per section: the defaults the schema prints are the struct's, so parsing the
// printed defaults gives back a default-constructed section (the auto keys resolved as gpt2's).
TEST(TrainConfig, SchemaDefaultsAreTheStructDefaults) {
  auto cfg = load_train_config("", {});
  ASSERT_TRUE(cfg.is_ok());
  auto tc = parse_train_config(*cfg);
  ASSERT_TRUE(tc.is_ok()) << tc.status().to_string();
  const TrainConfig d;
  EXPECT_EQ(tc->model.d_model, d.model.d_model);
  EXPECT_EQ(tc->model.norm_eps, d.model.norm_eps);
  EXPECT_EQ(tc->model.init_std, d.model.init_std);
  EXPECT_EQ(tc->model.tie_embeddings, d.model.tie_embeddings);
  EXPECT_EQ(tc->model.bias, d.model.bias);
  EXPECT_EQ(tc->model.doc_mask, d.model.doc_mask);
  EXPECT_EQ(tc->optimizer.lr, d.optimizer.lr);
  EXPECT_EQ(tc->optimizer.beta1, d.optimizer.beta1);
  EXPECT_EQ(tc->optimizer.beta2, d.optimizer.beta2);
  EXPECT_EQ(tc->optimizer.eps, d.optimizer.eps);
  EXPECT_EQ(tc->optimizer.weight_decay, d.optimizer.weight_decay);
  EXPECT_EQ(tc->parallel.collective_timeout_s, d.parallel.collective_timeout_s);
  EXPECT_EQ(tc->parallel.pp_schedule, d.parallel.pp_schedule);
  EXPECT_EQ(tc->schedule.decay_shape, d.schedule.decay_shape);
  EXPECT_EQ(tc->data.prefetch_depth, d.data.prefetch_depth);
  EXPECT_EQ(tc->memory.margin, d.memory.margin);
  EXPECT_FALSE(tc->memory.budget.has_value());
  EXPECT_EQ(tc->stability.spike.window, d.stability.spike.window);
  EXPECT_EQ(tc->stability.spike.action, d.stability.spike.action);
  EXPECT_EQ(tc->stability.lr_burst_factor, d.stability.lr_burst_factor);
  EXPECT_EQ(tc->mixing.doremi_smoothing, d.mixing.doremi_smoothing);
  EXPECT_EQ(tc->mixing.odm_reward_smoothing, d.mixing.odm_reward_smoothing);
  EXPECT_EQ(tc->eval.sequences_per_domain, d.eval.sequences_per_domain);
  EXPECT_EQ(tc->run.seed, d.run.seed);
  EXPECT_EQ(tc->run.dir, d.run.dir);
  EXPECT_EQ(tc->device, d.device);
  EXPECT_EQ(tc->activation_checkpointing, d.activation_checkpointing);
}

// A section parses on its own and names its keys; a key that depends on another section is
// checked where both are known (parse_train_config).
TEST(TrainConfig, SectionsParseAlone) {
  auto cfg = load_train_config("", {"optimizer.betas=[0.8, 0.9]", "parallel.pp=2"});
  ASSERT_TRUE(cfg.is_ok());
  auto o = parse_optimizer_config(*cfg);
  ASSERT_TRUE(o.is_ok()) << o.status().to_string();
  EXPECT_FLOAT_EQ(o->beta1, 0.8f);
  auto p = parse_parallel_config(*cfg);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->pp, 2);
  ModelConfig one_block;
  one_block.n_layers = 1;
  const Status fits = check_parallel_fits(*p, one_block);
  EXPECT_EQ(fits.key(), "parallel.pp") << fits.to_string();
  auto bad = load_train_config("", {"stability.spike.window=1"});
  ASSERT_TRUE(bad.is_ok());
  auto st = parse_stability_config(*bad);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.status().key(), "stability.spike.window");
}

}  // namespace
}  // namespace kiln::engine
