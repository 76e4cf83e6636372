// Helpers shared by the trust tests: scratch directories and small file writers.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sys/wait.h>
#include <string>

#include "slim/core/error.h"

namespace slim::trust::testing {

inline std::filesystem::path scratch_dir(const std::string& name) {
  const char* base = std::getenv("SLIM_TEST_TMP");
  std::filesystem::path root = base ? base : std::filesystem::temp_directory_path() / "slim_test_tmp";
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = root / "trust" /
                              (std::string(info->test_suite_name()) + "." + info->name() + "." + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The source tree: SLIM_SOURCE_DIR when set, else found from this header's own path
// (ctest's ENVIRONMENT may carry only the first of several variables).
inline std::filesystem::path source_dir() {
  if (const char* s = std::getenv("SLIM_SOURCE_DIR")) return s;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
}

// The build tree: SLIM_BINARY_DIR when set, else two levels above the test binary
// (BUILD/src/slim_trust_tests).
inline std::filesystem::path binary_dir() {
  if (const char* b = std::getenv("SLIM_BINARY_DIR")) return b;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path("build") : exe.parent_path().parent_path();
}

inline void write_file(const std::filesystem::path& p, const std::string& data) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(data.data(), std::streamsize(data.size()));
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = char(rng() & 0xff);
  return s;
}

// Runs fn, expects a slim::Error with `code` whose message contains every needle.
template <typename Fn>
void expect_error(Fn&& fn, ErrorCode code, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing " << *needles.begin();
  } catch (const Error& e) {
    EXPECT_EQ(error_code_name(e.code()), error_code_name(code)) << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline int run_shell(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace slim::trust::testing
