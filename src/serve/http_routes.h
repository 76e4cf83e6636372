// What the HTTP front door's route sets share: the routes of the OpenAI API (openai.cc)
// are registered on the same server as KServe v2's (http.cc).
#pragma once

#include <httplib.h>

#include <exception>
#include <string>

#include "slim/core/error.h"
#include "slim/serve/inference.h"
#include "slim/serve/server.h"

namespace slim::serve {

// Runs a handler; whatever it throws becomes an error response through
// fail(status, message), never a dropped connection.
template <typename Fn, typename Fail>
void run_guarded(Fn&& fn, Fail&& fail) {
  try {
    fn();
  } catch (const Error& e) {
    fail(http_status_for(e.code()), e.what());
  } catch (const std::exception& e) {
    fail(500, e.what());
  }
}

void add_openai_routes(httplib::Server& http, InferenceServer& server);

}  // namespace slim::serve
