// Pre-tokenizers of byte-level BPE: split text into words before BPE, as the regexes that
// tokenizer.ggml.pre names do. The regexes are hand-compiled into matchers over code
// points so the result equals the regex engines (Python `regex`, Oniguruma) that the
// reference tokenizers use, including their backtracking on \s+(?!\S).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace slim::text {

enum class SplitPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  gpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  llama3,
  // as llama3 with \p{N} instead of \p{N}{1,3}
  qwen2,
  // \p{N}, each digit its own word (StarCoder-style models run it before gpt2)
  single_digits,
  // [\p{P}$+<=>^~|]+ ; \p{N}+ ; [0-9]{3} : the stages llama.cpp's "default" pre-tokenizer
  // runs around the GPT-2 regex. Each isolates its matches; the text between them stays.
  punctuation_runs,
  number_runs,
  ascii_digit_triples,
};

class PreTokenizer {
 public:
  // Throws unsupported for a name it does not know, naming `source`.
  static PreTokenizer from_name(const std::string& pre, const std::string& source);
  explicit PreTokenizer(std::vector<SplitPattern> stages) : stages_(std::move(stages)) {}

  // Splits text into consecutive non-empty words that concatenate back to text.
  std::vector<std::string_view> split(std::string_view text) const;
  const std::vector<SplitPattern>& stages() const { return stages_; }

 private:
  std::vector<SplitPattern> stages_;
};

}  // namespace slim::text
