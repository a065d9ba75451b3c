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

HostMemory host_memory(const std::string& root) {
  HostMemory m;
  m.mem_available = mem_available(root);
  std::string dir = cgroup2_dir(root);
  if (!dir.empty()) {
    m.cgroup_limit = read_number(dir + "/memory.max");
    m.cgroup_usage = read_number(dir + "/memory.current");
  }
  if (m.cgroup_limit == 0) {  // cgroup v1
    const std::string v1 = root + "/sys/fs/cgroup/memory";
    const uint64_t limit = read_number(v1 + "/memory.limit_in_bytes");
    if (limit > 0 && limit < (uint64_t{1} << 60)) {  // v1 writes "no limit" as ~2^63
      m.cgroup_limit = limit;
      m.cgroup_usage = read_number(v1 + "/memory.usage_in_bytes");
    }
  }
  m.available = m.mem_available;
  m.source = "MemAvailable " + human_bytes(m.mem_available);
  if (m.cgroup_limit > 0) {
    const uint64_t left = m.cgroup_limit > m.cgroup_usage ? m.cgroup_limit - m.cgroup_usage : 0;
    if (m.available == 0 || left < m.available) {
      m.available = left;
      m.source = "cgroup limit " + human_bytes(m.cgroup_limit) + " - in use " +
                 human_bytes(m.cgroup_usage);
    }
  }
  return m;
}

}  // namespace kiln
