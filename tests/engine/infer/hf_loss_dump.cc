// Test helper (tests/hf_models.sh): the loss of Kiln's first training step on a batch, with the
// weights imported from a Hugging Face directory the way `model.init_from=DIR` starts a run
// (HfSource filling the ParamStore, engine/checkpoint/hf.h), computed by the training model's
// forward and backward (engine/model/model.h).
//   hf_loss_dump HF_DIR BATCH_FILE     BATCH_FILE: rows of seq_len + 1 token ids, one a line
// Prints {"loss": mean cross-entropy over the batch's targets}.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/checkpoint/hf.h"
#include "engine/model/model.h"

using namespace kiln;
using namespace kiln::engine;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: hf_loss_dump HF_DIR BATCH_FILE\n");
    return 2;
  }
  auto m = read_hf_config(argv[1]);
  if (!m.is_ok()) {
    std::fprintf(stderr, "%s\n", m.status().to_string().c_str());
    return 1;
  }
  std::vector<std::vector<int32_t>> rows;
  std::ifstream in(argv[2]);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::vector<int32_t> r;
    int32_t v;
    while (s >> v) r.push_back(v);
    if (!r.empty()) rows.push_back(r);
  }
  ModelConfig mc = *m;
  const int64_t B = static_cast<int64_t>(rows.size());
  if (B == 0 || static_cast<int64_t>(rows[0].size()) != mc.seq_len + 1) {
    std::fprintf(stderr, "the batch needs rows of n_positions + 1 = %lld ids\n",
                 static_cast<long long>(mc.seq_len + 1));
    return 2;
  }
  ParamStore params(mc, Precision::kFp32);
  auto src = HfSource::open(argv[1], params, "model.init_from");
  if (!src.is_ok()) {
    std::fprintf(stderr, "%s\n", src.status().to_string().c_str());
    return 1;
  }
  if (Status st = params.fill(**src); !st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  const int64_t T = mc.seq_len;
  std::vector<int32_t> inputs, targets;
  for (const auto& r : rows) {
    inputs.insert(inputs.end(), r.begin(), r.end() - 1);
    targets.insert(targets.end(), r.begin() + 1, r.end());
  }
  auto model = Model::create(&params, B, Recompute::kNone);
  std::vector<float> losses(static_cast<size_t>(B * T));
  params.zero_grads();
  model->forward_backward(inputs.data(), targets.data(), 1.0f / static_cast<float>(B * T),
                          losses.data());
  double sum = 0;
  for (float l : losses) sum += l;
  std::printf("{\"loss\": %.9g}\n", sum / static_cast<double>(B * T));
  return 0;
}
