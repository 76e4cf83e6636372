#include "slim/core/error.h"

namespace slim {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::invalid_model: return "invalid_model";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::not_found: return "not_found";
    case ErrorCode::resource_exhausted: return "resource_exhausted";
    case ErrorCode::integrity: return "integrity";
    case ErrorCode::unavailable: return "unavailable";
    case ErrorCode::internal: return "internal";
  }
  return "internal";
}

int exit_code_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::integrity: return 3;
    case ErrorCode::resource_exhausted:
    case ErrorCode::unavailable: return 4;
    case ErrorCode::internal: return 1;
    default: return 2;
  }
}

}  // namespace slim
