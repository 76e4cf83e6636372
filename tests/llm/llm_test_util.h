// Fixture access for the llm tests: tests/fixtures/make_gguf.py is run once per build
// tree (atomically, so parallel test processes share one copy).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "slim/core/npy.h"

namespace slim::llm::testing {

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

inline std::string tmp_dir() {
  const std::string d = env_or("SLIM_TEST_TMP", "/tmp/slim_test_tmp");
  std::filesystem::create_directories(d);
  return d;
}

// The source tree: $SLIM_SOURCE_DIR, else the CMAKE_HOME_DIRECTORY of the CMakeCache.txt
// above the test binary (ctest does not always pass every variable of a test's ENVIRONMENT).
inline std::string source_dir() {
  if (const char* v = std::getenv("SLIM_SOURCE_DIR"); v && *v) return v;
  namespace fs = std::filesystem;
  for (fs::path d = fs::canonical("/proc/self/exe").parent_path(); !d.empty() && d != d.root_path();
       d = d.parent_path()) {
    std::ifstream cache(d / "CMakeCache.txt");
    for (std::string line; std::getline(cache, line);)
      if (line.rfind("CMAKE_HOME_DIRECTORY:INTERNAL=", 0) == 0) return line.substr(line.find('=') + 1);
  }
  return ".";
}

// Directory with the generated GGUF fixtures and their NumPy references.
inline const std::string& fixture_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const std::string src = source_dir();
    const std::string script = src + "/tests/fixtures/make_gguf.py";
    const std::string stamp = std::to_string(fs::last_write_time(script).time_since_epoch().count());
    const std::string out = tmp_dir() + "/llm_fixtures_" + stamp;
    if (!fs::exists(out + "/done")) {
      const std::string staging = out + ".tmp" + std::to_string(::getpid());
      const std::string cmd = "/usr/bin/python3 '" + script + "' '" + staging + "' && touch '" + staging + "/done'";
      if (std::system(cmd.c_str()) != 0) throw std::runtime_error("fixture script failed: " + cmd);
      std::error_code ec;
      fs::rename(staging, out, ec);
      if (ec) fs::remove_all(staging);  // another process won the race
    }
    return out;
  }();
  return dir;
}

inline std::string fixture(const std::string& name) { return fixture_dir() + "/" + name; }

}  // namespace slim::llm::testing
