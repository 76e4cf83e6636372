// Runs the built `slim` binary from tests and captures what it prints.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test_runner.h"

namespace slim::test {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

inline std::string slim_binary() { return env_or("SLIM_BINARY_DIR", "build") + "/tools/slim"; }
inline std::string source_dir() { return env_or("SLIM_SOURCE_DIR", "."); }

// A fresh scratch folder per test name under the build tree.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::path(env_or("SLIM_TEST_TMP", "/tmp/slim_test")) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs a shell command line; stdout and stderr are captured separately.
inline CommandResult run_command(const std::string& cmdline) {
  static int counter = 0;
  const auto dir = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const auto out = dir / ("slim_cmd_out_" + tag), err = dir / ("slim_cmd_err_" + tag);
  const std::string full = cmdline + " >" + out.string() + " 2>" + err.string() + " </dev/null";
  const int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

// Under an emulated CPU (test_runner.h) slim runs there too, not only the test binary.
inline CommandResult run_slim(const std::string& args) {
  return run_command(slim_runner_prefix() + slim_binary() + " " + args);
}

}  // namespace slim::test
