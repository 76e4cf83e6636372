// Tokenizers: text <-> token IDs for language models. Two model kinds cover the GGUF
// files slim runs: `llama` (SentencePiece BPE driven by scores, byte fallback) and `gpt2`
// (byte-level BPE driven by merge ranks, with a named pre-tokenizer regex).
// A TokenizerSpec is plain data so the GGUF loader (llm/) can fill it from the
// tokenizer.ggml.* keys without this module knowing about GGUF.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace slim::text {

// Same numbering as GGUF's tokenizer.ggml.token_type (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,       // BOS/EOS and other special tokens; never produced from plain text
  user_defined = 4,  // added tokens, matched verbatim before pre-tokenization
  unused = 5,
  byte = 6,          // <0xXX> byte-fallback tokens of the llama model
};

struct TokenizerSpec {
  std::string model;  // "llama" (SentencePiece BPE) or "gpt2" (byte-level BPE)
  // gpt2 pre-tokenizer (tokenizer.ggml.pre): "gpt-2", "llama-bpe"/"llama3", "qwen2",
  // "starcoder"/"smollm" and other llama.cpp names sharing those regexes. Empty or
  // "default" is llama.cpp's default: punctuation runs, the GPT-2 regex, digit groups.
  std::string pre;
  std::vector<std::string> tokens;    // token text, indexed by ID
  std::vector<float> scores;          // llama: merge priority per token; may be empty for gpt2
  std::vector<int32_t> token_types;   // TokenType values; empty means all normal
  std::vector<std::string> merges;    // gpt2: "left right", rank = position
  int32_t bos_id = -1;                // -1 = none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
  bool add_eos = false;
  // llama: prepend U+2581 to the text before encoding (SentencePiece add_dummy_prefix,
  // GGUF tokenizer.ggml.add_space_prefix). Ignored by gpt2.
  bool add_space_prefix = true;
  // gpt2: a word that is itself a token is emitted whole without running merges
  // (Llama 3's tokenizer.json sets ignore_merges; llama.cpp does it for llama-bpe).
  bool ignore_merges = false;
  // Where the spec came from, for error messages (a file path or "GGUF metadata").
  std::string source = "tokenizer spec";
};

struct EncodeOptions {
  bool add_special = true;    // add BOS/EOS as the spec's add_bos/add_eos say
  bool parse_special = true;  // match control/user-defined token text inside the input
};

class Tokenizer {
 public:
  // Validates the spec (sizes agree, IDs in range, merges name known tokens, the
  // pre-tokenizer is known) and builds the lookup tables. Throws invalid_model or
  // unsupported, naming spec.source and the field.
  static std::unique_ptr<Tokenizer> create(const TokenizerSpec& spec);
  // Loads a Hugging Face tokenizer.json with a BPE model: byte-level (GPT-2 style
  // pre-tokenizer and decoder) or SentencePiece-style (Metaspace / byte_fallback).
  static std::unique_ptr<Tokenizer> from_hf_json(const std::string& path);
  static std::unique_ptr<Tokenizer> from_hf_json_text(std::string_view json,
                                                      const std::string& source);
  // The spec a tokenizer.json describes, for callers that want to adjust it.
  static TokenizerSpec spec_from_hf_json_text(std::string_view json, const std::string& source);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Invalid UTF-8 in the input is encoded byte by byte (byte-level BPE and byte fallback
  // are lossless for it); it never throws for any input bytes.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Concatenated bytes of the tokens; control tokens are dropped when skip_special.
  // Throws invalid_argument for an ID outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes one token stands for (byte-level decoded, U+2581 as space, <0xXX> as a byte).
  std::string token_to_piece(int32_t id) const;

  int32_t vocab_size() const;
  const std::string& token_text(int32_t id) const;  // the vocabulary string
  std::optional<int32_t> token_id(std::string_view token_text) const;
  TokenType token_type(int32_t id) const;
  const TokenizerSpec& spec() const;
  int32_t bos_id() const { return spec().bos_id; }
  int32_t eos_id() const { return spec().eos_id; }

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slim::text
