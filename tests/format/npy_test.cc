// .npy encoding and strict parsing of token arrays.
#include "format/npy.h"

#include <gtest/gtest.h>

#include <cstring>

namespace kiln {
namespace {

std::string header_of(const std::string& npy) {
  size_t len = static_cast<unsigned char>(npy[8]) | (static_cast<unsigned char>(npy[9]) << 8);
  return npy.substr(10, len);
}

// A .npy file with the given version and header text (padding not applied).
std::string craft(const std::string& header, const std::string& data, int major = 1) {
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  uint32_t len = static_cast<uint32_t>(header.size());
  out.push_back(static_cast<char>(len & 0xff));
  out.push_back(static_cast<char>((len >> 8) & 0xff));
  if (major >= 2) {
    out.push_back(static_cast<char>((len >> 16) & 0xff));
    out.push_back(static_cast<char>((len >> 24) & 0xff));
  }
  return out + header + data;
}

TEST(NpyTest, EncodesLikeNumpySave) {
  std::vector<uint16_t> v = {1, 2, 3};
  std::string npy = npy_encode(v);
  // Byte for byte what numpy 1.24's np.save writes for np.array([1, 2, 3], dtype='<u2').
  std::string want_header = "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }";
  want_header += std::string(128 - 10 - want_header.size() - 1, ' ') + "\n";
  EXPECT_EQ(npy.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(header_of(npy), want_header);
  EXPECT_EQ(npy.size(), 128u + 6u);
  EXPECT_EQ(npy.substr(128), std::string("\x01\x00\x02\x00\x03\x00", 6));
}

TEST(NpyTest, DataIs64ByteAligned) {
  for (size_t n : {0, 1, 7, 100, 12345, 1000000}) {
    std::vector<uint32_t> v(n, 7);
    std::string npy = npy_encode(v, NpyDtype::kU32);
    size_t header_end = 10 + header_of(npy).size();
    EXPECT_EQ(header_end % 64, 0u) << n;
    EXPECT_EQ(npy.size(), header_end + 4 * n);
  }
}

TEST(NpyTest, RoundTripU16AndU32) {
  std::vector<uint32_t> big = {0, 1, 65535, 65536, 4000000000u};
  std::vector<uint32_t> out;
  ASSERT_TRUE(npy_decode(npy_encode(big, NpyDtype::kU32), &out).is_ok());
  EXPECT_EQ(out, big);

  std::vector<uint32_t> small = {0, 1, 65535, 300};
  std::string npy = npy_encode(small, NpyDtype::kU16);
  Result<NpyView> view = npy_parse(npy);
  ASSERT_TRUE(view.is_ok()) << view.status().to_string();
  EXPECT_EQ(view->dtype, NpyDtype::kU16);
  EXPECT_EQ(view->size, 4u);
  EXPECT_EQ(view->at(2), 65535u);
  ASSERT_TRUE(npy_decode(npy, &out).is_ok());
  EXPECT_EQ(out, small);

  ASSERT_TRUE(npy_decode(npy_encode(std::vector<uint16_t>{}), &out).is_ok());
  EXPECT_TRUE(out.empty());
}

TEST(NpyTest, AppendReusesBuffer) {
  std::string buf = "prefix";
  npy_append(&buf, std::vector<uint16_t>{9});
  EXPECT_EQ(buf.substr(0, 6), "prefix");
  std::vector<uint32_t> out;
  ASSERT_TRUE(npy_decode(std::string_view(buf).substr(6), &out).is_ok());
  EXPECT_EQ(out, std::vector<uint32_t>{9});
}

TEST(NpyTest, TokenDtype) {
  EXPECT_EQ(npy_token_dtype(50257), NpyDtype::kU16);
  EXPECT_EQ(npy_token_dtype(65536), NpyDtype::kU16);
  EXPECT_EQ(npy_token_dtype(65537), NpyDtype::kU32);
  EXPECT_EQ(npy_itemsize(NpyDtype::kU16), 2u);
  EXPECT_STREQ(npy_descr(NpyDtype::kU32), "<u4");
}

TEST(NpyTest, AcceptsOtherWritersLayouts) {
  std::vector<uint32_t> out;
  // Keys in another order, double quotes, no trailing comma, version 2.0, no padding.
  std::string data("\x05\x00\x06\x00", 4);
  ASSERT_TRUE(
      npy_decode(craft("{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"<u2\"}\n", data),
                 &out)
          .is_ok());
  EXPECT_EQ(out, (std::vector<uint32_t>{5, 6}));
  ASSERT_TRUE(
      npy_decode(craft("{'descr': '<u2', 'fortran_order': False, 'shape': (2, ), }   \n", data, 2),
                 &out)
          .is_ok());
  EXPECT_EQ(out, (std::vector<uint32_t>{5, 6}));
}

TEST(NpyTest, RejectsMalformed) {
  std::string good_hdr = "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }\n";
  std::string data("\x05\x00\x06\x00", 4);
  ASSERT_TRUE(npy_parse(craft(good_hdr, data)).is_ok());
  struct Case {
    const char* what;
    std::string bytes;
  };
  std::vector<Case> cases = {
      {"empty", ""},
      {"bad magic", "\x92NUMPY" + craft(good_hdr, data).substr(6)},
      {"version 4", craft(good_hdr, data, 4)},
      {"truncated prefix", craft(good_hdr, data).substr(0, 9)},
      {"truncated header", craft(good_hdr, data).substr(0, 30)},
      {"short data", craft(good_hdr, data.substr(0, 3))},
      {"long data", craft(good_hdr, data + "xx")},
      {"big endian", craft("{'descr': '>u2', 'fortran_order': False, 'shape': (2,), }\n", data)},
      {"signed", craft("{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }\n", data)},
      {"float", craft("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\n", data)},
      {"fortran", craft("{'descr': '<u2', 'fortran_order': True, 'shape': (2,), }\n", data)},
      {"2-D", craft("{'descr': '<u2', 'fortran_order': False, 'shape': (1, 2), }\n", data)},
      {"scalar", craft("{'descr': '<u2', 'fortran_order': False, 'shape': (), }\n", data)},
      {"no comma", craft("{'descr': '<u2', 'fortran_order': False, 'shape': (2), }\n", data)},
      {"negative", craft("{'descr': '<u2', 'fortran_order': False, 'shape': (-2,), }\n", data)},
      {"missing shape", craft("{'descr': '<u2', 'fortran_order': False, }\n", data)},
      {"missing descr", craft("{'fortran_order': False, 'shape': (2,), }\n", data)},
      {"extra key",
       craft("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), 'x': 1}\n", data)},
      {"duplicate key",
       craft("{'descr': '<u2', 'descr': '<u2', 'fortran_order': False, 'shape': (2,)}\n", data)},
      {"no newline", craft("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", data)},
      {"junk after dict",
       craft("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), } x\n", data)},
      {"not a dict", craft("['descr']\n", data)},
      {"unterminated", craft("{'descr: <u2\n", data)},
      {"overflow",
       craft("{'descr': '<u2', 'fortran_order': False, 'shape': (99999999999999999999999,), }\n",
             data)},
      {"huge count",
       craft("{'descr': '<u4', 'fortran_order': False, 'shape': (4611686018427387905,), }\n",
             data)},
      {"non-ascii", craft("{'descr': '<u2\xff', 'fortran_order': False, 'shape': (2,), }\n", data)},
  };
  for (const Case& c : cases) {
    Result<NpyView> r = npy_parse(c.bytes);
    EXPECT_FALSE(r.is_ok()) << c.what;
    if (!r.is_ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kData) << c.what;
      EXPECT_NE(r.status().message().find("npy"), std::string::npos) << r.status().message();
    }
    std::vector<uint32_t> out = {1};
    EXPECT_FALSE(npy_decode(c.bytes, &out).is_ok()) << c.what;
    EXPECT_TRUE(out.empty()) << c.what;
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(NpyTest, Uint8MasksEncodeLikeNumpySave) {
  // np.save of np.array([0, 1, 1], dtype=np.uint8): descr '|u1', data after a 128-byte header.
  std::vector<uint8_t> mask = {0, 1, 1};
  std::string npy = npy_encode(std::span<const uint8_t>(mask));
  std::string want_header = "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }";
  want_header += std::string(128 - 10 - want_header.size() - 1, ' ') + "\n";
  EXPECT_EQ(header_of(npy), want_header);
  ASSERT_EQ(npy.size(), 128u + 3u);
  Result<NpyView> view = npy_parse(npy);
  ASSERT_TRUE(view.is_ok()) << view.status().message();
  EXPECT_EQ(view->dtype, NpyDtype::kU8);
  EXPECT_EQ(view->size, 3u);
  EXPECT_EQ(view->at(0), 0u);
  EXPECT_EQ(view->at(2), 1u);
  std::vector<uint32_t> out;
  ASSERT_TRUE(npy_decode(npy, &out).is_ok());
  EXPECT_EQ(out, (std::vector<uint32_t>{0, 1, 1}));
}

}  // namespace
}  // namespace kiln
