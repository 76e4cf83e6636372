// Finds the tokenizer a file holds. text/ reads Hugging Face tokenizer.json itself; modules
// on higher floors (llm/ for GGUF) register a loader here, so `slim tokenize MODEL` works
// for every format without text/ depending on them.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "slim/text/tokenizer.h"

namespace slim::text {

struct TokenizerLoader {
  std::string name;                                    // e.g. "GGUF", for messages
  std::function<bool(const std::string& path)> accepts;  // cheap check: magic or extension
  std::function<std::unique_ptr<Tokenizer>(const std::string& path)> load;
};

// Later registrations are tried first. Typically called from a static registrar in a
// tools/slim/cmd_*.cc file, which is always linked into the CLI.
void register_tokenizer_loader(TokenizerLoader loader);

// The first registered loader that accepts the path, else tokenizer.json.
// Throws not_found for a missing file and what the loader throws for a bad one.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace slim::text
