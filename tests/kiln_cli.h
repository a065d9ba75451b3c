// Runs the `kiln` binary under test (kiln::test::kiln_binary(), tests/test_paths.h) the way a user
// would, capturing its exit code, stdout and stderr. Shared by the end-to-end CLI tests.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/test_paths.h"

namespace kiln::testing_cli {

struct CliRun {
  int exit_code = -1;  // -1 when kiln did not exit normally (e.g. killed by a signal)
  std::string out;     // stdout
  std::string err;     // stderr
  std::string output;  // stdout then stderr, for "the message says ..." checks
};

// `args` is appended to the binary's path and run by the shell, so it may hold redirections
// of standard input (e.g. "tokenizer encode --tokenizer t.json < text.txt"). `env` (e.g.
// "KILN_CPU_ISA=avx2") is put before the binary, so it sets environment variables for this run.
inline CliRun run_kiln(const std::string& args, const std::string& env = "") {
  static int counter = 0;
  const std::string err_file = (std::filesystem::temp_directory_path() /
                                ("kiln_cli_stderr_" + std::to_string(::getpid()) + "_" +
                                 std::to_string(counter++) + ".txt")).string();
  const std::string cmd =
      env + " " + std::string(kiln::test::kiln_binary()) + " " + args + " 2>" + err_file;
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_file, std::ios::binary);
  std::stringstream ss;
  ss << err.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err_file);
  r.output = r.out + r.err;
  return r;
}

}  // namespace kiln::testing_cli
