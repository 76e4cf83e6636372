// slim tokenize: text -> token IDs with a model's tokenizer, and the token-ID packing codec
// (--pack / --unpack). The tokenizer comes from any file load_tokenizer knows: a Hugging
// Face tokenizer.json, or a format a higher module registered (GGUF from llm/).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "commands.h"
#include "slim/core/error.h"
#include "slim/core/progress.h"
#include "slim/text/token_pack.h"
#include "slim/text/tokenizer.h"
#include "slim/text/tokenizer_loader.h"
#include "slim/text/unicode.h"

namespace slim::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::vector<std::string> positional;
  std::string file;
  bool ids_only = false;
  bool no_special = false;
  bool no_parse_special = false;
  std::string pack;
  std::string unpack;
  bool no_zstd = false;
  int level = 19;
  bool decode = false;
  bool skip_special = false;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::not_found, path + ": cannot open");
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

bool ascii_non_space(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u > 0x20 && u < 0x7f;
}

// Long files are encoded in chunks so progress can be shown. A byte-level tokenizer's
// pre-tokenizers always end a word after "\n" that sits between two non-space ASCII
// characters, and the regex sees the same context on both sides of such a cut, so the IDs
// equal those of one encode call. SentencePiece (llama) has no word split, so it is
// encoded whole, as are vocabularies whose special tokens contain a newline.
std::vector<int32_t> encode_with_progress(const text::Tokenizer& tok, const std::string& input,
                                          const text::EncodeOptions& options) {
  bool chunkable = tok.spec().model == "gpt2";
  for (int32_t id = 0; chunkable && id < tok.vocab_size(); ++id) {
    const auto t = tok.token_type(id);
    if ((t == text::TokenType::control || t == text::TokenType::user_defined) &&
        tok.token_text(id).find('\n') != std::string::npos)
      chunkable = false;
  }
  constexpr size_t kChunk = 1 << 16;
  if (!chunkable || input.size() <= kChunk) return tok.encode(input, options);

  std::vector<int32_t> ids;
  Progress progress("tokenize", static_cast<int64_t>(input.size()));
  text::EncodeOptions inner = options;
  inner.add_special = false;
  if (options.add_special && tok.spec().add_bos) ids.push_back(tok.spec().bos_id);
  size_t start = 0;
  while (start < input.size()) {
    size_t cut = input.size();
    for (size_t pos = start + kChunk; pos + 1 < input.size(); ++pos) {
      if (input[pos] == '\n' && ascii_non_space(input[pos - 1]) && ascii_non_space(input[pos + 1])) {
        cut = pos + 1;
        break;
      }
    }
    const auto part = tok.encode(std::string_view(input).substr(start, cut - start), inner);
    ids.insert(ids.end(), part.begin(), part.end());
    start = cut;
    progress.update(static_cast<int64_t>(start), std::to_string(ids.size()) + " tokens");
  }
  progress.finish();
  if (options.add_special && tok.spec().add_eos) ids.push_back(tok.spec().eos_id);
  return ids;
}

// Shows a token's bytes on one line: control characters escaped, and bytes that are not
// whole UTF-8 characters (one token may hold part of a character) as \xNN.
std::string printable(const std::string& piece) {
  std::string out;
  for (size_t pos = 0; pos < piece.size();) {
    const auto c = static_cast<unsigned char>(piece[pos]);
    const size_t len = text::unicode::utf8_sequence_length(piece, pos);
    if (len > 1) {
      out.append(piece, pos, len);
      pos += len;
      continue;
    }
    ++pos;
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line.push_back(' ');
    line += std::to_string(ids[i]);
  }
  std::cout << line << "\n";
}

void run_tokenize(TokenizeArgs& a) {
  std::string tokenizer_path = a.tokenizer;
  std::vector<std::string> rest = a.positional;
  if (tokenizer_path.empty() && a.unpack.empty()) {
    if (rest.empty())
      throw Error(ErrorCode::invalid_argument,
                  "give a tokenizer: slim tokenize --tokenizer tokenizer.json TEXT, or "
                  "slim tokenize MODEL TEXT");
    tokenizer_path = rest.front();
    rest.erase(rest.begin());
  }
  std::unique_ptr<text::Tokenizer> tok;
  if (!tokenizer_path.empty()) tok = text::load_tokenizer(tokenizer_path);

  if (!a.unpack.empty()) {
    if (!rest.empty() || !a.file.empty() || !a.pack.empty())
      throw Error(ErrorCode::invalid_argument, "--unpack takes no text, --file or --pack");
    const std::string data = read_file(a.unpack);
    const auto ids = text::unpack_token_ids(
        {reinterpret_cast<const uint8_t*>(data.data()), data.size()}, a.unpack);
    if (tok && !a.ids_only) {
      std::cout << tok->decode(ids, a.skip_special);
      std::cout.flush();
    } else {
      print_ids(ids);
    }
    return;
  }

  if (a.decode) {
    std::string text;
    if (!a.file.empty()) {
      if (!rest.empty()) throw Error(ErrorCode::invalid_argument, "give IDs or --file, not both");
      text = read_file(a.file);
    } else {
      for (const auto& r : rest) text += r + " ";
    }
    std::vector<int32_t> ids;
    std::istringstream in(text);
    std::string word;
    while (in >> word) {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size() || v < std::numeric_limits<int32_t>::min() ||
          v > std::numeric_limits<int32_t>::max())
        throw Error(ErrorCode::invalid_argument, "--decode: '" + word + "' is not a token ID");
      ids.push_back(static_cast<int32_t>(v));
    }
    std::cout << tok->decode(ids, a.skip_special);
    std::cout.flush();
    return;
  }

  std::string input;
  if (!a.file.empty()) {
    if (!rest.empty()) throw Error(ErrorCode::invalid_argument, "give TEXT or --file, not both");
    input = read_file(a.file);
  } else {
    if (rest.empty()) throw Error(ErrorCode::invalid_argument, "no TEXT and no --file given");
    for (size_t i = 0; i < rest.size(); ++i) input += (i ? " " : "") + rest[i];
  }
  text::EncodeOptions options;
  options.add_special = !a.no_special;
  options.parse_special = !a.no_parse_special;
  const auto ids = encode_with_progress(*tok, input, options);

  if (!a.pack.empty()) {
    text::PackOptions po;
    po.zstd = !a.no_zstd;
    po.zstd_level = a.level;
    const auto packed = text::pack_token_ids(ids, po);
    std::ofstream out(a.pack, std::ios::binary);
    if (!out) throw Error(ErrorCode::invalid_argument, a.pack + ": cannot create");
    out.write(reinterpret_cast<const char*>(packed.data()), static_cast<std::streamsize>(packed.size()));
    out.close();
    if (!out) throw Error(ErrorCode::resource_exhausted, a.pack + ": write failed");
    const auto s = text::measure_packing(ids, po);
    const double n = ids.empty() ? 1.0 : static_cast<double>(ids.size());
    std::printf("%zu tokens, %zu distinct IDs, %d bits per index\n", s.tokens, s.distinct,
                s.bits_per_id);
    std::printf("raw uint32   %10zu bytes  %.3f bytes/token\n", s.raw_bytes, s.raw_bytes / n);
    std::printf("zstd(raw)    %10zu bytes  %.3f bytes/token\n", s.zstd_raw_bytes,
                s.zstd_raw_bytes / n);
    std::printf("slim pack    %10zu bytes  %.3f bytes/token  (%s layout%s; %.3fx of zstd(raw))\n",
                packed.size(), packed.size() / n, s.layout.c_str(), s.zstd ? " + zstd" : "",
                s.zstd_raw_bytes ? static_cast<double>(packed.size()) / s.zstd_raw_bytes : 0.0);
    std::printf("written to %s\n", a.pack.c_str());
    return;
  }
  if (a.ids_only) {
    print_ids(ids);
    return;
  }
  for (int32_t id : ids) std::printf("%8d  '%s'\n", id, printable(tok->token_to_piece(id)).c_str());
  std::printf("%zu tokens\n", ids.size());
}

void add_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Encode text to token IDs (or pack them with --pack; decode a packed file with --unpack)");
  cmd->add_option("--tokenizer,-t", args->tokenizer,
                  "tokenizer.json (or a model file a loader is registered for)");
  cmd->add_option("args", args->positional,
                  "[MODEL] TEXT... (MODEL only when --tokenizer is not given)");
  cmd->add_option("--file,-f", args->file, "Read the text from this file");
  cmd->add_flag("--ids", args->ids_only, "Print only the IDs, space-separated");
  cmd->add_flag("--no-special", args->no_special, "Do not add BOS/EOS");
  cmd->add_flag("--no-parse-special", args->no_parse_special,
                "Treat special-token text in the input as plain text");
  cmd->add_option("--pack", args->pack, "Write the IDs packed to this file and report sizes");
  cmd->add_option("--unpack", args->unpack,
                  "Read a packed file; print its IDs, or its text when a tokenizer is given");
  cmd->add_flag("--no-zstd", args->no_zstd, "Pack without zstd");
  cmd->add_flag("--decode", args->decode,
                "Decode: the TEXT arguments (or --file) are token IDs; print their text");
  cmd->add_flag("--skip-special", args->skip_special,
                "When decoding, leave out control tokens (BOS, EOS, ...)");
  cmd->add_option("--level", args->level, "zstd level for --pack")->check(CLI::Range(1, 22));
  cmd->callback([args] { run_tokenize(*args); });
}

}  // namespace

SLIM_COMMAND(45, add_tokenize);

}  // namespace slim::cli
