#include "slim/llm/gguf_tokenizer.h"

#include <cstdio>
#include <cstring>

#include "slim/core/error.h"

namespace slim::llm {

text::TokenizerSpec tokenizer_spec_from_gguf(const GgufFile& g) {
  text::TokenizerSpec spec;
  spec.source = g.path();
  spec.model = g.get_string("tokenizer.ggml.model");
  spec.pre = g.get_string("tokenizer.ggml.pre", "");
  auto array = [&](const std::string& key, GgufValueType want) -> const GgufValue* {
    const GgufValue* v = g.find(key);
    if (!v) return nullptr;
    if (v->type != GgufValueType::array || v->array_type != want)
      throw Error(ErrorCode::invalid_model, g.path() + ": metadata '" + key + "' has the wrong type");
    return v;
  };
  const GgufValue* tokens = array("tokenizer.ggml.tokens", GgufValueType::string);
  if (!tokens) throw Error(ErrorCode::not_found, g.path() + ": metadata 'tokenizer.ggml.tokens' is missing");
  spec.tokens = tokens->strings;
  if (const GgufValue* v = array("tokenizer.ggml.scores", GgufValueType::f32))
    spec.scores.assign(v->numbers.begin(), v->numbers.end());
  if (const GgufValue* v = array("tokenizer.ggml.token_type", GgufValueType::i32))
    spec.token_types.assign(v->integers.begin(), v->integers.end());
  if (const GgufValue* v = array("tokenizer.ggml.merges", GgufValueType::string)) spec.merges = v->strings;
  auto id = [&](const std::string& key) -> int32_t {
    if (!g.has(key)) return -1;
    const int64_t v = g.get_int(key);
    if (v < 0 || v >= int64_t(spec.tokens.size()))
      throw Error(ErrorCode::invalid_model, g.path() + ": " + key + " = " + std::to_string(v) + " is outside the vocabulary");
    return int32_t(v);
  };
  spec.bos_id = id("tokenizer.ggml.bos_token_id");
  spec.eos_id = id("tokenizer.ggml.eos_token_id");
  spec.unk_id = id("tokenizer.ggml.unknown_token_id");
  spec.pad_id = id("tokenizer.ggml.padding_token_id");
  // llama.cpp's defaults: SentencePiece models add BOS unless told otherwise.
  spec.add_bos = g.get_bool("tokenizer.ggml.add_bos_token", spec.model == "llama");
  spec.add_eos = g.get_bool("tokenizer.ggml.add_eos_token", false);
  spec.add_space_prefix = g.get_bool("tokenizer.ggml.add_space_prefix", true);
  spec.ignore_merges = spec.pre == "llama-bpe" || spec.pre == "llama3";
  return spec;
}

std::unique_ptr<text::Tokenizer> load_gguf_tokenizer(const GgufFile& file) {
  return text::Tokenizer::create(tokenizer_spec_from_gguf(file));
}

bool is_gguf_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char magic[4] = {};
  const bool ok = std::fread(magic, 1, 4, f) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
  std::fclose(f);
  return ok;
}

}  // namespace slim::llm
