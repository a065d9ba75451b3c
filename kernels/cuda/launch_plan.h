// Host-side planning for the fused CUDA kernels, in plain C++ (no CUDA headers), so the CPU tests
// check it (tests/cuda_launch_plan_test.cc) on machines without a GPU:
//   - the multi-tensor chunk table: one launch over many tensors, block b handling one fixed chunk
//     of one tensor (multi-tensor AdamW, the gradient norm);
//   - the switches read from the environment (KILN_CUDA_FUSED, KILN_CUDA_GEMM_EPILOGUE);
//   - the key under which a cuBLASLt GEMM's descriptors and algorithm are cached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace kiln::cuda {

// Elements per block of a multi-tensor launch: a multiple of every vector width, large enough
// that the table stays small (124M parameters: ~1 900 entries), small enough to fill the GPU.
constexpr size_t kMultiTensorChunk = size_t(1) << 16;

// Block b of a multi-tensor launch handles elements [chunk * kMultiTensorChunk, min(n, (chunk + 1)
// * kMultiTensorChunk)) of tensor `tensor`.
struct TensorChunk {
  uint32_t tensor = 0;
  uint32_t chunk = 0;
  bool operator==(const TensorChunk&) const = default;
};

// The chunk table of `count` tensors of sizes[i] elements, in tensor order then chunk order
// (empty tensors get no entry). Every element of every tensor is in exactly one chunk.
inline std::vector<TensorChunk> plan_tensor_chunks(const size_t* sizes, int count,
                                                   size_t chunk_elems = kMultiTensorChunk) {
  std::vector<TensorChunk> out;
  if (chunk_elems == 0) return out;
  for (int t = 0; t < count; ++t) {
    const size_t chunks = (sizes[t] + chunk_elems - 1) / chunk_elems;
    for (size_t c = 0; c < chunks; ++c)
      out.push_back(TensorChunk{static_cast<uint32_t>(t), static_cast<uint32_t>(c)});
  }
  return out;
}

// An on/off switch from the environment: unset or "" gives nullopt (use the default); "1", "on",
// "true", "yes" and "0", "off", "false", "no" (any case) give true / false; anything else is an
// error, reported by the caller naming the variable (parse_switch returns `bad`).
enum class SwitchValue { kDefault, kOn, kOff, kBad };
inline SwitchValue parse_switch(const char* text) {
  if (text == nullptr || *text == '\0') return SwitchValue::kDefault;
  std::string s(text);
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (s == "1" || s == "on" || s == "true" || s == "yes") return SwitchValue::kOn;
  if (s == "0" || s == "off" || s == "false" || s == "no") return SwitchValue::kOff;
  return SwitchValue::kBad;
}

// cuBLASLt epilogues Kiln uses (matmul.cu maps them to cublasLtEpilogue_t).
enum class GemmEpilogue : int {
  kNone = 0,
  kBias = 1,         // D = AB + bias
  kGeluAuxBias = 2,  // D = gelu(AB + bias), aux = AB + bias (the pre-activation, for backward)
  kDGelu = 3,        // D = (AB) * gelu'(aux)
};
inline const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kBias: return "bias";
    case GemmEpilogue::kGeluAuxBias: return "gelu_aux_bias";
    case GemmEpilogue::kDGelu: return "dgelu";
  }
  return "?";
}

// The largest power of two (up to 256 bytes, cuBLASLt's default assumption) dividing the address.
inline uint32_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256u;
  const uintptr_t low = a & (~a + 1);
  return static_cast<uint32_t>(low < 256 ? low : 256);
}

// Everything that selects a cuBLASLt plan (descriptors + algorithm): two GEMMs with equal keys run
// the same algorithm, so results repeat bit for bit; any field that changes the problem, the
// types, the layouts, the operands' alignment (the heuristic is told it) or the epilogue gives
// another key. Types are cudaDataType_t values, the
// transposes cublasOperation_t values (kept as int so this header needs no CUDA).
struct GemmKey {
  int transa = 0, transb = 0;
  int m = 0, n = 0, k = 0;
  int atype = 0, lda = 0, btype = 0, ldb = 0, ctype = 0, ldc = 0;
  bool accumulate = false;  // beta != 0
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  int aux_ld = 0;  // leading dimension of the aux matrix (gelu epilogues), else 0
  // The A, B and C/D pointers' alignment in bytes (pointer_alignment).
  uint32_t align_a = 256, align_b = 256, align_c = 256;
  auto tie() const {
    return std::tie(transa, transb, m, n, k, atype, lda, btype, ldb, ctype, ldc, accumulate,
                    epilogue, aux_ld, align_a, align_b, align_c);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
  bool operator==(const GemmKey& o) const { return tie() == o.tie(); }
  // "m=768 n=8192 k=3072 ta=1 tb=0 types=14/14/14 ld=3072/3072/768 beta=0 epilogue=gelu_aux_bias"
  std::string describe() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           " ta=" + std::to_string(transa) + " tb=" + std::to_string(transb) +
           " types=" + std::to_string(atype) + "/" + std::to_string(btype) + "/" +
           std::to_string(ctype) + " ld=" + std::to_string(lda) + "/" + std::to_string(ldb) + "/" +
           std::to_string(ldc) + " beta=" + (accumulate ? "1" : "0") +
           " epilogue=" + gemm_epilogue_name(epilogue) +
           (aux_ld ? " aux_ld=" + std::to_string(aux_ld) : std::string()) +
           " align=" + std::to_string(align_a) + "/" + std::to_string(align_b) + "/" +
           std::to_string(align_c);
  }
};

// cuBLASLt's epilogues with an aux matrix need its leading dimension to be a multiple of 8
// elements and its pointer 16-byte aligned; otherwise the GEMM + separate kernel path is used.
inline bool gelu_epilogue_fits(int aux_ld, const void* aux) {
  return aux_ld % 8 == 0 && (reinterpret_cast<uintptr_t>(aux) % 16) == 0;
}

}  // namespace kiln::cuda
