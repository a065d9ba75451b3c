// Helper for tests/python/shard_interop.py (built by tests/shard_interop.cmake).
//
//   shard_interop_fixture write DIR   writes DIR/kiln.tar.zst and DIR/kiln.tar
//   shard_interop_fixture read DIR    reads every DIR/foreign* shard (written by Python's tarfile
//                                     and GNU tar) and checks each sample's tokens.npy against
//                                     the ids its json lists
// Exits 0 when all is well, 1 with a message otherwise.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "format/npy.h"
#include "format/shard_writer.h"
#include "format/shard_reader.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

int fail(const std::string& msg) {
  std::fprintf(stderr, "shard_interop_fixture: %s\n", msg.c_str());
  return 1;
}

// Each sample's json member says what the other tools must find: the member exts in file order,
// the token ids and their dtype. Sample 5 has a 155-byte key (pax header); samples 0 and 3 have
// an extra member with a two-part ext.
std::vector<ShardSample> samples() {
  std::vector<ShardSample> v;
  for (int i = 0; i < 6; ++i) {
    ShardSample s;
    s.key = i == 5 ? "long_" + std::string(150, 'k') : "sample-" + std::to_string(i);
    bool wide = i % 2 == 1;
    std::vector<uint32_t> tokens;
    for (int t = 0; t < 3 + i * 50; ++t) tokens.push_back((wide ? 70000u : 1u) + t * 7 + i);
    std::string tok_json;
    for (uint32_t t : tokens) {
      if (!tok_json.empty()) tok_json += ',';
      tok_json += std::to_string(t);
    }
    bool extra = i % 3 == 0;
    std::string exts = extra ? R"(["txt","json","tokens.npy","meta.json"])"
                             : R"(["txt","json","tokens.npy"])";
    // Deliberately out of order: the writer puts them in the fixed order.
    s.members.push_back({"tokens.npy", npy_encode(tokens, wide ? NpyDtype::kU32 : NpyDtype::kU16)});
    if (extra) s.members.push_back({"meta.json", "{\"extra\": true}"});
    s.members.push_back({"json", "{\"key\": \"" + s.key + "\", \"exts\": " + exts +
                                     ", \"dtype\": \"" + (wide ? "uint32" : "uint16") +
                                     "\", \"tokens\": [" + tok_json + "]}"});
    s.members.push_back({"txt", "text of sample " + std::to_string(i) + "\nline two\n"});
    v.push_back(std::move(s));
  }
  return v;
}

int write_fixtures(const std::string& dir) {
  for (ShardCompression c : {ShardCompression::kZstd, ShardCompression::kNone}) {
    std::string path = dir + "/kiln" + shard_extension(c);
    auto w = ShardWriter::open(path, c);
    if (!w.is_ok()) return fail(w.status().to_string());
    for (const auto& s : samples()) {
      Status st = (*w)->add(s);
      if (!st.is_ok()) return fail(st.to_string());
    }
    auto info = (*w)->close();
    if (!info.is_ok()) return fail(info.status().to_string());
  }
  return 0;
}

int read_foreign(const std::string& dir) {
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (!name.starts_with("foreign")) continue;
    ++files;
    auto read = ShardReader::read_all(e.path().string());
    if (!read.is_ok()) return fail(read.status().to_string());
    if (read->size() != 4) return fail(name + ": expected 4 samples");
    for (const ShardSample& s : *read) {
      const ShardMember* json = s.find("json");
      const ShardMember* npy = s.find("tokens.npy");
      if (!json || !npy) return fail(name + " " + s.key + ": missing json or tokens.npy");
      if (s.members[0].ext != "txt") return fail(name + " " + s.key + ": members out of order");
      std::vector<uint32_t> ids;
      Status st = npy_decode(npy->data, &ids);
      if (!st.is_ok()) return fail(name + " " + s.key + ": " + st.to_string());
      std::string want;
      for (uint32_t t : ids) {
        if (!want.empty()) want += ',';
        want += std::to_string(t);
      }
      if (json->data.find("\"tokens\": [" + want + "]") == std::string::npos) {
        return fail(name + " " + s.key + ": tokens.npy holds [" + want + "], json says " +
                    json->data);
      }
    }
  }
  if (files < 3) return fail("expected at least 3 foreign shards in " + dir);
  std::printf("read %d foreign shards\n", files);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: shard_interop_fixture write|read DIR");
  std::string cmd = argv[1];
  if (cmd == "write") return write_fixtures(argv[2]);
  if (cmd == "read") return read_foreign(argv[2]);
  return fail("unknown command " + cmd);
}
