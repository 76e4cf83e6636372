// slim::Error is the one exception type of the project: a code that says what kind of
// problem it is, and a message with the context (file, node, input) that found it.
// Throw where the problem is found; catch only at the front doors (CLI, server).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace slim {

enum class ErrorCode {
  invalid_argument,    // a caller passed something wrong (option, shape, name)
  invalid_model,       // a model or data file is malformed
  unsupported,         // valid, but slim does not implement it
  not_found,           // a named file, model, tensor or key does not exist
  resource_exhausted,  // a budget (memory, queue, KV blocks) is used up
  integrity,           // a digest, signature or chain does not match
  unavailable,         // cannot be served now: shutting down, not ready, timed out in a queue
  internal,            // a bug in slim
};

std::string_view error_code_name(ErrorCode code);

// Exit code a command-line front door returns for an error of this kind:
// 2 for bad input of any kind, 3 for integrity failures, 4 for exhausted resources and
// unavailable services,
// 1 for internal errors.
int exit_code_for(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Throws Error(code, message) when cond is false. For validating data read from files.
// The message is an argument, so it is built on every call: on hot paths, build it only
// when cond fails (if (!cond) throw Error(...)). A literal goes through the const char*
// overload and allocates nothing.
inline void check(bool cond, ErrorCode code, const std::string& message) {
  if (!cond) throw Error(code, message);
}
inline void check(bool cond, ErrorCode code, const char* message) {
  if (!cond) throw Error(code, message);
}

}  // namespace slim
