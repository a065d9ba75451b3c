// Shard write/read throughput against the zstd CLI on the same bytes.
//
// Builds text samples (txt + json + tokens.npy, as `kiln prep` writes them) from real text on
// the machine, writes them into .tar.zst shards with RollingShardWriter, reads them back with
// ShardReader, and times the zstd CLI on the very same tar bytes: `zstd -3` on each shard's
// uncompressed tar, and `zstd -d` on each shard. Prints MB/s (MB = 10^6 bytes of uncompressed
// tar) and the time ratios the targets are stated in (write <= 1.5x `zstd -3`, read <= 1.3x
// `zstd -d`).
//
// usage: bench_shards [--bytes N] [--dir DIR] [--repeat R] [--level L] [--max-tar-bytes N]
//                     [--corpus PATH]... [--keep]
// KILN_BENCH_BYTES overrides the default size (1 GiB) for a quick run.
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "format/npy.h"
#include "format/shard_writer.h"
#include "format/shard_reader.h"
#include "tools/bench/bench_machine.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_shards: %s\n", msg.c_str());
  std::exit(1);
}

void check(const Status& st) {
  if (!st.is_ok()) die(st.to_string());
}

bool looks_like_text(const std::string& s) {
  size_t n = std::min<size_t>(s.size(), 8192), bad = 0;
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == 0) return false;
    if (c < 0x09 || (c > 0x0d && c < 0x20)) ++bad;
  }
  return bad * 100 <= n;
}

// Documents of up to ~16 KiB cut at line ends from the text files under `roots`.
std::vector<std::string> load_docs(const std::vector<std::string>& roots, uint64_t limit) {
  std::vector<std::string> docs;
  uint64_t total = 0;
  for (const std::string& root : roots) {
    std::error_code ec;
    fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec);
    for (; !ec && it != fs::recursive_directory_iterator() && total < limit; it.increment(ec)) {
      if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
      std::string ext = it->path().extension().string();
      if (ext == ".gz" || ext == ".xz" || ext == ".bz2" || ext == ".zst" || ext == ".png" ||
          ext == ".jpg" || ext == ".gif" || ext == ".pdf") {
        continue;
      }
      uint64_t size = it->file_size(ec);
      if (ec || size == 0 || size > (8u << 20)) continue;
      Result<std::string> text = read_file(it->path().string());
      if (!text.is_ok() || !looks_like_text(*text)) continue;
      std::string_view rest = *text;
      while (!rest.empty()) {
        size_t cut = rest.size() <= 16384 ? rest.size() : rest.rfind('\n', 16384);
        if (cut == std::string_view::npos || cut < 1024) cut = std::min<size_t>(16384, rest.size());
        docs.emplace_back(rest.substr(0, cut));
        total += cut;
        rest.remove_prefix(cut);
      }
    }
  }
  return docs;
}

// CPU seconds (user + system) of this process or of its waited-for children.
double cpu_s(int who) {
  struct rusage ru;
  ::getrusage(who, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

// Best (lowest) wall time over the repeats, and the CPU time of that same run.
struct Timer {
  double best = 1e300;
  double cpu = 0;
  void add(double s, double cpu_seconds) {
    if (s < best) {
      best = s;
      cpu = cpu_seconds;
    }
  }
};

// Runs a command and returns its wall time. posix_spawn (vfork-like in glibc) keeps the start
// cost independent of this process's size, so the CLI is not charged for our memory.
double run_cli(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  double t0 = now_s();
  pid_t pid;
  if (::posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) {
    die("cannot run " + argv[0]);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  double t = now_s() - t0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    die("command failed: " + argv[0] + " " + argv.back());
  }
  return t;
}

uint64_t decompress_to(const std::string& zst, const std::string& out_path) {
  Result<std::string> z = read_file(zst);
  check(z.status());
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ZSTD_inBuffer in{z->data(), z->size(), 0};
  std::vector<char> buf(1 << 20);
  uint64_t n = 0;
  while (in.pos < in.size) {
    ZSTD_outBuffer o{buf.data(), buf.size(), 0};
    size_t r = ZSTD_decompressStream(d, &o, &in);
    if (ZSTD_isError(r)) die("zstd: " + std::string(ZSTD_getErrorName(r)));
    out.write(buf.data(), static_cast<std::streamsize>(o.pos));
    n += o.pos;
  }
  ZSTD_freeDCtx(d);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::bench::print_machine();  // CPU model and the ISA paths this run takes
  uint64_t target = 1ull << 30;
  if (const char* env = std::getenv("KILN_BENCH_BYTES")) target = std::strtoull(env, nullptr, 10);
  std::string dir = (fs::temp_directory_path() / "kiln_bench_shards").string();
  int repeat = 3;
  int level = 3;
  uint64_t max_tar_bytes = 256ull << 20;
  std::vector<std::string> corpus;
  bool keep = false;  // leave the shards in DIR/shards (for profiling the reader)
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--bytes") target = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--dir") dir = value();
    else if (a == "--repeat") repeat = std::atoi(value().c_str());
    else if (a == "--level") level = std::atoi(value().c_str());
    else if (a == "--max-tar-bytes") max_tar_bytes = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--corpus") corpus.push_back(value());
    else if (a == "--keep") keep = true;
    else die("unknown argument " + a + " (see the header of tools/bench/shards.cc)");
  }
  if (corpus.empty()) corpus = {"/usr/share/doc", "/usr/share/common-licenses", "/usr/include"};
  if (repeat < 1) repeat = 1;

  // ---- samples: a pool of distinct samples, cycled (with fresh keys) up to the target size.
  // Repeats are >= 64 MiB apart, far outside zstd -3's window, so they do not help compression.
  double t_gen = now_s();
  uint64_t pool_limit = std::min<uint64_t>(target, 192ull << 20);
  std::vector<std::string> docs = load_docs(corpus, pool_limit);
  if (docs.empty()) die("no text found under the corpus paths");
  std::vector<ShardSample> pool;
  std::vector<uint64_t> pool_tokens;
  uint64_t pool_bytes = 0;
  std::vector<uint16_t> ids;
  for (size_t i = 0; i < docs.size() && pool_bytes < pool_limit; ++i) {
    ShardSample s;
    s.key = "s";
    const std::string& text = docs[i];
    // Stand-in token ids (one per ~4 bytes, as BPE gives on English text).
    ids.clear();
    for (size_t b = 0; b + 4 <= text.size(); b += 4) {
      uint32_t v;
      std::memcpy(&v, text.data() + b, 4);
      ids.push_back(static_cast<uint16_t>((v * 2654435761u >> 16) % 50257));
    }
    s.members.push_back({"txt", text});
    s.members.push_back({"json", "{\"id\": \"doc-" + std::to_string(i) +
                                     "\", \"domain\": \"bench\", \"source\": \"bench\", "
                                     "\"tokens\": " + std::to_string(ids.size()) + "}"});
    s.members.push_back({"tokens.npy", npy_encode(ids)});
    for (const auto& m : s.members) pool_bytes += m.data.size();
    pool_tokens.push_back(ids.size());
    pool.push_back(std::move(s));
  }
  uint64_t per_round = pool_bytes;
  uint64_t n_samples = pool.size() * (target / per_round) +
                       pool.size() * (target % per_round) / per_round + 1;
  t_gen = now_s() - t_gen;
  std::printf("samples: %zu distinct (%.1f MB of text/json/npy from %zu docs) in %.1fs, "
              "%llu written (~%.0f MB)\n",
              pool.size(), pool_bytes / 1e6, docs.size(), t_gen,
              static_cast<unsigned long long>(n_samples),
              static_cast<double>(n_samples) / pool.size() * pool_bytes / 1e6);
  docs.clear();
  docs.shrink_to_fit();

  std::string out_dir = dir + "/shards";
  std::string cli_dir = dir + "/cli";
  Timer write_t, read_t, read_nock_t, cli_c_t, cli_st_t, cli_d_t;
  std::vector<ShardInfo> shards;
  uint64_t tar_total = 0, file_total = 0, samples_read = 0, member_bytes_read = 0;
  for (int rep = 0; rep < repeat; ++rep) {
    fs::remove_all(dir);
    fs::create_directories(cli_dir);
    // ---- write
    double t0 = now_s(), c0 = cpu_s(RUSAGE_SELF);
    RollingShardWriter::Options o;
    o.dir = out_dir;
    o.prefix = "bench";
    o.compression = ShardCompression::kZstd;
    o.zstd_level = level;
    o.max_samples = 0;
    o.max_tar_bytes = max_tar_bytes;
    RollingShardWriter writer(o);
    for (uint64_t i = 0; i < n_samples; ++i) {
      ShardSample& s = pool[i % pool.size()];
      s.key.assign("s");
      s.key += std::to_string(i);
      check(writer.add(s, pool_tokens[i % pool.size()]));
    }
    Result<std::vector<ShardInfo>> done = writer.finish();
    check(done.status());
    write_t.add(now_s() - t0, cpu_s(RUSAGE_SELF) - c0);
    shards = *done;
    tar_total = file_total = 0;
    for (const auto& s : shards) {
      tar_total += s.tar_bytes;
      file_total += s.bytes;
    }

    // ---- the zstd CLI on the same tar bytes
    std::vector<std::string> tars;
    for (const auto& s : shards) {
      std::string tar = cli_dir + "/" + fs::path(s.path).stem().string();  // bench-N.tar
      if (decompress_to(s.path, tar) != s.tar_bytes) die("tar size mismatch for " + s.path);
      tars.push_back(tar);
    }
    // The CLI's default (-T1: compression in a worker thread, I/O in the main thread) and its
    // --single-thread mode (one thread for everything, like ShardWriter).
    double c = 0, cst = 0, d = 0;
    double k0 = cpu_s(RUSAGE_CHILDREN);
    for (const auto& tar : tars) {
      c += run_cli({"zstd", "-q", "-f", "-" + std::to_string(level), tar, "-o", tar + ".zst"});
    }
    double k1 = cpu_s(RUSAGE_CHILDREN);
    for (const auto& tar : tars) {
      cst += run_cli({"zstd", "-q", "-f", "--single-thread", "-" + std::to_string(level), tar,
                      "-o", tar + ".st.zst"});
    }
    double k2 = cpu_s(RUSAGE_CHILDREN);
    for (const auto& s : shards) d += run_cli({"zstd", "-d", "-q", "-f", s.path, "-o", "/dev/null"});
    double k3 = cpu_s(RUSAGE_CHILDREN);
    cli_c_t.add(c, k1 - k0);
    cli_st_t.add(cst, k2 - k1);
    cli_d_t.add(d, k3 - k2);
    for (const auto& tar : tars) fs::remove(tar);

    // ---- read (with the manifest checksum, as the loader reads, and without)
    for (int verify = 1; verify >= 0; --verify) {
      double t1 = now_s(), c1 = cpu_s(RUSAGE_SELF);
      uint64_t n = 0, bytes = 0;
      ShardSample sample;
      for (const auto& info : shards) {
        ShardReaderOptions ro;
        if (verify) ro.expected_xxh3 = info.xxh3;
        auto reader = ShardReader::open(info.path, ro);
        check(reader.status());
        for (;;) {
          Result<bool> more = (*reader)->next(&sample);
          check(more.status());
          if (!*more) break;
          ++n;
          for (const auto& m : sample.members) bytes += m.data.size();
        }
      }
      (verify ? read_t : read_nock_t).add(now_s() - t1, cpu_s(RUSAGE_SELF) - c1);
      samples_read = n;
      member_bytes_read = bytes;
    }
    if (samples_read != n_samples) die("read back a different number of samples");
  }
  uint64_t cli_zst = 0;
  for (const auto& s : shards) {
    std::string z = cli_dir + "/" + fs::path(s.path).stem().string() + ".zst";
    cli_zst += fs::file_size(z);
  }

  double mb = tar_total / 1e6;
  std::printf("shards: %zu x .tar.zst, %.1f MB tar -> %.1f MB (ratio %.2f; zstd CLI -%d: %.1f MB), "
              "%.1f MB member data, best of %d\n",
              shards.size(), mb, file_total / 1e6, static_cast<double>(tar_total) / file_total,
              level, cli_zst / 1e6, member_bytes_read / 1e6, repeat);
  auto line = [&](const char* what, const Timer& t, const Timer& peer, const char* target) {
    std::printf("%-44s %7.1f MB/s  %6.2fs wall %6.2fs cpu", what, mb / t.best, t.best, t.cpu);
    if (&t != &peer) {
      std::printf("   %.2fx wall %.2fx cpu%s", t.best / peer.best, t.cpu / peer.cpu, target);
    }
    std::printf("\n");
  };
  std::printf("%-44s %12s  %11s %10s   %s\n", "", "", "", "", "time vs the CLI");
  line(("zstd -" + std::to_string(level) + " (CLI default, -T1)").c_str(), cli_c_t, cli_c_t, "");
  line(("zstd -" + std::to_string(level) + " --single-thread").c_str(), cli_st_t, cli_st_t, "");
  line("kiln write (RollingShardWriter, incl. fsync)", write_t, cli_c_t,
       "  (target <= 1.5x zstd -3)");
  line("  vs zstd --single-thread", write_t, cli_st_t, "");
  line("zstd -d (CLI)", cli_d_t, cli_d_t, "");
  line("kiln read (ShardReader, xxh3 verified)", read_t, cli_d_t, "  (target <= 1.3x zstd -d)");
  line("kiln read (ShardReader, no checksum)", read_nock_t, cli_d_t, "");
  if (!keep) fs::remove_all(dir);
  return 0;
}
