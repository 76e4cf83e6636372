// Registers the OpenAI API routes (openai.h) on the HTTP front door's server.
#pragma once

#include <httplib.h>

#include "slim/serve/server.h"

namespace slim::serve {

void add_openai_routes(httplib::Server& http, InferenceServer& server);

}  // namespace slim::serve
