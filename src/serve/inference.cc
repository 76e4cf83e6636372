#include "slim/serve/inference.h"

namespace slim::serve {

int http_status_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
    case ErrorCode::invalid_model:
    case ErrorCode::unsupported: return 400;
    case ErrorCode::not_found: return 404;
    case ErrorCode::resource_exhausted: return 429;
    case ErrorCode::unavailable: return 503;
    case ErrorCode::integrity:
    case ErrorCode::internal: return 500;
  }
  return 500;
}

// gRPC status codes (grpc/status.h numbering, which the protocol fixes).
int grpc_status_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
    case ErrorCode::invalid_model: return 3;   // INVALID_ARGUMENT
    case ErrorCode::unsupported: return 12;    // UNIMPLEMENTED
    case ErrorCode::not_found: return 5;       // NOT_FOUND
    case ErrorCode::resource_exhausted: return 8;  // RESOURCE_EXHAUSTED
    case ErrorCode::unavailable: return 14;    // UNAVAILABLE
    case ErrorCode::integrity: return 15;      // DATA_LOSS
    case ErrorCode::internal: return 13;       // INTERNAL
  }
  return 13;
}

}  // namespace slim::serve
