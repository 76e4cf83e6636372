// Test fixtures for the forest tests: runs a generator script under tests/fixtures once
// (into the build's test_tmp, keyed by the script's content) and reads its .npy files.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "slim/core/npy.h"

namespace slim::forest::testing {

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

inline std::string read_text(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  std::stringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

// A new empty directory SLIM_TEST_TMP/<name><pid> (/tmp without it) for one test's files.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const std::filesystem::path d =
      std::filesystem::path(env_or("SLIM_TEST_TMP", "/tmp")) / (name + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Returns the directory the script filled, generating it when needed. Concurrent test
// processes each write a private directory and the first rename wins.
inline std::string fixture_dir(const std::string& script_name) {
  namespace fs = std::filesystem;
  const std::string src = env_or("SLIM_SOURCE_DIR", SLIM_TEST_SOURCE_DIR);
  const std::string script = src + "/tests/fixtures/" + script_name;
  const std::string text = read_text(script);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  const std::string root = env_or("SLIM_TEST_TMP", fs::temp_directory_path().string() + "/slim_test_tmp");
  fs::create_directories(root);
  const std::string dir = root + "/" + script_name + "." + std::to_string(h);
  if (fs::exists(dir + "/index.txt")) return dir;
  const std::string tmp = dir + ".tmp" + std::to_string(::getpid());
  fs::remove_all(tmp);
  const std::string cmd = "/usr/bin/python3 '" + script + "' '" + tmp + "' > '" + tmp + ".log' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "fixture script failed: " << cmd << "\n" << read_text(tmp + ".log");
    return dir;
  }
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) fs::remove_all(tmp);  // another process won the race
  fs::remove(tmp + ".log", ec);
  return dir;
}

inline std::vector<std::string> fixture_names(const std::string& dir) {
  std::vector<std::string> names;
  std::stringstream ss(read_text(dir + "/index.txt"));
  std::string line;
  while (std::getline(ss, line))
    if (!line.empty()) names.push_back(line);
  return names;
}

}  // namespace slim::forest::testing
