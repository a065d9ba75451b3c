// engine/checkpoint/checkpoint.h with pipeline parallelism: every stage writes the units it owns
// (the last stage's copy of tied embeddings excepted) in files named after the stage, meta.json
// records the stages, and a checkpoint of any PP x TP x DP layout loads into any other - a stage's
// store, a whole model, a ZeRO rank's ranges - with exact values, each reader opening only the
// files of the stages that hold its units. `kiln checkpoint consolidate` and `kiln checkpoint
// export --format hf` of a pipelined checkpoint write the same bytes as of the same weights
// written without pipelining.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/checkpoint/checkpoint.h"
#include "engine/model/params.h"
#include "engine/parallel/layout_plan.h"
#include "tests/engine/engine_test_util.h"
#include "tests/kiln_cli.h"

namespace kiln::engine {
namespace {

namespace fs = std::filesystem;

// GPT-2 with tied embeddings: 6 heads, vocabulary 96, 4 blocks (splits over 1, 2 and 3 TP ranks
// and 1 to 4 stages).
ModelConfig gpt2() {
  ModelConfig m;
  m.vocab_size = 96;
  m.d_model = 24;
  m.n_layers = 4;
  m.n_heads = 6;
  m.seq_len = 8;
  return m;
}

// Llama with its own LM head (untied), grouped-query heads, no biases: splits over 1 and 2.
ModelConfig llama() {
  ModelConfig m = gpt2();
  m.arch = Arch::kLlama;
  m.n_kv_heads = 2;
  m.ffn_hidden = 48;
  m.tie_embeddings = false;
  m.bias = false;
  return m;
}

// The whole model's states: every element distinct (engine_test_util.h).
void fill_whole(ParamStore& whole) { test::fill_distinct_states(whole, 4321); }

struct Layout {
  int pp = 1, tp = 1, dp = 1;   // dp > 1: ZeRO-1 partitions (every data-parallel rank writes)
  std::vector<int64_t> layers;  // blocks per stage; empty: pp_stage_split's balance
};

std::string describe(const Layout& l) {
  std::string s =
      "pp " + std::to_string(l.pp) + " tp " + std::to_string(l.tp) + " dp " + std::to_string(l.dp);
  if (!l.layers.empty()) {
    s += " [";
    for (int64_t n : l.layers) s += std::to_string(n) + " ";
    s.back() = ']';
  }
  return s;
}

PpStage stage_of(const ModelConfig& m, const Layout& l, int s) {
  return pp_stage(m, s, l.pp, l.layers);
}

// Stage s / TP rank t's store holding the whole model's values in its units (and, on the last
// stage of a tied model, a copy of the embeddings that must never be what is written: poisoned).
std::unique_ptr<ParamStore> stage_store(const ParamStore& whole, const Layout& l, int s, int t) {
  auto st = std::make_unique<ParamStore>(whole.model(), Precision::kFp32, false, nullptr,
                                         TpShard{t, l.tp}, true, stage_of(whole.model(), l, s));
  for (size_t i = 0; i < st->tensors().size(); ++i) {
    const ParamTensor& pt = st->tensors()[i];
    if (!st->holds(pt.unit)) continue;
    const int ti = static_cast<int>(i);
    copy_to_shard(pt, {t, l.tp}, whole.master(ti), st->master(ti));
    copy_to_shard(pt, {t, l.tp}, whole.exp_avg(ti), st->exp_avg(ti));
    copy_to_shard(pt, {t, l.tp}, whole.exp_avg_sq(ti), st->exp_avg_sq(ti));
    if (pt.unit == 0 && !st->pp_stage().first()) {  // the tied head's copy on the last stage
      for (float* p : {st->master(ti), st->exp_avg(ti), st->exp_avg_sq(ti)})
        std::fill(p, p + pt.numel, 1e30f);
    }
  }
  return st;
}

// Partition r of dp of every unit of the store (ZeRO-1: the unit's flat elements [r*S, r*S+S)),
// all units - owned_views() then keeps those the stage writes, as the trainer does with a ZeRO
// rank's shards.
std::vector<TensorView> zero_views(const ParamStore& st, int r, int dp,
                                   std::deque<std::vector<float>>* keep) {
  std::vector<TensorView> views;
  for (size_t i = 0; i < st.units().size(); ++i) {
    if (!st.holds(static_cast<int>(i))) continue;  // a stage's ZeRO shards cover its units only
    const ParamUnit& u = st.units()[i];
    const size_t S = shard_numel(u.numel, dp), begin = S * static_cast<size_t>(r);
    for (auto [suffix, buf] : {std::pair{".master", &u.master}, std::pair{".exp_avg", &u.m},
                               std::pair{".exp_avg_sq", &u.v}}) {
      keep->emplace_back(S, 0.0f);
      for (size_t k = begin; k < std::min(begin + S, u.numel); ++k)
        keep->back()[k - begin] = buf->data()[k];
      views.push_back(
          {u.name + suffix, "F32", {static_cast<int64_t>(S)}, keep->back().data(), S * 4});
    }
  }
  return views;
}

// A checkpoint of `whole` at `step` written in layout l under run/, as the trainer's ranks write
// it: every (stage, TP rank, partition) its own file, rank 0 finishing with every checksum.
void write_layout(const std::string& run, const ParamStore& whole, const Layout& l,
                  int64_t step = 3) {
  SCOPED_TRACE("writing " + describe(l));
  TrainerState state;
  state.step = step;
  state.seed = 7;
  if (l.pp == 1 && l.tp == 1 && l.dp == 1) {
    ASSERT_TRUE(save_checkpoint(run, whole, state, "x: 1\n", 0).is_ok());
    return;
  }
  auto tmp = begin_checkpoint(run, step);
  ASSERT_TRUE(tmp.is_ok()) << tmp.status().to_string();
  std::vector<uint64_t> hashes;
  std::unique_ptr<ParamStore> root;
  for (int s = 0; s < l.pp; ++s) {
    for (int t = 0; t < l.tp; ++t) {
      auto st = stage_store(whole, l, s, t);
      for (int r = 0; r < l.dp; ++r) {
        std::deque<std::vector<float>> keep;
        const std::vector<TensorView> views =
            l.dp > 1 ? owned_views(*st, zero_views(*st, r, l.dp, &keep))
                     : unit_partition(*st, &keep);
        auto h = write_checkpoint_partition(*tmp, r, l.dp, views, t, l.tp, s, l.pp);
        ASSERT_TRUE(h.is_ok()) << h.status().to_string();
        hashes.push_back(*h);
      }
      if (s == 0 && t == 0) root = std::move(st);
    }
  }
  CheckpointLayout lay;
  lay.world = l.pp * l.tp * l.dp;
  lay.dp = l.dp;
  lay.tp = lay.tp_partitions = l.tp;
  lay.zero_stage = l.dp > 1 ? 1 : 0;
  lay.partitions = l.dp;
  lay.pp = l.pp;
  if (l.pp > 1) lay.pp_bounds = pp_stage_split(whole.model(), l.pp, l.layers);
  const Status done = finish_checkpoint(run, *tmp, *root, state, "x: 1\n", 0, lay, hashes);
  ASSERT_TRUE(done.is_ok()) << done.to_string();
}

std::string fresh_dir(const std::string& name) { return test::temp_dir("ppck", name); }

// Loads the checkpoint into stage s / TP rank t of layout `to` (a whole store when to is 1 x 1):
// every held unit's tensors are the whole model's slices bit for bit, only `sources` stages'
// files were read.
void check_load(const std::string& run, const ParamStore& whole, const Layout& to, int s, int t,
                int64_t sources = -1) {
  SCOPED_TRACE("into stage " + std::to_string(s) + " TP rank " + std::to_string(t) + " of " +
               describe(to));
  auto dir = latest_checkpoint(run);
  ASSERT_TRUE(dir.is_ok()) << dir.status().to_string();
  ParamStore mine(whole.model(), Precision::kFp32, false, nullptr, TpShard{t, to.tp}, true,
                  stage_of(whole.model(), to, s));
  TrainerState st;
  LoadStats stats;
  const Status loaded = load_checkpoint(*dir, &mine, &st, nullptr, &stats);
  ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
  EXPECT_EQ(st.step, 3);
  if (sources >= 0) EXPECT_EQ(stats.pp_sources, sources) << "source stages read";
  std::vector<float> want;
  size_t compared = 0;
  for (size_t i = 0; i < whole.tensors().size(); ++i) {
    const ParamTensor& pt = mine.tensors()[i];
    if (!mine.holds(pt.unit)) continue;
    const int ti = static_cast<int>(i);
    want.assign(pt.numel, -1.0f);
    for (auto [w, got, name] :
         {std::tuple{whole.master(ti), mine.master(ti), "master"},
          std::tuple{whole.exp_avg(ti), mine.exp_avg(ti), "exp_avg"},
          std::tuple{whole.exp_avg_sq(ti), mine.exp_avg_sq(ti), "exp_avg_sq"}}) {
      copy_to_shard(pt, {t, to.tp}, w, want.data());
      for (size_t k = 0; k < pt.numel; ++k)
        ASSERT_EQ(got[k], want[k]) << pt.name << "." << name << "[" << k << "]";
    }
    ++compared;
  }
  EXPECT_GT(compared, 0u);
}

// Every rank of layout `to` loads the checkpoint exactly.
void check_all(const std::string& run, const ParamStore& whole, const Layout& to) {
  for (int s = 0; s < to.pp; ++s)
    for (int t = 0; t < to.tp; ++t) check_load(run, whole, to, s, t);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
}

TEST(PpCheckpoint, StagesWriteTheirUnitsInFilesNamedAfterTheStage) {
  const ModelConfig m = gpt2();
  ParamStore whole(m, Precision::kFp32);
  fill_whole(whole);
  const std::string run = fresh_dir("layout");
  const Layout l{2, 1, 2, {1, 3}};
  write_layout(run, whole, l);
  auto dir = latest_checkpoint(run);
  ASSERT_TRUE(dir.is_ok());
  const nlohmann::json meta = read_json(*dir + "/meta.json");
  const nlohmann::json state = read_json(*dir + "/state.json");
  EXPECT_EQ(meta["format"], "kiln-checkpoint/2.1");
  EXPECT_EQ(state["format"], "kiln-checkpoint/2.1");
  EXPECT_EQ(meta["pp"], 2);
  ASSERT_EQ(meta["pp_stages"].size(), 2u);
  EXPECT_EQ(meta["pp_stages"][0]["blocks"], nlohmann::json({0, 1}));
  EXPECT_EQ(meta["pp_stages"][1]["blocks"], nlohmann::json({1, 4}));
  EXPECT_EQ(meta["pp_stages"][0]["units"], nlohmann::json({"embed", "blocks.0"}));
  EXPECT_EQ(meta["pp_stages"][1]["units"],
            nlohmann::json({"blocks.1", "blocks.2", "blocks.3", "final"}));
  const std::vector<std::string> files = {
      "shard-pp00000-of-00002-tp00000-of-00001-dp00000-of-00002.safetensors",
      "shard-pp00000-of-00002-tp00000-of-00001-dp00001-of-00002.safetensors",
      "shard-pp00001-of-00002-tp00000-of-00001-dp00000-of-00002.safetensors",
      "shard-pp00001-of-00002-tp00000-of-00001-dp00001-of-00002.safetensors"};
  EXPECT_EQ(meta["files"], nlohmann::json(files));
  EXPECT_EQ(meta["pp_stages"][1]["files"], nlohmann::json({files[2], files[3]}));
  std::set<std::string> on_disk, listed;
  for (const auto& e : fs::directory_iterator(*dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("shard-", 0) == 0) on_disk.insert(n);
  }
  for (auto it = state["files"].begin(); it != state["files"].end(); ++it) listed.insert(it.key());
  EXPECT_EQ(on_disk, std::set<std::string>(files.begin(), files.end()));
  EXPECT_EQ(listed, on_disk) << "state.json holds every stage's checksums";
  for (const auto& u : meta["units"]) {
    const std::string n = u["name"];
    EXPECT_EQ(u["stage"], n == "embed" || n == "blocks.0" ? 0 : 1) << n;
  }
  // The last stage holds a (poisoned) copy of the tied embeddings: not written.
  auto last = SafetensorsFile::read_header(*dir + "/" + files[2]);
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  const std::vector<std::string> want_last = {
      "blocks.1.exp_avg",    "blocks.1.exp_avg_sq", "blocks.1.master",  "blocks.2.exp_avg",
      "blocks.2.exp_avg_sq", "blocks.2.master",     "blocks.3.exp_avg", "blocks.3.exp_avg_sq",
      "blocks.3.master",     "final.exp_avg",       "final.exp_avg_sq", "final.master"};
  EXPECT_EQ(last->names(), want_last);
  EXPECT_EQ(last->metadata().at("pp_stage"), "1");
  auto first = SafetensorsFile::read_header(*dir + "/" + files[1]);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(first->names(),
            std::vector<std::string>({"blocks.0.exp_avg", "blocks.0.exp_avg_sq", "blocks.0.master",
                                      "embed.exp_avg", "embed.exp_avg_sq", "embed.master"}));
  // Without pipelining: the format and the names of before.
  const std::string flat = fresh_dir("flat");
  write_layout(flat, whole, Layout{1, 2, 2, {}});
  auto fdir = latest_checkpoint(flat);
  ASSERT_TRUE(fdir.is_ok());
  const nlohmann::json fmeta = read_json(*fdir + "/meta.json");
  EXPECT_EQ(fmeta["format"], "kiln-checkpoint/2");
  EXPECT_FALSE(fmeta.contains("pp"));
  EXPECT_FALSE(fmeta.contains("pp_stages"));
  EXPECT_TRUE(fs::exists(*fdir + "/shard-tp00001-of-00002-dp00001-of-00002.safetensors"));
  fs::remove_all(run);
  fs::remove_all(flat);
}

// PP=2 -> one process, PP=4, PP=3 x TP=2 (another TP size at the same time) and another PP=2
// split; one process -> PP=2 and PP=4. Tied embeddings: the last stage's copy comes from the
// first stage's file.
TEST(PpCheckpoint, Gpt2AnyPipelineSplitIntoAnyOther) {
  const ModelConfig m = gpt2();
  ParamStore whole(m, Precision::kFp32);
  fill_whole(whole);
  const std::string pp2 = fresh_dir("gpt2_pp2");
  write_layout(pp2, whole, Layout{2, 1, 1, {}});
  check_all(pp2, whole, Layout{1, 1, 1, {}});
  check_all(pp2, whole, Layout{4, 1, 1, {}});
  check_all(pp2, whole, Layout{3, 2, 1, {}});
  check_all(pp2, whole, Layout{2, 3, 1, {3, 1}});
  const std::string one = fresh_dir("gpt2_one");
  write_layout(one, whole, Layout{1, 1, 1, {}});
  check_all(one, whole, Layout{2, 1, 1, {}});
  check_all(one, whole, Layout{4, 1, 1, {}});
  fs::remove_all(pp2);
  fs::remove_all(one);
}

// PP=2 x TP=2 x ZeRO-1 over 2 -> one process, PP=4, PP=1 x TP=3, PP=2 x TP=1 (another split);
// PP=4 x TP=3 x ZeRO-1 over 3 -> PP=2 x TP=2 and one process.
TEST(PpCheckpoint, ThreeDimensionalLayoutsReshardIntoEachOther) {
  const ModelConfig m = gpt2();
  ParamStore whole(m, Precision::kFp32);
  fill_whole(whole);
  const std::string a = fresh_dir("3d_a");
  write_layout(a, whole, Layout{2, 2, 2, {}});
  check_all(a, whole, Layout{1, 1, 1, {}});
  check_all(a, whole, Layout{4, 1, 1, {}});
  check_all(a, whole, Layout{1, 3, 1, {}});
  check_all(a, whole, Layout{2, 1, 1, {1, 3}});
  const std::string b = fresh_dir("3d_b");
  write_layout(b, whole, Layout{4, 3, 3, {}});
  check_all(b, whole, Layout{2, 2, 1, {}});
  check_all(b, whole, Layout{1, 1, 1, {}});
  fs::remove_all(a);
  fs::remove_all(b);
}

// Llama (untied head, grouped-query heads): PP=2 x TP=2 -> PP=4, one process, PP=3 x TP=1.
TEST(PpCheckpoint, LlamaUntiedHead) {
  const ModelConfig m = llama();
  ParamStore whole(m, Precision::kFp32);
  fill_whole(whole);
  const std::string run = fresh_dir("llama");
  write_layout(run, whole, Layout{2, 2, 2, {3, 1}});
  check_all(run, whole, Layout{4, 1, 1, {}});
  check_all(run, whole, Layout{1, 1, 1, {}});
  check_all(run, whole, Layout{3, 2, 1, {}});
  fs::remove_all(run);
}

// A stage reads only the files of the stages that wrote its units: a damaged first-stage file
// is never noticed by a last stage of an untied model (it is named by every reader that needs
// it); with tied embeddings the last stage reads the first stage's embeddings.
TEST(PpCheckpoint, EachStageReadsOnlyTheStagesHoldingItsUnits) {
  ParamStore whole(llama(), Precision::kFp32);
  fill_whole(whole);
  const std::string run = fresh_dir("damage");
  const Layout l{2, 1, 1, {}};
  write_layout(run, whole, l);
  check_load(run, whole, l, 0, 0, 1);
  check_load(run, whole, l, 1, 0, 1);
  check_load(run, whole, Layout{4, 1, 1, {}}, 3, 0, 1);
  check_load(run, whole, Layout{1, 1, 1, {}}, 0, 0, 2);
  auto dir = latest_checkpoint(run);
  ASSERT_TRUE(dir.is_ok());
  const std::string first = *dir + "/" + partition_file_name(0, 1, 0, 1, 0, 2);
  {
    std::FILE* f = std::fopen(first.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, -4, SEEK_END);
    std::fputc(0x55, f);
    std::fclose(f);
  }
  check_load(run, whole, l, 1, 0, 1);  // never opens stage 0's file
  ParamStore stage0(whole.model(), Precision::kFp32, false, nullptr, {}, true,
                    stage_of(whole.model(), l, 0));
  TrainerState st;
  const Status bad = load_checkpoint(*dir, &stage0, &st);
  EXPECT_EQ(bad.code(), StatusCode::kData);
  EXPECT_NE(bad.to_string().find("checksum mismatch"), std::string::npos) << bad.to_string();
  EXPECT_EQ(bad.file(), first);
  fs::remove_all(run);

  ParamStore tied(gpt2(), Precision::kFp32);
  fill_whole(tied);
  const std::string trun = fresh_dir("tied");
  write_layout(trun, tied, l);
  check_load(trun, tied, l, 1, 0, 2);  // the tied head from the first stage's file
  fs::remove_all(trun);
}

// A ZeRO rank's ranges (CheckpointReader::read into a layout-only stage store): any range of any
// unit, across partition boundaries, from a PP=2 x ZeRO-1 checkpoint of 3 partitions.
TEST(PpCheckpoint, ReaderServesAnyRangeOfAnyUnit) {
  ParamStore whole(gpt2(), Precision::kFp32);
  fill_whole(whole);
  const std::string run = fresh_dir("ranges");
  write_layout(run, whole, Layout{2, 1, 3, {}});
  auto dir = latest_checkpoint(run);
  ASSERT_TRUE(dir.is_ok());
  const Layout to{3, 1, 1, {}};
  for (int s = 0; s < to.pp; ++s) {
    const ParamStore layout(whole.model(), Precision::kFp32, false, nullptr, {}, false,
                            stage_of(whole.model(), to, s));
    TrainerState st;
    auto reader = CheckpointReader::open(*dir, layout, &st);
    ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
    std::vector<float> got;
    for (size_t ui = 0; ui < whole.units().size(); ++ui) {
      if (!layout.holds(static_cast<int>(ui))) continue;
      const ParamUnit& w = whole.units()[ui];
      for (auto [f, buf] :
           {std::pair{ParamField::kMaster, &w.master}, std::pair{ParamField::kExpAvg, &w.m},
            std::pair{ParamField::kExpAvgSq, &w.v}}) {
        const size_t n = w.numel;
        for (auto [begin, count] :
             {std::pair<size_t, size_t>{0, n}, {n / 3 - 7, n / 3 + 14}, {n - 1, 1}}) {
          got.assign(count, -1.0f);
          ASSERT_TRUE((*reader)->read(static_cast<int>(ui), f, begin, count, got.data()).is_ok());
          for (size_t k = 0; k < count; ++k)
            ASSERT_EQ(got[k], buf->data()[begin + k]) << w.name << "[" << begin + k << "]";
        }
      }
    }
  }
  fs::remove_all(run);
}

// A hand-edited meta.json whose stages do not cover the blocks, or whose unit names another
// stage than the blocks say, is refused naming meta.json before anything is read.
TEST(PpCheckpoint, ForeignStageLayoutIsRefusedNamingMetaJson) {
  ParamStore whole(gpt2(), Precision::kFp32);
  fill_whole(whole);
  const std::string run = fresh_dir("foreign");
  write_layout(run, whole, Layout{2, 1, 1, {}});
  auto dir = latest_checkpoint(run);
  ASSERT_TRUE(dir.is_ok());
  const std::string meta_path = *dir + "/meta.json";
  const nlohmann::json good = read_json(meta_path);
  auto load_with = [&](const nlohmann::json& meta) {
    std::ofstream(meta_path, std::ios::trunc) << meta.dump();
    ParamStore mine(whole.model(), Precision::kFp32);
    TrainerState st;
    return load_checkpoint(*dir, &mine, &st);
  };
  ASSERT_TRUE(load_with(good).is_ok());
  nlohmann::json gap = good;
  gap["pp_stages"][1]["blocks"][0] = 3;
  Status st = load_with(gap);
  EXPECT_EQ(st.code(), StatusCode::kData);
  EXPECT_EQ(st.file(), meta_path);
  EXPECT_NE(st.message().find("following the stage before"), std::string::npos) << st.to_string();
  nlohmann::json shortened = good;
  shortened["pp_stages"][1]["blocks"][1] = 3;
  st = load_with(shortened);
  EXPECT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.message().find("cover blocks [0, 3)"), std::string::npos) << st.to_string();
  nlohmann::json one_stage = good;
  one_stage["pp_stages"].erase(1);
  st = load_with(one_stage);
  EXPECT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.message().find("pp_stages must list pp"), std::string::npos) << st.to_string();
  nlohmann::json moved = good;
  moved["units"][1]["stage"] = 1;  // blocks.0 on stage 1
  st = load_with(moved);
  EXPECT_EQ(st.code(), StatusCode::kData);
  EXPECT_EQ(st.file(), meta_path);
  EXPECT_NE(st.message().find("pp_stages put blocks.0 on stage 0"), std::string::npos)
      << st.to_string();
  ASSERT_TRUE(load_with(good).is_ok());
  fs::remove_all(run);
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every file under dir (relative path -> bytes).
std::map<std::string, std::string> tree_bytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file())
      out[fs::relative(e.path(), dir).string()] = file_bytes(e.path().string());
  }
  return out;
}

// Through the CLI: consolidate and export a PP=2 x TP=2 x ZeRO-1 checkpoint and the same weights
// written by one process, in the same directory one after the other (the consolidated file
// records its source path): identical bytes.
TEST(PpCheckpoint, ConsolidateAndExportOfAPipelinedCheckpointAreTheUnpipelinedOnes) {
  for (const ModelConfig& m : {gpt2(), llama()}) {
    SCOPED_TRACE(m.llama() ? "llama" : "gpt2");
    ParamStore whole(m, Precision::kFp32);
    fill_whole(whole);
    const std::string run = fresh_dir("cli");
    const std::string out = fresh_dir("cli_out");
    fs::create_directories(out);
    struct Outputs {
      std::string consolidated;
      std::map<std::string, std::string> hf;
    };
    auto outputs = [&](const Layout& l) {
      fs::remove_all(run);
      write_layout(run, whole, l);
      const std::string step = run + "/checkpoints/step-00000003";
      const std::string cons = out + "/cons.safetensors", hf = out + "/hf";
      auto c = testing_cli::run_kiln("checkpoint consolidate " + step + " -o " + cons);
      EXPECT_EQ(c.exit_code, 0) << describe(l) << ": " << c.output;
      auto e = testing_cli::run_kiln("checkpoint export " + step + " --format hf -o " + hf +
                                     " --overwrite");
      EXPECT_EQ(e.exit_code, 0) << describe(l) << ": " << e.output;
      Outputs r{file_bytes(cons), tree_bytes(hf)};
      fs::remove(cons);
      fs::remove_all(hf);
      return r;
    };
    const Outputs flat = outputs(Layout{1, 1, 1, {}});
    const Outputs piped = outputs(Layout{2, 2, 2, {}});
    const Outputs four = outputs(Layout{4, 1, 1, {}});
    ASSERT_GT(flat.consolidated.size(), 1000u);
    EXPECT_TRUE(flat.consolidated == piped.consolidated) << "PP=2 x TP=2 x ZeRO-1 consolidated";
    EXPECT_TRUE(flat.consolidated == four.consolidated) << "PP=4 consolidated";
    ASSERT_TRUE(flat.hf.count("model.safetensors")) << "no model.safetensors in the export";
    EXPECT_TRUE(flat.hf == piped.hf) << "PP=2 x TP=2 x ZeRO-1 export";
    EXPECT_TRUE(flat.hf == four.hf) << "PP=4 export";
    fs::remove_all(run);
    fs::remove_all(out);
  }
}

}  // namespace
}  // namespace kiln::engine
