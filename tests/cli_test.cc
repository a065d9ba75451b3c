// The `kiln` front end as a user runs it: help everywhere, version, exit codes.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct Run {
  int exit_code;
  std::string output;
};

Run run_kiln(const std::string& args) {
  std::string cmd = std::string(KILN_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

TEST(Cli, HelpAndVersion) {
  auto help = run_kiln("--help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* cmd : {"prep", "inspect", "tokenizer", "tagger", "stream", "train", "mix", "plan"}) {
    EXPECT_NE(help.output.find(cmd), std::string::npos) << cmd;
    auto sub = run_kiln(std::string(cmd) + " --help");
    EXPECT_EQ(sub.exit_code, 0) << cmd << ": " << sub.output;
    EXPECT_NE(sub.output.find("Usage"), std::string::npos) << cmd;
  }
  auto version = run_kiln("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.output.find("kiln "), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run_kiln("").exit_code, 2);
  EXPECT_EQ(run_kiln("no-such-command").exit_code, 2);
  EXPECT_EQ(run_kiln("prep --no-such-flag").exit_code, 2);
}

}  // namespace
