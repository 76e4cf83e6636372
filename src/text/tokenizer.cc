#include "slim/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <queue>
#include <unordered_map>

#include "slim/core/error.h"
#include "slim/text/pretokenizer.h"
#include "slim/text/unicode.h"

namespace slim::text {

namespace {

constexpr std::string_view kSpaceMarker = "\xe2\x96\x81";  // U+2581, SentencePiece's space
constexpr std::string_view kUnknownPiece = "\xe2\x96\x85";  // U+2585, as llama.cpp shows <unk>

// GPT-2's byte <-> unicode map: printable Latin-1 bytes stand for themselves, the other
// 68 bytes get code points from U+0100 up, so every byte has a visible, non-space char.
std::array<uint32_t, 256> make_byte_to_unicode() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    map[b] = printable ? b : next++;
  }
  return map;
}

const std::array<uint32_t, 256>& byte_to_unicode() {
  static const std::array<uint32_t, 256> map = make_byte_to_unicode();
  return map;
}

std::string hex_byte_token(uint8_t b) {
  static const char* digits = "0123456789ABCDEF";
  std::string s = "<0x";
  s.push_back(digits[b >> 4]);
  s.push_back(digits[b & 15]);
  s.push_back('>');
  return s;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

// A piece of input: raw text to tokenize, or a special token already matched.
struct Fragment {
  std::string_view text;
  int32_t token = -1;
};

}  // namespace

struct Tokenizer::Impl {
  TokenizerSpec spec;
  bool byte_level = false;
  std::unordered_map<std::string, int32_t> ids;
  std::vector<TokenType> types;
  std::vector<std::string> pieces;  // decoded bytes per token

  // Special tokens by first byte, longest first, for leftmost-longest matching.
  std::array<std::vector<int32_t>, 256> specials_by_byte;

  // gpt2
  std::optional<PreTokenizer> pre;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (l,r) -> (rank, id)
  std::array<int32_t, 256> byte_char_ids{};                          // -1: not in vocab

  // llama
  std::array<int32_t, 256> byte_fallback_ids{};  // <0xXX> tokens, -1: absent

  std::vector<Fragment> split_specials(std::string_view text, bool parse_special) const;
  void encode_gpt2_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_llama_text(std::string_view text, std::vector<int32_t>& out) const;
  void push_byte_fallback(std::string_view bytes, std::vector<int32_t>& out) const;
};

namespace {

std::string field_error(const TokenizerSpec& spec, const std::string& what) {
  return spec.source + ": " + what;
}

void validate_id(const TokenizerSpec& spec, int32_t id, const char* name) {
  check(id == -1 || (id >= 0 && static_cast<size_t>(id) < spec.tokens.size()),
        ErrorCode::invalid_model,
        field_error(spec, std::string(name) + " " + std::to_string(id) +
                              " is outside the vocabulary of " +
                              std::to_string(spec.tokens.size()) + " tokens"));
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::create(const TokenizerSpec& spec_in) {
  auto impl = std::make_unique<Impl>();
  impl->spec = spec_in;
  const TokenizerSpec& spec = impl->spec;
  const size_t n = spec.tokens.size();

  if (spec.model == "gpt2") {
    impl->byte_level = true;
  } else if (spec.model != "llama") {
    throw Error(ErrorCode::unsupported,
                field_error(spec, "tokenizer model '" + spec.model +
                                      "' is not supported (expected llama or gpt2)"));
  }
  check(n > 0, ErrorCode::invalid_model, field_error(spec, "the vocabulary is empty"));
  check(n <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), ErrorCode::invalid_model,
        field_error(spec, "vocabulary of " + std::to_string(n) + " tokens is too large"));
  check(spec.scores.empty() || spec.scores.size() == n, ErrorCode::invalid_model,
        field_error(spec, "scores has " + std::to_string(spec.scores.size()) +
                              " entries for " + std::to_string(n) + " tokens"));
  check(spec.token_types.empty() || spec.token_types.size() == n, ErrorCode::invalid_model,
        field_error(spec, "token_type has " + std::to_string(spec.token_types.size()) +
                              " entries for " + std::to_string(n) + " tokens"));
  validate_id(spec, spec.bos_id, "bos_token_id");
  validate_id(spec, spec.eos_id, "eos_token_id");
  validate_id(spec, spec.unk_id, "unknown_token_id");
  validate_id(spec, spec.pad_id, "padding_token_id");
  check(!spec.add_bos || spec.bos_id >= 0, ErrorCode::invalid_model,
        field_error(spec, "add_bos_token is set but there is no bos_token_id"));
  check(!spec.add_eos || spec.eos_id >= 0, ErrorCode::invalid_model,
        field_error(spec, "add_eos_token is set but there is no eos_token_id"));

  impl->types.resize(n, TokenType::normal);
  for (size_t i = 0; i < spec.token_types.size(); ++i) {
    const int32_t t = spec.token_types[i];
    check(t >= 0 && t <= 6, ErrorCode::invalid_model,
          field_error(spec, "token " + std::to_string(i) + " has unknown token type " +
                                std::to_string(t)));
    impl->types[i] = t == 0 ? TokenType::normal : static_cast<TokenType>(t);
  }

  impl->ids.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    // Some vocabularies repeat a string; the first ID wins, as in the reference loaders.
    impl->ids.emplace(spec.tokens[i], static_cast<int32_t>(i));
  }

  // Tokens matched verbatim before pre-tokenization. Empty ones would match everywhere.
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = impl->types[i];
    if ((t == TokenType::control || t == TokenType::user_defined ||
         t == TokenType::unknown) &&
        !spec.tokens[i].empty()) {
      impl->specials_by_byte[static_cast<uint8_t>(spec.tokens[i][0])].push_back(
          static_cast<int32_t>(i));
    }
  }
  for (auto& list : impl->specials_by_byte) {
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return spec.tokens[a].size() > spec.tokens[b].size();
    });
  }

  impl->byte_char_ids.fill(-1);
  impl->byte_fallback_ids.fill(-1);
  std::unordered_map<uint32_t, uint8_t> unicode_to_byte;
  if (impl->byte_level) {
    impl->pre = PreTokenizer::from_name(spec.pre, spec.source);
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      unicode::append_utf8(ch, byte_to_unicode()[b]);
      auto it = impl->ids.find(ch);
      if (it != impl->ids.end()) impl->byte_char_ids[b] = it->second;
      unicode_to_byte[byte_to_unicode()[b]] = static_cast<uint8_t>(b);
    }
    impl->merges.reserve(spec.merges.size() * 2);
    for (size_t r = 0; r < spec.merges.size(); ++r) {
      const std::string& m = spec.merges[r];
      // Split at the first space after the first character: a part never contains a
      // space in byte-level vocabularies (space is U+0120).
      const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      check(sp != std::string::npos && sp + 1 < m.size(), ErrorCode::invalid_model,
            field_error(spec, "merge " + std::to_string(r) + " '" + m +
                                  "' is not two space-separated tokens"));
      const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
      auto l = impl->ids.find(left), rr = impl->ids.find(right),
           res = impl->ids.find(left + right);
      check(l != impl->ids.end() && rr != impl->ids.end() && res != impl->ids.end(),
            ErrorCode::invalid_model,
            field_error(spec, "merge " + std::to_string(r) + " '" + m +
                                  "' names a token that is not in the vocabulary"));
      const uint64_t key = (static_cast<uint64_t>(l->second) << 32) |
                           static_cast<uint32_t>(rr->second);
      // A repeated merge keeps its first (highest-priority) rank.
      impl->merges.emplace(key, std::make_pair(static_cast<int32_t>(r), res->second));
    }
  } else {
    for (int b = 0; b < 256; ++b) {
      auto it = impl->ids.find(hex_byte_token(static_cast<uint8_t>(b)));
      if (it != impl->ids.end()) impl->byte_fallback_ids[b] = it->second;
    }
    const bool all_bytes =
        std::all_of(impl->byte_fallback_ids.begin(), impl->byte_fallback_ids.end(),
                    [](int32_t id) { return id >= 0; });
    check(all_bytes || spec.unk_id >= 0, ErrorCode::invalid_model,
          field_error(spec, "llama tokenizer has neither all 256 <0xXX> byte tokens nor an "
                            "unknown token, so some text could not be encoded"));
  }

  // What each token decodes to.
  impl->pieces.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& tok = spec.tokens[i];
    const TokenType t = impl->types[i];
    std::string& piece = impl->pieces[i];
    if (t == TokenType::control || t == TokenType::unused) {
      piece = tok;
    } else if (impl->byte_level) {
      if (t == TokenType::user_defined) {
        piece = tok;
        continue;
      }
      for (const auto& cp : unicode::decode_utf8(tok)) {
        auto it = unicode_to_byte.find(cp.cp);
        if (it != unicode_to_byte.end()) {
          piece.push_back(static_cast<char>(it->second));
        } else {
          // Not a byte-level character: the token stands for its own UTF-8.
          piece.append(tok, cp.offset, cp.length);
        }
      }
    } else if (t == TokenType::byte) {
      int value = -1;
      for (int b = 0; b < 256; ++b) {
        if (impl->byte_fallback_ids[b] == static_cast<int32_t>(i)) value = b;
      }
      if (value < 0 && tok.size() == 6 && tok.rfind("<0x", 0) == 0 && tok[5] == '>') {
        value = static_cast<int>(std::strtol(tok.substr(3, 2).c_str(), nullptr, 16));
      }
      check(value >= 0, ErrorCode::invalid_model,
            field_error(spec, "byte token " + std::to_string(i) + " '" + tok +
                                  "' is not of the form <0xXX>"));
      piece.assign(1, static_cast<char>(value));
    } else if (t == TokenType::unknown) {
      piece = kUnknownPiece;
    } else {
      piece = replace_all(tok, kSpaceMarker, " ");
    }
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<Fragment> Tokenizer::Impl::split_specials(std::string_view text,
                                                      bool parse_special) const {
  std::vector<Fragment> out;
  size_t start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t hit = -1;
    for (int32_t id : specials_by_byte[static_cast<uint8_t>(text[pos])]) {
      // Control tokens (BOS, <|im_start|>) come from text only when the caller asks;
      // user-defined tokens are part of the vocabulary's plain text.
      if (!parse_special && types[id] != TokenType::user_defined) continue;
      const std::string& tok = spec.tokens[id];
      if (text.compare(pos, tok.size(), tok) == 0) {
        hit = id;
        break;  // longest first
      }
    }
    if (hit < 0) {
      ++pos;
      continue;
    }
    if (pos > start) out.push_back({text.substr(start, pos - start), -1});
    out.push_back({{}, hit});
    pos += spec.tokens[hit].size();
    start = pos;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
  return out;
}

void Tokenizer::Impl::encode_gpt2_word(std::string_view word, std::vector<int32_t>& out) const {
  if (spec.ignore_merges) {
    std::string mapped;
    for (char c : word) unicode::append_utf8(mapped, byte_to_unicode()[static_cast<uint8_t>(c)]);
    auto it = ids.find(mapped);
    if (it != ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  for (char c : word) {
    const int32_t id = byte_char_ids[static_cast<uint8_t>(c)];
    // A byte the vocabulary lacks is dropped, as Hugging Face's BPE without an unknown
    // token does; the unknown token stands in when there is one.
    if (id < 0) {
      if (spec.unk_id >= 0) syms.push_back({spec.unk_id, 0, 0});
      continue;
    }
    syms.push_back({id, 0, 0});
  }
  const int32_t count = static_cast<int32_t>(syms.size());
  for (int32_t i = 0; i < count; ++i) {
    syms[i].prev = i - 1;
    syms[i].next = i + 1 < count ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, left, right, left_id, right_id, result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = syms[left].next;
    if (right < 0) return;
    const uint64_t key = (static_cast<uint64_t>(syms[left].id) << 32) |
                         static_cast<uint32_t>(syms[right].id);
    auto it = merges.find(key);
    if (it == merges.end()) return;
    heap.push({it->second.first, left, right, syms[left].id, syms[right].id, it->second.second});
  };
  for (int32_t i = 0; i + 1 < count; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = syms[c.left];
    // Stale: one side merged since the candidate was queued.
    if (l.id != c.left_id || l.next != c.right || syms[c.right].id != c.right_id) continue;
    Symbol& r = syms[c.right];
    l.id = c.result;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.id = -1;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = count > 0 ? 0 : -1; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

void Tokenizer::Impl::push_byte_fallback(std::string_view bytes, std::vector<int32_t>& out) const {
  for (char c : bytes) {
    const int32_t id = byte_fallback_ids[static_cast<uint8_t>(c)];
    out.push_back(id >= 0 ? id : spec.unk_id);
  }
}

// SentencePiece BPE as llama.cpp runs it: start from characters and repeatedly merge the
// adjacent pair whose concatenation is the highest-scoring vocabulary entry (leftmost on
// ties); characters the vocabulary lacks fall back to <0xXX> byte tokens.
void Tokenizer::Impl::encode_llama_text(std::string_view text, std::vector<int32_t>& out) const {
  struct Symbol {
    uint32_t offset, length;
    int32_t prev, next;
  };
  std::vector<Symbol> syms;
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = unicode::utf8_sequence_length(text, pos);
    const int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(len), idx - 1, idx + 1});
    pos += len;
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  struct Candidate {
    float score;
    int32_t left, right;
    uint32_t length;
    bool operator<(const Candidate& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Candidate> heap;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = syms[left].next;
    if (right < 0) return;
    const std::string_view pair =
        text.substr(syms[left].offset, syms[left].length + syms[right].length);
    auto it = ids.find(std::string(pair));
    if (it == ids.end()) return;
    const float score = spec.scores.empty() ? 0.0f : spec.scores[it->second];
    heap.push({score, left, right, static_cast<uint32_t>(pair.size())});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = syms[c.left];
    Symbol& r = syms[c.right];
    // Lengths only grow, so a changed sum means one side was merged since.
    if (l.length == 0 || r.length == 0 || l.next != c.right || l.length + r.length != c.length)
      continue;
    l.length += r.length;
    r.length = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].offset, syms[i].length);
    auto it = ids.find(std::string(piece));
    if (it != ids.end() && types[it->second] != TokenType::unused) {
      out.push_back(it->second);
    } else {
      push_byte_fallback(piece, out);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (options.add_special && m.spec.add_bos) out.push_back(m.spec.bos_id);
  // llama.cpp puts the SentencePiece dummy space before every text fragment that starts
  // the input or follows a special token.
  bool prev_special = true;
  for (const Fragment& f : m.split_specials(text, options.parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    if (m.byte_level) {
      for (std::string_view word : m.pre->split(f.text)) m.encode_gpt2_word(word, out);
    } else {
      std::string escaped;
      if (m.spec.add_space_prefix && prev_special) escaped.append(kSpaceMarker);
      escaped.append(replace_all(f.text, " ", kSpaceMarker));
      m.encode_llama_text(escaped, out);
    }
    prev_special = false;
  }
  if (options.add_special && m.spec.add_eos) out.push_back(m.spec.eos_id);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out;
  // SentencePiece's dummy prefix is removed again: a space that opens the first text
  // token (after any control tokens such as BOS) came from encode, not from the user.
  bool strip_space = !m.byte_level && m.spec.add_space_prefix;
  for (int32_t id : ids) {
    check(id >= 0 && id < vocab_size(), ErrorCode::invalid_argument,
          "token ID " + std::to_string(id) + " is outside the vocabulary of " +
              std::to_string(vocab_size()) + " tokens");
    const TokenType t = m.types[id];
    if (t == TokenType::control) {
      if (!skip_special) out.append(m.pieces[id]);
      continue;
    }
    std::string_view piece = m.pieces[id];
    if (strip_space && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    strip_space = false;
    out.append(piece);
  }
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  check(id >= 0 && id < vocab_size(), ErrorCode::invalid_argument,
        "token ID " + std::to_string(id) + " is outside the vocabulary of " +
            std::to_string(vocab_size()) + " tokens");
  return impl_->pieces[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->spec.tokens.size()); }

const std::string& Tokenizer::token_text(int32_t id) const {
  check(id >= 0 && id < vocab_size(), ErrorCode::invalid_argument,
        "token ID " + std::to_string(id) + " is outside the vocabulary of " +
            std::to_string(vocab_size()) + " tokens");
  return impl_->spec.tokens[id];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token_text) const {
  auto it = impl_->ids.find(std::string(token_text));
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

TokenType Tokenizer::token_type(int32_t id) const {
  check(id >= 0 && id < vocab_size(), ErrorCode::invalid_argument,
        "token ID " + std::to_string(id) + " is outside the vocabulary of " +
            std::to_string(vocab_size()) + " tokens");
  return impl_->types[id];
}

const TokenizerSpec& Tokenizer::spec() const { return impl_->spec; }

}  // namespace slim::text
