#include "common/host_memory.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/text.h"

namespace kiln {
namespace {

// The first number in a file ("max" or an absent file: 0).
uint64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(word.c_str(), &end, 10);
  return end && *end == '\0' ? v : 0;
}

uint64_t mem_available(const std::string& root) {
  std::ifstream in(root + "/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return 0;
}

// The process's cgroup v2 directory (from /proc/self/cgroup "0::/path"), "" when not on v2.
std::string cgroup2_dir(const std::string& root) {
  std::ifstream in(root + "/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return root + "/sys/fs/cgroup" + line.substr(3);
  }
  return "";
}

}  // namespace

// `key value` from a memory.stat file (0 when absent).
uint64_t stat_value(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

HostMemory host_memory(const std::string& root) {
  HostMemory m;
  m.mem_available = mem_available(root);
  // The smallest room left under any limit from the process's cgroup up to the root (under
  // Slurm or systemd the limit often sits on a parent). Usage less the inactive file cache, which
  // the kernel reclaims before it kills anything (as docker and the kubelet count it).
  uint64_t left = 0;
  auto consider = [&](uint64_t limit, uint64_t usage, uint64_t reclaimable) {
    if (limit == 0) return;
    const uint64_t used = usage > reclaimable ? usage - reclaimable : 0;
    const uint64_t room = limit > used ? limit - used : 0;
    if (m.cgroup_limit == 0 || room < left) {
      left = room;
      m.cgroup_limit = limit;
      m.cgroup_usage = used;
    }
  };
  const std::string base = root + "/sys/fs/cgroup";
  std::string dir = cgroup2_dir(root);
  while (!dir.empty() && dir.size() >= base.size()) {
    consider(read_number(dir + "/memory.max"), read_number(dir + "/memory.current"),
             stat_value(dir + "/memory.stat", "inactive_file"));
    if (dir.size() == base.size()) break;
    dir = dir.substr(0, dir.rfind('/'));
  }
  if (m.cgroup_limit == 0) {  // cgroup v1
    const std::string v1 = base + "/memory";
    const uint64_t limit = read_number(v1 + "/memory.limit_in_bytes");
    if (limit < (uint64_t{1} << 60)) {  // v1 writes "no limit" as ~2^63
      consider(limit, read_number(v1 + "/memory.usage_in_bytes"),
               stat_value(v1 + "/memory.stat", "total_inactive_file"));
    }
  }
  m.known = m.mem_available > 0 || m.cgroup_limit > 0;
  m.available = m.mem_available;
  m.source = "MemAvailable " + human_bytes(m.mem_available);
  if (m.cgroup_limit > 0 && (m.mem_available == 0 || left < m.available)) {
    m.available = left;
    m.source =
        "cgroup limit " + human_bytes(m.cgroup_limit) + " - in use " + human_bytes(m.cgroup_usage);
  }
  return m;
}

}  // namespace kiln
