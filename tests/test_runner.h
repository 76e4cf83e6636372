// How tests start the slim binary: through SLIM_TEST_RUNNER when it is set (the
// emulated-CPU tests: "qemu-x86_64 -cpu max", "valgrind -q --tool=none"), else through a
// cross build's emulator (SLIM_TEST_EMULATOR, from CMAKE_CROSSCOMPILING_EMULATOR), else
// directly.
#pragma once

#include <cstdlib>
#include <string>

namespace slim::test {

// The command-line prefix that starts slim, empty or ending in a space.
inline std::string slim_runner_prefix() {
  if (const char* r = std::getenv("SLIM_TEST_RUNNER"); r && *r) return std::string(r) + " ";
#ifdef SLIM_TEST_EMULATOR
  return SLIM_TEST_EMULATOR " ";
#else
  return "";
#endif
}

}  // namespace slim::test
