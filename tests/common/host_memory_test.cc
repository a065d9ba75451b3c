// What the process can still use (common/host_memory.h), on fake /proc and /sys trees:
// MemAvailable, a cgroup v2 limit below it, v1's "no limit", missing files.
#include "common/host_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kiln {
namespace {
namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(HostMemory, MemAvailableCappedByTheCgroup) {
  const fs::path root =
      fs::temp_directory_path() / ("kiln_host_memory_" + std::to_string(getpid()));
  fs::remove_all(root);
  write(root / "proc/meminfo", "MemTotal:       32000000 kB\nMemAvailable:   16000000 kB\n");
  HostMemory m = host_memory(root.string());  // no cgroup files: MemAvailable
  EXPECT_EQ(m.available, 16000000ull * 1024);
  EXPECT_EQ(m.source.rfind("MemAvailable", 0), 0u) << m.source;

  write(root / "proc/self/cgroup", "0::/job/42\n");
  write(root / "sys/fs/cgroup/job/42/memory.max", "8589934592\n");      // 8 GiB
  write(root / "sys/fs/cgroup/job/42/memory.current", "1073741824\n");  // 1 GiB in use
  m = host_memory(root.string());
  EXPECT_EQ(m.available, 7ull << 30);
  EXPECT_EQ(m.cgroup_limit, 8ull << 30);
  EXPECT_NE(m.source.find("cgroup limit 8.0 GiB"), std::string::npos) << m.source;

  // The inactive file cache counts as free (the kernel reclaims it first).
  write(root / "sys/fs/cgroup/job/42/memory.stat", "anon 1000\ninactive_file 536870912\n");
  EXPECT_EQ(host_memory(root.string()).available, (7ull << 30) + (512ull << 20));
  // A tighter limit on a parent (Slurm, systemd slices) wins.
  write(root / "sys/fs/cgroup/job/memory.max", "4294967296\n");
  write(root / "sys/fs/cgroup/job/memory.current", "1073741824\n");
  EXPECT_EQ(host_memory(root.string()).available, 3ull << 30);
  fs::remove(root / "sys/fs/cgroup/job/memory.max");
  fs::remove(root / "sys/fs/cgroup/job/42/memory.stat");

  write(root / "sys/fs/cgroup/job/42/memory.max", "max\n");  // v2 without a limit
  m = host_memory(root.string());
  EXPECT_EQ(m.available, 16000000ull * 1024);
  // A full cgroup is a measurement (0 left), not "unknown".
  write(root / "sys/fs/cgroup/job/42/memory.max", "1073741824\n");
  m = host_memory(root.string());
  EXPECT_TRUE(m.known);
  EXPECT_EQ(m.available, 0u);
  write(root / "sys/fs/cgroup/job/42/memory.max", "max\n");

  fs::remove_all(root / "sys/fs/cgroup/job");
  write(root / "proc/self/cgroup", "12:memory:/\n");                                    // v1
  write(root / "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");  // none
  EXPECT_EQ(host_memory(root.string()).available, 16000000ull * 1024);
  write(root / "sys/fs/cgroup/memory/memory.limit_in_bytes", "4294967296\n");
  write(root / "sys/fs/cgroup/memory/memory.usage_in_bytes", "0\n");
  EXPECT_EQ(host_memory(root.string()).available, 4ull << 30);
  fs::remove_all(root);
  EXPECT_FALSE(host_memory(root.string()).known);  // nothing readable: unknown
}

}  // namespace
}  // namespace kiln
