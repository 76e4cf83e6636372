// Shared by the text/ tests: runs tests/fixtures/make_token_fixtures.py once per test
// binary and reads its JSON output.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include <unistd.h>

namespace slim::text::testing {

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// Directory with the generated fixtures. ctest runs every test in its own process, so
// the output is cached under SLIM_TEST_TMP keyed by a hash of the script, and built in a
// private staging folder that is renamed into place: concurrent test processes never see
// a half-written set.
inline const std::string& fixture_dir() {
  static const std::string dir = [] {
    // ctest sets SLIM_SOURCE_DIR; run by hand, the binary finds the tree from this file.
    const std::string here = __FILE__;
    const std::string source =
        env_or("SLIM_SOURCE_DIR", here.substr(0, here.rfind("/tests/text/")));
    const std::string script = source + "/tests/fixtures/make_token_fixtures.py";
    const std::string tmp = env_or("SLIM_TEST_TMP", std::filesystem::temp_directory_path());
    const std::string key = std::to_string(std::hash<std::string>{}(read_text(script)));
    const std::string out = tmp + "/text_fixtures_" + key;
    if (std::filesystem::exists(out + "/done")) return out;
    const std::string staging = out + ".staging" + std::to_string(::getpid());
    std::filesystem::create_directories(staging);
    const std::string cmd = "/usr/bin/python3 '" + script + "' '" + staging + "'";
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << "fixture script failed: " << cmd;
    std::error_code ec;
    if (rc != 0) {
      std::filesystem::remove_all(staging, ec);
      return staging;  // absent: every fixture read fails and says which file
    }
    std::filesystem::rename(staging, out, ec);
    if (ec) std::filesystem::remove_all(staging, ec);  // another process finished first
    return out;
  }();
  return dir;
}

inline nlohmann::json fixture_json(const std::string& name) {
  const std::string path = fixture_dir() + "/" + name;
  const std::string text = read_text(path);
  EXPECT_FALSE(text.empty()) << "missing fixture " << path;
  return nlohmann::json::parse(text);
}

}  // namespace slim::text::testing
