// Hostile inputs on the surfaces of issue 39 (HF import, `kiln generate` / `kiln eval`, pipeline
// keys, `kiln plan`), through the CLI as a user meets them: each case gets its exit code (2 for
// a config or usage error, 3 for bad data), a message naming the problem, nothing written, and
// a run that ends in bounded time (ctest's timeout; `timeout` where a hang was the bug) and
// memory (peak RSS measured with /usr/bin/time where memory was the bug).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/host_memory.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/infer/gpt_infer.h"
#include "engine/model/params.h"
#include "tests/engine/engine_test_util.h"
#include "tests/kiln_cli.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using engine::ModelConfig;
using testing_cli::run_kiln;

ModelConfig gpt2_model() {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.seq_len = 16;
  return m;
}

ModelConfig llama_model() {
  ModelConfig m = gpt2_model();
  m.arch = engine::Arch::kLlama;
  m.n_kv_heads = 2;
  m.ffn_hidden = 48;
  m.norm_eps = 1e-6f;
  return m;
}

class HostileInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = engine::test::temp_dir("hostile", info->name());
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A Hugging Face directory exported by `kiln checkpoint export` from a checkpoint of `m`.
  std::string hf_dir(const ModelConfig& m, const std::string& name = "hf") {
    engine::ParamStore p(m, engine::Precision::kFp32);
    p.init(7);
    engine::TrainerState st;
    st.step = 1;
    const std::string run = root_ + "/run-" + name;
    EXPECT_TRUE(engine::save_checkpoint(run, p, st, "# test\n", 0).is_ok());
    const std::string out = root_ + "/" + name;
    auto r = run_kiln("checkpoint export " + run + "/checkpoints/" +
                      engine::checkpoint_dir_name(1) + " --format hf -o " + out);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }
  // A byte-level BPE tokenizer of 300 ids trained on the GPT-2 sample text (`kiln tokenizer
  // train`).
  std::string tokenizer() {
    const std::string out = root_ + "/tok.json";
    auto r = run_kiln("tokenizer train --vocab-size 300 --input " +
                      std::string(kiln::test::source_dir()) +
                      "/tests/data/gpt2/sample.txt --output " + out);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }
  // The names of every file under the test's folder, to check a refused command wrote nothing.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(root_)) out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string root_;
};

// model.safetensors rewritten with fn applied to its header JSON (the data section as it was).
void edit_header(const std::string& file, const std::function<void(nlohmann::json&)>& fn) {
  auto bytes = read_file(file);
  ASSERT_TRUE(bytes.is_ok());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>((*bytes)[i])) << (8 * i);
  nlohmann::json h = nlohmann::json::parse(bytes->substr(8, n));
  fn(h);
  std::string head = h.dump();
  while (head.size() % 8) head.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>(static_cast<uint64_t>(head.size()) >> (8 * i));
  ASSERT_TRUE(write_file_atomic(file, out + head + bytes->substr(8 + n)).is_ok());
}

void edit_json(const std::string& file, const std::function<void(nlohmann::json&)>& fn) {
  auto j = nlohmann::json::parse(*read_file(file));
  fn(j);
  ASSERT_TRUE(write_file_atomic(file, j.dump()).is_ok());
}

std::string gen_cmd(const std::string& dir, const std::string& extra = "",
                    const std::string& max_tokens = "2") {
  return "generate " + dir + " --prompt-ids '1 2 3' --max-tokens " + max_tokens +
         " --temperature 0 --ids " + extra;
}

// The peak RSS /usr/bin/time -f %M wrote (its last line: a failed command's status comes first).
long peak_kib(const std::string& file) {
  std::istringstream in(*read_file(file));
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return std::stol(last);
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// ---- HF import ---------------------------------------------------------------------------------

TEST_F(HostileInputs, HfU8LmHeadIsRefusedNamingTensorAndDtype) {
  // GPT-2's tied head stored beside wte: as U8 it was read as F16 (twice the bytes it holds).
  const std::string dir = hf_dir(gpt2_model());
  auto st = engine::SafetensorsFile::read(dir + "/model.safetensors");
  ASSERT_TRUE(st.is_ok());
  std::vector<engine::TensorView> views;
  for (const std::string& n : st->names()) views.push_back(*st->view(n));
  const engine::TensorView wte = *st->view("transformer.wte.weight");
  std::vector<uint8_t> head(wte.bytes / 4, 1);
  views.push_back({"lm_head.weight", "U8", wte.shape, head.data(), head.size()});
  ASSERT_TRUE(engine::write_safetensors(dir + "/model.safetensors", views).is_ok());
  const auto before = files();
  auto r = run_kiln(gen_cmd(dir));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(has(r.err, "lm_head.weight") && has(r.err, "U8")) << r.err;
  EXPECT_EQ(files(), before);
}

TEST_F(HostileInputs, HfUnreadableDtypeOfAModelTensorIsRefused) {
  const std::string dir = hf_dir(gpt2_model());
  // wte's 4-byte floats relabelled I32: same size, not a float.
  edit_header(dir + "/model.safetensors",
              [](nlohmann::json& h) { h["transformer.wte.weight"]["dtype"] = "I32"; });
  auto r = run_kiln(gen_cmd(dir));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(has(r.err, "transformer.wte.weight") && has(r.err, "I32")) << r.err;
}

TEST_F(HostileInputs, SafetensorsOverlappingOffsetsAreRefused) {
  const std::string dir = hf_dir(gpt2_model());
  // ln_f.weight and ln_f.bias are the same size: point the bias at the weight's bytes.
  std::string name;
  edit_header(dir + "/model.safetensors", [&](nlohmann::json& h) {
    h["transformer.ln_f.bias"]["data_offsets"] = h["transformer.ln_f.weight"]["data_offsets"];
  });
  auto r = run_kiln(gen_cmd(dir));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(has(r.err, "overlap")) << r.err;
  EXPECT_TRUE(has(r.err, "model.safetensors")) << r.err;
}

TEST_F(HostileInputs, SafetensorsGapsAndTrailingBytesAreRefused) {
  const std::string dir = hf_dir(gpt2_model());
  const std::string file = dir + "/model.safetensors";
  const std::string good = *read_file(file);
  // Bytes after the last tensor that no tensor accounts for.
  ASSERT_TRUE(write_file_atomic(file, good + std::string(16, '\0')).is_ok());
  auto r = run_kiln(gen_cmd(dir));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(has(r.err, "data section")) << r.err;
  // A tensor moved past a gap (the file grown so that it still lies inside).
  ASSERT_TRUE(write_file_atomic(file, good + std::string(16, '\0')).is_ok());
  edit_header(file, [](nlohmann::json& h) {
    auto& o = h["transformer.ln_f.bias"]["data_offsets"];
    uint64_t b = o[0], e = o[1];
    uint64_t last = 0;
    for (auto it = h.begin(); it != h.end(); ++it)
      if (it.key() != "__metadata__")
        last = std::max<uint64_t>(last, it.value()["data_offsets"][1]);
    (void)b;
    o = {last + 16 - (e - b), last + 16};
  });
  r = run_kiln(gen_cmd(dir));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(has(r.err, "to no tensor") || has(r.err, "overlap")) << r.err;
}

TEST_F(HostileInputs, IndexNamingAShardWithoutTheTensorIsRefused) {
  const std::string dir = hf_dir(gpt2_model());
  // An index that puts every tensor in model.safetensors but one in a shard lacking it.
  auto st = engine::SafetensorsFile::read(dir + "/model.safetensors");
  ASSERT_TRUE(st.is_ok());
  nlohmann::json map = nlohmann::json::object();
  for (const std::string& n : st->names()) map[n] = "model.safetensors";
  std::vector<engine::TensorView> one = {*st->view("transformer.ln_f.weight")};
  ASSERT_TRUE(engine::write_safetensors(dir + "/other.safetensors", one).is_ok());
  map["transformer.wpe.weight"] = "other.safetensors";
  ASSERT_TRUE(write_file_atomic(
                  dir + "/model.safetensors.index.json",
                  nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump())
                  .is_ok());
  auto r = run_kiln(gen_cmd(dir));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(has(r.err, "transformer.wpe.weight") && has(r.err, "other.safetensors") &&
              has(r.err, "index.json"))
      << r.err;
}

TEST_F(HostileInputs, ConfigAndIndexThatNeverEndAreRefusedInBoundedMemory) {
  const std::string dir = hf_dir(gpt2_model());
  // /dev/zero as config.json, then as the index: an error naming the file and the limit, not
  // all of memory.
  for (const char* name : {"config.json", "model.safetensors.index.json"}) {
    const std::string hf = root_ + "/zero-" + name;
    fs::copy(dir, hf, fs::copy_options::recursive);
    fs::remove(hf + "/" + name);
    fs::create_symlink("/dev/zero", hf + "/" + name);
    const std::string rss = root_ + "/rss.txt";
    auto r = run_kiln(gen_cmd(hf), "/usr/bin/time -f %M -o " + rss);
    EXPECT_EQ(r.exit_code, 3) << name << ": " << r.output;
    EXPECT_TRUE(has(r.err, name) && has(r.err, "limit")) << r.err;
    const long kib = peak_kib(rss);
    EXPECT_LT(kib, 1024 * 1024) << name << ": peak RSS " << kib << " KiB";
  }
}

TEST_F(HostileInputs, ConfigSizesPastAnyModelAreRefusedNamingTheField) {
  const std::string dir = hf_dir(gpt2_model());
  // n_embd 2^40: 4 x n_embd and the shapes were computed from it before any bound.
  edit_json(dir + "/config.json", [](nlohmann::json& j) {
    j["n_embd"] = int64_t{1} << 40;
    j["n_inner"] = int64_t{1} << 62;
  });
  auto r = run_kiln(gen_cmd(dir));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.err, "n_embd")) << r.err;
}

// ---- kiln generate / kiln eval
// -------------------------------------------------------------------

TEST_F(HostileInputs, GenerateWithA16MContextSizesTheCacheByThePrompt) {
  const std::string dir = hf_dir(llama_model());
  edit_json(dir + "/config.json",
            [](nlohmann::json& j) { j["max_position_embeddings"] = 16777216; });
  const std::string rss = root_ + "/rss.txt";
  auto r = run_kiln(gen_cmd(dir), "/usr/bin/time -f %M -o " + rss);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Two new ids, greedy.
  std::istringstream ids(r.out);
  int a = -1, b = -1;
  ids >> a >> b;
  EXPECT_TRUE(a >= 0 && a < 64 && b >= 0 && b < 64) << r.out;
  // The whole-context cache was 2 layers x 16M positions x 64 floats = 8 GiB.
  const long kib = peak_kib(rss);
  EXPECT_LT(kib, 1024 * 1024) << "peak RSS " << kib << " KiB";
}

TEST_F(HostileInputs, GeneratePastTheMemoryIsRefusedBeforeAllocating) {
  const std::string dir = hf_dir(llama_model());
  edit_json(dir + "/config.json",
            [](nlohmann::json& j) { j["max_position_embeddings"] = 16777216; });
  ModelConfig m = llama_model();
  m.seq_len = 16777216;
  const uint64_t need = engine::inference_memory_bytes(m, m.seq_len);
  const HostMemory host = host_memory();
  if (!host.known || host.available >= need) {
    GTEST_SKIP() << "this machine has " << host.available << " bytes, the run needs " << need;
  }
  const std::string logits = root_ + "/logits.npy";
  const std::string rss = root_ + "/rss.txt";
  auto r =
      run_kiln(gen_cmd(dir, "--logits " + logits, "16777216"), "/usr/bin/time -f %M -o " + rss);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.err, "--max-tokens") && has(r.err, "KV cache")) << r.err;
  EXPECT_FALSE(fs::exists(logits));
  EXPECT_LT(peak_kib(rss), 1024 * 1024);
}

TEST_F(HostileInputs, EvalOfNoDocumentsIsAnError) {
  ModelConfig m = gpt2_model();
  m.vocab_size = 320;
  const std::string dir = hf_dir(m);
  const std::string tok = tokenizer();
  for (const std::string& content : {std::string(), std::string("\n  \n\t\n")}) {
    const std::string jsonl = root_ + "/empty.jsonl";
    ASSERT_TRUE(write_file_atomic(jsonl, content).is_ok());
    auto r = run_kiln("eval " + dir + " --jsonl " + jsonl + " --tokenizer " + tok);
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_TRUE(has(r.err, "no documents") && has(r.err, "empty.jsonl")) << r.err;
    EXPECT_FALSE(has(r.out, "loss")) << r.out;
  }
  // A document with text is scored (the same command works on real input).
  const std::string jsonl = root_ + "/one.jsonl";
  ASSERT_TRUE(write_file_atomic(jsonl, "{\"text\": \"hello world\"}\n").is_ok());
  auto ok = run_kiln("eval " + dir + " --jsonl " + jsonl + " --tokenizer " + tok + " --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["total"]["docs"], 1) << ok.out;
}

TEST_F(HostileInputs, EvalAndGenerateFilesWithoutNewlinesAreRefusedInBoundedMemory) {
  ModelConfig m = gpt2_model();
  m.vocab_size = 320;
  const std::string dir = hf_dir(m);
  const std::string tok = tokenizer();
  const std::string rss = root_ + "/rss.txt";
  for (const std::string& args :
       {"eval " + dir + " --tokenizer " + tok + " --jsonl /dev/zero",
        "eval " + dir + " --tokenizer " + tok + " --tasks /dev/zero",
        "generate " + dir + " --tokenizer " + tok + " --prompts-file /dev/zero"}) {
    auto r = run_kiln(args, "/usr/bin/time -f %M -o " + rss);
    EXPECT_EQ(r.exit_code, 3) << args << ": " << r.output;
    EXPECT_TRUE(has(r.err, "/dev/zero") && has(r.err, "longer than")) << r.err;
    EXPECT_LT(peak_kib(rss), 1024 * 1024) << args;
  }
}

// ---- pipeline keys and kiln plan
// -----------------------------------------------------------------

std::string tiny_config() {
  return std::string(kiln::test::source_dir()) + "/configs/train/tiny.yaml";
}

TEST_F(HostileInputs, PpLayersThatOverflowTheSumAreRefusedNamingTheKey) {
  auto r = run_kiln("plan --config " + tiny_config() +
                    " --world 3 --set model.n_layers=6 --set parallel.pp=3 "
                    "--set 'parallel.pp_layers=[9223372036854775807, 9223372036854775807, 6]'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.err, "parallel.pp_layers")) << r.err;
  // More entries than stages, also past the sum.
  r = run_kiln("plan --config " + tiny_config() +
               " --world 2 --set model.n_layers=4 --set parallel.pp=2 "
               "--set 'parallel.pp_layers=[1, 1, 1, 1, 4611686018427387904]'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.err, "parallel.pp_layers")) << r.err;
}

TEST_F(HostileInputs, PlanOfAHugeWorldAndAHugeModelEndsInSeconds) {
  for (const std::string& extra :
       {std::string("--world 1000000000000"), std::string("--world 8 --set model.n_layers=65536"),
        std::string("--world 65536 --pp 65536 --set model.n_layers=65536")}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = run_kiln("plan --config " + tiny_config() + " " + extra, "timeout 120");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, 0) << extra << ": " << r.output.substr(0, 2000);
    EXPECT_TRUE(has(r.out, "suggested") || has(r.out, "no trainable layout")) << extra;
    RecordProperty("seconds_" + std::to_string(extra.size()), std::to_string(s));
  }
}

TEST_F(HostileInputs, PlanOfSizesPastSixtyFourBitsIsRefusedNamingTheKey) {
  // Every value within its key's bounds, the products not: activations of 2^20 x 2^24 tokens.
  auto r = run_kiln("plan --config " + tiny_config() +
                    " --world 8 --set data.micro_batch=1048576 --set model.seq_len=16777216");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.err, "data.micro_batch") && has(r.err, "2^60")) << r.err;
  // The model states of 65,536 blocks of width 2^20.
  r = run_kiln("plan --config " + tiny_config() +
               " --world 8 --set model.n_layers=65536 --set model.d_model=1048576 "
               "--set model.n_heads=16");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.err, "model.n_layers")) << r.err;
  // kiln train refuses it too, before allocating.
  r = run_kiln("train --config " + tiny_config() + " --set run.dir=" + root_ +
               "/run --set data.micro_batch=1048576 --set model.seq_len=16777216");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.err, "data.micro_batch")) << r.err;
  EXPECT_FALSE(fs::exists(root_ + "/run"));
}

// The split pp_stage_split makes (now in O(pp log L)) is the one the O(pp L^2) program made:
// the program is written out here and compared on every pp for models of 1..40 blocks and
// several shapes (the head heavier or lighter than a block).
std::vector<int64_t> quadratic_split(const ModelConfig& m, int64_t pp) {
  const int64_t L = m.n_layers;
  const double C = static_cast<double>(m.d_model), T = static_cast<double>(m.seq_len);
  const double CA = static_cast<double>(m.n_heads * m.head_dim());
  const double F = static_cast<double>(m.ffn()), FC = m.llama() ? 2 * F : F;
  const double block =
      2 * (C * static_cast<double>(m.qkv_width()) + CA * C + C * FC + F * C) + 2 * T * CA;
  const double head = 2 * C * static_cast<double>(m.vocab_size);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(pp + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int64_t>> cut(pp + 1, std::vector<int64_t>(L + 1, 0));
  best[0][0] = 0;
  for (int64_t s = 1; s <= pp; ++s) {
    for (int64_t l = s; l <= L - (pp - s); ++l) {
      for (int64_t k = s - 1; k < l; ++k) {
        const double stage = static_cast<double>(l - k) * block + (s == pp ? head : 0.0);
        const double cost = std::max(best[s - 1][k], stage);
        if (cost < best[s][l]) {
          best[s][l] = cost;
          cut[s][l] = k;
        }
      }
    }
  }
  std::vector<int64_t> bounds(pp + 1, L);
  for (int64_t s = pp; s >= 1; --s) bounds[s - 1] = cut[s][bounds[s]];
  return bounds;
}

TEST(PpSplit, SameAsTheQuadraticProgram) {
  int compared = 0;
  for (int64_t vocab : {2, 64, 50257, 1 << 20}) {
    for (int64_t d : {8, 64, 768}) {
      for (int arch = 0; arch < 2; ++arch) {
        ModelConfig m;
        m.vocab_size = vocab;
        m.d_model = d;
        m.n_heads = 4;
        m.seq_len = 128;
        if (arch) {
          m.arch = engine::Arch::kLlama;
          m.ffn_hidden = 3 * d;
        }
        for (int64_t L = 1; L <= 40; ++L) {
          m.n_layers = L;
          for (int64_t pp = 1; pp <= L; ++pp) {
            ASSERT_EQ(engine::pp_stage_split(m, pp, {}), quadratic_split(m, pp))
                << "vocab " << vocab << " d " << d << " arch " << arch << " L " << L << " pp "
                << pp;
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 4 * 3 * 2 * 820);
}

}  // namespace
}  // namespace kiln
