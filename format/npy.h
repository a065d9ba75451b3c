// NumPy .npy encoding for the token arrays of shard samples ("<key>.tokens.npy").
//
// Only what Kiln stores: one-dimensional, C-order, little-endian unsigned 16- or 32-bit integer
// arrays (descr "<u2" / "<u4") for token ids, and uint8 arrays (descr "|u1") for the loss masks of
// chat samples ("<key>.mask.npy"). The writer emits format version 1.0 with the header padded so
// the data starts at a multiple of 64 bytes, exactly as numpy.save lays it out; numpy.load reads
// it. The parser treats its input as untrusted: magic, version, header length, the header dict
// (exactly the keys descr, fortran_order, shape; descr "<u2", "<u4" or "|u1" (also "<u1");
// fortran_order False; a 1-D shape) and the data length (exactly shape * itemsize, no trailing
// bytes) are all checked, and anything else is a kData Status saying what is wrong.
// Versions 1.0, 2.0 and 3.0 are read. All functions are thread-safe (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kiln {

enum class NpyDtype { kU16, kU32, kU8 };

// Bytes per element: 2, 4 or 1.
size_t npy_itemsize(NpyDtype dtype);
// "<u2", "<u4" or "|u1".
const char* npy_descr(NpyDtype dtype);

// Appends a complete .npy file holding `values` to *out (out is not cleared, so a caller can reuse
// one buffer). The u32 overload with kU16 requires every value < 65536 (KILN_CHECK otherwise).
void npy_append(std::string* out, std::span<const uint16_t> values);
void npy_append(std::string* out, std::span<const uint32_t> values, NpyDtype dtype);
std::string npy_encode(std::span<const uint16_t> values);
std::string npy_encode(std::span<const uint32_t> values, NpyDtype dtype = NpyDtype::kU32);
// A uint8 array ("|u1", as numpy.save writes np.uint8): loss masks.
std::string npy_encode(std::span<const uint8_t> values);

// The dtype Kiln stores token ids in: uint16 when every id of a vocabulary of `vocab_size`
// fits (vocab_size <= 65536), else uint32.
NpyDtype npy_token_dtype(uint64_t vocab_size);

// A parsed array: a view into the bytes given to npy_parse (not owned; `data` may be unaligned).
struct NpyView {
  NpyDtype dtype = NpyDtype::kU16;
  uint64_t size = 0;          // number of elements
  const char* data = nullptr; // size * itemsize little-endian bytes
  // Element i widened to uint32 (i < size).
  uint32_t at(uint64_t i) const;
};

// Parses and validates a whole .npy file held in `bytes`.
Result<NpyView> npy_parse(std::string_view bytes);

// Parses `bytes` and stores the elements, widened to uint32, in *out (resized; its capacity is
// reused). On error *out is left empty.
Status npy_decode(std::string_view bytes, std::vector<uint32_t>* out);

}  // namespace kiln
