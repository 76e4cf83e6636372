#include "slim/text/pretokenizer.h"

#include <cstdint>

#include "slim/core/error.h"
#include "slim/text/unicode.h"

namespace slim::text {
namespace {

using unicode::CodePoint;

// The matchers see only [begin, end): the end of a fragment (after special tokens were
// split out) is the end of the string for the regex, as in the reference tokenizers.
struct Cursor {
  const std::vector<CodePoint>& cps;
  size_t end;
  uint32_t at(size_t i) const { return cps[i].cp; }
  bool letter(size_t i) const { return i < end && unicode::is_letter(at(i)); }
  bool number(size_t i) const { return i < end && unicode::is_number(at(i)); }
  bool space(size_t i) const { return i < end && unicode::is_whitespace(at(i)); }
  bool other(size_t i) const { return i < end && !letter(i) && !number(i) && !space(i); }
  bool newline(size_t i) const { return i < end && (at(i) == '\r' || at(i) == '\n'); }
  bool is(size_t i, char c) const { return i < end && at(i) == static_cast<uint32_t>(c); }
  bool is_ci(size_t i, char lower) const {
    return i < end && (at(i) == static_cast<uint32_t>(lower) ||
                       at(i) == static_cast<uint32_t>(lower - 'a' + 'A'));
  }
};

// 's 't 're 've 'm 'll 'd; returns the match end or pos when none matches.
size_t match_contraction(const Cursor& c, size_t pos, bool ignore_case) {
  if (!c.is(pos, '\'')) return pos;
  auto eq = [&](size_t i, char lower) { return ignore_case ? c.is_ci(i, lower) : c.is(i, lower); };
  const size_t p = pos + 1;
  if (eq(p, 's') || eq(p, 't') || eq(p, 'm') || eq(p, 'd')) return p + 1;
  if ((eq(p, 'r') && eq(p + 1, 'e')) || (eq(p, 'v') && eq(p + 1, 'e')) ||
      (eq(p, 'l') && eq(p + 1, 'l')))
    return p + 2;
  return pos;
}

size_t whitespace_run_end(const Cursor& c, size_t pos) {
  size_t k = pos;
  while (c.space(k)) ++k;
  return k;
}

// \s+(?!\S)|\s+ : a whitespace run gives its last character to the word that follows it.
size_t match_trailing_space(const Cursor& c, size_t pos) {
  const size_t k = whitespace_run_end(c, pos);
  if (k == pos) return pos;
  if (k == c.end) return k;
  if (k - 1 > pos) return k - 1;
  return k;
}

size_t match_gpt2(const Cursor& c, size_t pos) {
  size_t m = match_contraction(c, pos, false);
  if (m > pos) return m;
  const size_t q = c.is(pos, ' ') ? pos + 1 : pos;
  if (c.letter(q)) {
    size_t j = q;
    while (c.letter(j)) ++j;
    return j;
  }
  if (c.number(q)) {
    size_t j = q;
    while (c.number(j)) ++j;
    return j;
  }
  if (c.other(q)) {
    size_t j = q;
    while (c.other(j)) ++j;
    return j;
  }
  m = match_trailing_space(c, pos);
  return m > pos ? m : pos + 1;
}

size_t match_llama3(const Cursor& c, size_t pos, size_t max_digits) {
  size_t m = match_contraction(c, pos, true);
  if (m > pos) return m;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = pos;
    if (pos < c.end && !c.newline(pos) && !c.letter(pos) && !c.number(pos)) ++j;
    if (c.letter(j)) {
      while (c.letter(j)) ++j;
      return j;
    }
  }
  // \p{N}{1,max}
  if (c.number(pos)) {
    size_t j = pos;
    while (j - pos < max_digits && c.number(j)) ++j;
    return j;
  }
  // ' '?[^\s\p{L}\p{N}]+[\r\n]*
  {
    const size_t q = c.is(pos, ' ') ? pos + 1 : pos;
    if (c.other(q)) {
      size_t j = q;
      while (c.other(j)) ++j;
      while (c.newline(j)) ++j;
      return j;
    }
  }
  // \s*[\r\n]+ : ends after the last newline of the whitespace run
  {
    const size_t k = whitespace_run_end(c, pos);
    for (size_t j = k; j > pos; --j) {
      if (c.newline(j - 1)) return j;
    }
  }
  m = match_trailing_space(c, pos);
  return m > pos ? m : pos + 1;
}

bool is_punctuation_or_listed_symbol(uint32_t cp) {
  switch (cp) {
    case '$': case '+': case '<': case '=': case '>': case '^': case '~': case '|':
      return true;
    default:
      break;
  }
  using unicode::Category;
  switch (unicode::category(cp)) {
    case Category::Pc: case Category::Pd: case Category::Pe: case Category::Pf:
    case Category::Pi: case Category::Po: case Category::Ps:
      return true;
    default:
      return false;
  }
}

bool ascii_digit(const Cursor& c, size_t i) { return i < c.end && c.at(i) >= '0' && c.at(i) <= '9'; }

// Length of the match of an isolating stage at pos, 0 for none.
size_t isolated_match(SplitPattern pattern, const Cursor& c, size_t pos) {
  size_t j = pos;
  switch (pattern) {
    case SplitPattern::single_digits:
      return c.number(pos) ? 1 : 0;
    case SplitPattern::punctuation_runs:
      while (j < c.end && is_punctuation_or_listed_symbol(c.at(j))) ++j;
      return j - pos;
    case SplitPattern::number_runs:
      while (c.number(j)) ++j;
      return j - pos;
    case SplitPattern::ascii_digit_triples:
      return ascii_digit(c, pos) && ascii_digit(c, pos + 1) && ascii_digit(c, pos + 2) ? 3 : 0;
    default:
      return 0;
  }
}

void split_stage(SplitPattern pattern, const std::vector<CodePoint>& cps, size_t begin,
                 size_t end, std::vector<std::pair<size_t, size_t>>& out) {
  Cursor c{cps, end};
  size_t pos = begin;
  while (pos < end) {
    size_t next = pos + 1;
    switch (pattern) {
      case SplitPattern::gpt2: next = match_gpt2(c, pos); break;
      case SplitPattern::llama3: next = match_llama3(c, pos, 3); break;
      case SplitPattern::qwen2: next = match_llama3(c, pos, 1); break;
      default: {
        // Matches stand alone; the text between them stays one piece.
        const size_t m = isolated_match(pattern, c, pos);
        if (m > 0) {
          next = pos + m;
        } else {
          next = pos + 1;
          while (next < end && isolated_match(pattern, c, next) == 0) ++next;
        }
        break;
      }
    }
    out.emplace_back(pos, next);
    pos = next;
  }
}

}  // namespace

PreTokenizer PreTokenizer::from_name(const std::string& pre, const std::string& source) {
  // Names as llama.cpp's convert script writes tokenizer.ggml.pre; several models share
  // one regex.
  if (pre.empty() || pre == "default") {
    // What llama.cpp does for a BPE vocabulary without (or with the "default") pre name.
    return PreTokenizer({SplitPattern::punctuation_runs, SplitPattern::gpt2,
                         SplitPattern::number_runs, SplitPattern::ascii_digit_triples});
  }
  if (pre == "gpt-2" || pre == "gpt2" || pre == "phi-2" ||
      pre == "jina-es" || pre == "jina-de" || pre == "jina-v2-es" || pre == "jina-v2-de" ||
      pre == "jina-v2-code" || pre == "olmo" || pre == "mpt" || pre == "roberta-bpe")
    return PreTokenizer({SplitPattern::gpt2});
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe" || pre == "dbrx" ||
      pre == "falcon3")
    return PreTokenizer({SplitPattern::llama3});
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2" || pre == "hunyuan")
    return PreTokenizer({SplitPattern::qwen2});
  if (pre == "starcoder" || pre == "refact" || pre == "command-r" || pre == "smollm" ||
      pre == "codeshell" || pre == "exaone" || pre == "minerva-7b")
    return PreTokenizer({SplitPattern::single_digits, SplitPattern::gpt2});
  throw Error(ErrorCode::unsupported,
              source + ": tokenizer pre-tokenizer '" + pre +
                  "' is not supported (known: default, gpt-2, llama-bpe, qwen2, starcoder, ...)");
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  const std::vector<CodePoint> cps = unicode::decode_utf8(text);
  std::vector<std::pair<size_t, size_t>> ranges{{0, cps.size()}};
  if (cps.empty()) ranges.clear();
  std::vector<std::pair<size_t, size_t>> next;
  for (SplitPattern stage : stages_) {
    next.clear();
    for (auto [b, e] : ranges) split_stage(stage, cps, b, e, next);
    ranges.swap(next);
  }
  std::vector<std::string_view> words;
  words.reserve(ranges.size());
  for (auto [b, e] : ranges) {
    const size_t off = cps[b].offset;
    const size_t stop = cps[e - 1].offset + cps[e - 1].length;
    words.push_back(text.substr(off, stop - off));
  }
  return words;
}

}  // namespace slim::text
