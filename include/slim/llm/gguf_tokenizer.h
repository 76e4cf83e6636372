// The tokenizer a GGUF file carries in its tokenizer.ggml.* metadata, handed to the text
// module as a plain TokenizerSpec (text/ knows nothing of GGUF).
#pragma once

#include <memory>
#include <string>

#include "slim/llm/gguf.h"
#include "slim/text/tokenizer.h"

namespace slim::llm {

// Throws not_found when the file has no tokenizer.ggml.model, invalid_model when the
// tokenizer keys have the wrong types or sizes.
text::TokenizerSpec tokenizer_spec_from_gguf(const GgufFile& file);
std::unique_ptr<text::Tokenizer> load_gguf_tokenizer(const GgufFile& file);
// True when the file starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

}  // namespace slim::llm
