// Reads a Hugging Face tokenizer.json into a TokenizerSpec. Only what byte-level BPE
// tokenizers use is accepted; anything else is refused by name instead of being ignored,
// because a silently skipped normalizer or post-processor gives wrong IDs.
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "slim/core/error.h"
#include "slim/text/tokenizer.h"

namespace slim::text {
namespace {

using nlohmann::json;

// The Split regexes of the pre-tokenizers slim implements, as tokenizer.json spells them.
const char kLlama3Regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char kQwen2Regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char kGpt2Regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

[[noreturn]] void fail(ErrorCode code, const std::string& source, const std::string& what) {
  throw Error(code, source + ": " + what);
}

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

// ByteLevel pre-tokenizer: byte mapping, optionally with the GPT-2 regex.
void read_byte_level(const json& p, const std::string& source, bool& uses_regex) {
  if (flag(p, "add_prefix_space", false))
    fail(ErrorCode::unsupported, source, "pre_tokenizer ByteLevel add_prefix_space=true");
  uses_regex = flag(p, "use_regex", true);
}

std::string pre_from_regex(const std::string& pattern, const std::string& source) {
  if (pattern == kLlama3Regex) return "llama-bpe";
  if (pattern == kQwen2Regex) return "qwen2";
  if (pattern == kGpt2Regex) return "gpt-2";
  fail(ErrorCode::unsupported, source, "pre_tokenizer Split regex '" + pattern +
                                           "' is not one slim implements");
}

std::string read_pre_tokenizer(const json& p, const std::string& source) {
  const std::string type = type_of(p);
  if (type == "ByteLevel") {
    bool uses_regex = true;
    read_byte_level(p, source, uses_regex);
    if (!uses_regex)
      fail(ErrorCode::unsupported, source, "pre_tokenizer ByteLevel without a regex split");
    return "gpt-2";
  }
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    std::string pre;
    bool digits = false, byte_level = false;
    for (const json& step : p["pretokenizers"]) {
      const std::string t = type_of(step);
      if (t == "ByteLevel") {
        bool uses_regex = true;
        read_byte_level(step, source, uses_regex);
        if (uses_regex) {
          if (!pre.empty()) fail(ErrorCode::unsupported, source, "two regex pre-tokenizers");
          pre = "gpt-2";
        }
        byte_level = true;
      } else if (t == "Split") {
        const json& pat = step.value("pattern", json());
        if (!pat.is_object() || !pat.contains("Regex") || !pat["Regex"].is_string())
          fail(ErrorCode::unsupported, source, "pre_tokenizer Split without a Regex pattern");
        if (step.value("behavior", std::string()) != "Isolated" || flag(step, "invert", false))
          fail(ErrorCode::unsupported, source,
               "pre_tokenizer Split behaviour other than Isolated");
        if (!pre.empty()) fail(ErrorCode::unsupported, source, "two regex pre-tokenizers");
        pre = pre_from_regex(pat["Regex"].get<std::string>(), source);
      } else if (t == "Digits" && flag(step, "individual_digits", false)) {
        digits = true;
      } else {
        fail(ErrorCode::unsupported, source, "pre_tokenizer step '" + t + "'");
      }
    }
    if (!byte_level)
      fail(ErrorCode::unsupported, source, "pre_tokenizer Sequence without ByteLevel");
    if (digits) {
      if (pre != "gpt-2")
        fail(ErrorCode::unsupported, source, "Digits split before a non-GPT-2 regex");
      return "starcoder";
    }
    if (pre.empty()) fail(ErrorCode::unsupported, source, "pre_tokenizer without a regex split");
    return pre;
  }
  fail(ErrorCode::unsupported, source,
       "pre_tokenizer '" + (type.empty() ? std::string("null") : type) +
           "' (slim reads byte-level BPE tokenizer.json files)");
}

}  // namespace

TokenizerSpec Tokenizer::spec_from_hf_json_text(std::string_view text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail(ErrorCode::invalid_model, source, std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) fail(ErrorCode::invalid_model, source, "top level is not an object");
  try {
    const json& model = doc.value("model", json());
    if (!model.is_object()) fail(ErrorCode::invalid_model, source, "no 'model' object");
    const std::string model_type = model.value("type", std::string("BPE"));
    if (model_type != "BPE")
      fail(ErrorCode::unsupported, source, "model type '" + model_type + "' (only BPE)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() &&
          !(model[key].is_string() && model[key].get<std::string>().empty()))
        fail(ErrorCode::unsupported, source, std::string("model.") + key);
    }
    if (model.contains("dropout") && !model["dropout"].is_null() &&
        !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
      fail(ErrorCode::unsupported, source, "model.dropout");
    if (flag(model, "byte_fallback", false))
      fail(ErrorCode::unsupported, source, "model.byte_fallback with a byte-level tokenizer");

    if (doc.contains("normalizer") && !doc["normalizer"].is_null())
      fail(ErrorCode::unsupported, source, "normalizer '" + type_of(doc["normalizer"]) + "'");

    TokenizerSpec spec;
    spec.source = source;
    spec.model = "gpt2";
    spec.pre = read_pre_tokenizer(doc.value("pre_tokenizer", json()), source);
    spec.ignore_merges = flag(model, "ignore_merges", false);
    const json& decoder = doc.value("decoder", json());
    if (!decoder.is_null() && type_of(decoder) != "ByteLevel")
      fail(ErrorCode::unsupported, source, "decoder '" + type_of(decoder) + "'");

    // Vocabulary: string -> id. IDs must fill 0..n-1 once vocab and added tokens are merged.
    const json& vocab = model.value("vocab", json());
    if (!vocab.is_object()) fail(ErrorCode::invalid_model, source, "model.vocab is not an object");
    std::map<int64_t, std::string> by_id;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer())
        fail(ErrorCode::invalid_model, source, "model.vocab['" + it.key() + "'] is not an integer");
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max() - 1)
        fail(ErrorCode::invalid_model, source,
             "model.vocab['" + it.key() + "'] = " + std::to_string(id) + " is out of range");
      if (!by_id.emplace(id, it.key()).second)
        fail(ErrorCode::invalid_model, source, "model.vocab gives ID " + std::to_string(id) +
                                                   " to two tokens");
    }
    std::map<int64_t, TokenType> added_types;
    const json& added = doc.value("added_tokens", json::array());
    if (!added.is_array()) fail(ErrorCode::invalid_model, source, "added_tokens is not a list");
    for (size_t i = 0; i < added.size(); ++i) {
      const json& a = added[i];
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string())
        fail(ErrorCode::invalid_model, source, where + " lacks an integer id or string content");
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = a["content"].get<std::string>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max() - 1)
        fail(ErrorCode::invalid_model, source, where + " id " + std::to_string(id) + " out of range");
      if (content.empty()) fail(ErrorCode::invalid_model, source, where + " has empty content");
      if (flag(a, "lstrip", false) || flag(a, "rstrip", false) || flag(a, "single_word", false))
        fail(ErrorCode::unsupported, source, where + " lstrip/rstrip/single_word");
      auto [it, inserted] = by_id.emplace(id, content);
      if (!inserted && it->second != content)
        fail(ErrorCode::invalid_model, source,
             where + " '" + content + "' reuses ID " + std::to_string(id) + " of '" +
                 it->second + "'");
      added_types[id] = flag(a, "special", false) ? TokenType::control : TokenType::user_defined;
    }
    if (by_id.empty()) fail(ErrorCode::invalid_model, source, "the vocabulary is empty");
    const int64_t n = by_id.rbegin()->first + 1;
    if (static_cast<int64_t>(by_id.size()) != n)
      fail(ErrorCode::invalid_model, source,
           "token IDs are not contiguous: " + std::to_string(by_id.size()) +
               " tokens but the largest ID is " + std::to_string(n - 1));
    spec.tokens.reserve(n);
    spec.token_types.assign(n, static_cast<int32_t>(TokenType::normal));
    for (auto& [id, tok] : by_id) spec.tokens.push_back(tok);
    for (auto& [id, t] : added_types) spec.token_types[id] = static_cast<int32_t>(t);

    const json& merges = model.value("merges", json::array());
    if (!merges.is_array()) fail(ErrorCode::invalid_model, source, "model.merges is not a list");
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      // Older files write "a b", newer ones ["a", "b"].
      if (m.is_string()) {
        spec.merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        const std::string l = m[0].get<std::string>(), r = m[1].get<std::string>();
        if (l.empty() || r.empty() || l.find(' ') != std::string::npos ||
            r.find(' ') != std::string::npos)
          fail(ErrorCode::unsupported, source,
               "model.merges[" + std::to_string(i) + "] has an empty part or a space");
        spec.merges.push_back(l + " " + r);
      } else {
        fail(ErrorCode::invalid_model, source,
             "model.merges[" + std::to_string(i) + "] is neither \"a b\" nor [a, b]");
      }
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = std::find(spec.tokens.begin(), spec.tokens.end(),
                          model["unk_token"].get<std::string>());
      if (it != spec.tokens.end()) spec.unk_id = static_cast<int32_t>(it - spec.tokens.begin());
    }

    // A TemplateProcessing post-processor that wraps a single sequence in special tokens
    // is how tokenizer.json says "add BOS/EOS".
    const json& post = doc.value("post_processor", json());
    const std::string post_type = type_of(post);
    if (post_type == "TemplateProcessing") {
      const json& single = post.value("single", json::array());
      if (!single.is_array())
        fail(ErrorCode::invalid_model, source, "post_processor.single is not a list");
      auto special_id = [&](const json& item) -> int32_t {
        if (!item.is_object() || !item.contains("SpecialToken")) return -1;
        const std::string name = item["SpecialToken"].value("id", std::string());
        const json& sp = post.value("special_tokens", json::object());
        if (!sp.contains(name) || !sp[name].contains("ids") || !sp[name]["ids"].is_array() ||
            sp[name]["ids"].size() != 1 || !sp[name]["ids"][0].is_number_integer())
          fail(ErrorCode::unsupported, source,
               "post_processor special token '" + name + "' is not a single ID");
        const int64_t id = sp[name]["ids"][0].get<int64_t>();
        if (id < 0 || id >= n)
          fail(ErrorCode::invalid_model, source,
               "post_processor special token '" + name + "' has ID " + std::to_string(id) +
                   " outside the vocabulary");
        return static_cast<int32_t>(id);
      };
      size_t sequences = 0;
      for (const json& item : single) sequences += item.contains("Sequence") ? 1 : 0;
      if (sequences != 1 || single.size() > 3)
        fail(ErrorCode::unsupported, source, "post_processor template other than [BOS] $A [EOS]");
      if (!single.empty() && !single.front().contains("Sequence")) {
        spec.bos_id = special_id(single.front());
        spec.add_bos = true;
      }
      if (single.size() >= 2 && !single.back().contains("Sequence")) {
        spec.eos_id = special_id(single.back());
        spec.add_eos = true;
      }
    } else if (!post.is_null() && post_type != "ByteLevel") {
      fail(ErrorCode::unsupported, source, "post_processor '" + post_type + "'");
    }
    return spec;
  } catch (const json::exception& e) {
    fail(ErrorCode::invalid_model, source, std::string("unexpected JSON structure: ") + e.what());
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json_text(std::string_view text,
                                                        const std::string& source) {
  return create(spec_from_hf_json_text(text, source));
}

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::not_found, path + ": cannot open tokenizer file");
  std::ostringstream buf;
  buf << in.rdbuf();
  return from_hf_json_text(buf.str(), path);
}

}  // namespace slim::text
