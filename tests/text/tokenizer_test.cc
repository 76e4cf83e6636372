#include "slim/text/tokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "slim/core/error.h"
#include "slim/text/tokenizer_loader.h"
#include "text/fixtures.h"

namespace slim::text {
namespace {

using testing::fixture_dir;
using testing::fixture_json;

std::vector<std::string> multilingual_texts() {
  return {
      "Hello world",
      "  leading and trailing  ",
      "tabs\tand\nnew\r\nlines\n\n\n",
      "naïve café résumé Ångström",
      "日本語のテキストとカタカナ、漢字。中文测试",
      "한국어 텍스트입니다",
      "مرحبا بالعالم ١٢٣",
      "עברית וערבית",
      "emoji 🙂👍🏽 family 👨‍👩‍👧 flags 🇩🇪",
      "combining e\u0301 a\u0308 Z\u0335\u0321a\u0336l\u0334g\u0337o",
      "invalid \xFF\xFE bytes \xC3\x28 and truncated \xE2\x82",
      "lone surrogate \xED\xA0\x80 overlong \xC0\xAF nul \x00 end",
      "I'M IT'S we'll",
      "x",
      "",
  };
}

std::unique_ptr<Tokenizer> load_fixture(const std::string& name) {
  return Tokenizer::from_hf_json(fixture_dir() + "/" + name);
}

void expect_reference_ids(const std::string& name) {
  auto tok = load_fixture("bpe_" + name + ".json");
  const auto cases = fixture_json("bpe_" + name + "_expected.json");
  ASSERT_GT(cases.size(), 20u);
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(text), want) << name << ": " << text;
    EXPECT_EQ(tok->decode(want), text) << name;
  }
}

TEST(ByteLevelBpe, MatchesPythonReferenceWithGpt2Regex) { expect_reference_ids("gpt2"); }
TEST(ByteLevelBpe, MatchesPythonReferenceWithLlama3Regex) { expect_reference_ids("llama3"); }
TEST(ByteLevelBpe, MatchesPythonReferenceWithQwen2Regex) { expect_reference_ids("qwen2"); }

TEST(ByteLevelBpe, HfJsonBecomesTheGgufStyleSpec) {
  const std::string path = fixture_dir() + "/bpe_llama3.json";
  const TokenizerSpec spec =
      Tokenizer::spec_from_hf_json_text(testing::read_text(path), path);
  EXPECT_EQ(spec.model, "gpt2");
  EXPECT_EQ(spec.pre, "llama-bpe");
  EXPECT_EQ(spec.tokens[0], "<|endoftext|>");
  EXPECT_EQ(spec.token_types[0], static_cast<int32_t>(TokenType::control));
  EXPECT_EQ(spec.token_types.back(), static_cast<int32_t>(TokenType::user_defined));
  EXPECT_FALSE(spec.add_bos);
  // The same spec through create() encodes exactly as the JSON loader does.
  auto a = Tokenizer::create(spec);
  auto b = Tokenizer::from_hf_json(path);
  const std::string text = "Both paths give 12345 identical IDs.";
  EXPECT_EQ(a->encode(text), b->encode(text));
}

TEST(ByteLevelBpe, MultilingualRoundTripsIncludingInvalidUtf8) {
  for (const char* name : {"bpe_gpt2.json", "bpe_llama3.json", "bpe_qwen2.json"}) {
    auto tok = load_fixture(name);
    for (const auto& text : multilingual_texts()) {
      const auto ids = tok->encode(text);
      EXPECT_EQ(tok->decode(ids), text) << name;
      for (int32_t id : ids) EXPECT_NE(tok->token_type(id), TokenType::control);
    }
  }
}

TEST(ByteLevelBpe, RandomBytesRoundTrip) {
  auto tok = load_fixture("bpe_gpt2.json");
  std::mt19937 rng(3);
  for (int round = 0; round < 200; ++round) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(tok->decode(tok->encode(s, {.add_special = false, .parse_special = false})), s);
  }
}

TEST(ByteLevelBpe, SpecialTokensAreMatchedOnlyWhenAsked) {
  auto tok = load_fixture("bpe_gpt2.json");
  const std::string text = "a<|endoftext|>b";
  const auto parsed = tok->encode(text);
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[1], 0);
  const auto literal = tok->encode(text, {.add_special = true, .parse_special = false});
  EXPECT_GT(literal.size(), 3u);
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 0), 0);
  EXPECT_EQ(tok->decode(literal), text);
  EXPECT_EQ(tok->decode(parsed), text);
  EXPECT_EQ(tok->decode(parsed, /*skip_special=*/true), "ab");
  // User-defined tokens are plain vocabulary: matched even without parse_special.
  const int32_t tool = *tok->token_id("<tool>");
  const auto user = tok->encode("x<tool>y", {.add_special = false, .parse_special = false});
  EXPECT_NE(std::find(user.begin(), user.end(), tool), user.end());
}

TEST(ByteLevelBpe, AddsBosAndEosAsTheSpecSays) {
  const std::string path = fixture_dir() + "/bpe_gpt2.json";
  TokenizerSpec spec = Tokenizer::spec_from_hf_json_text(testing::read_text(path), path);
  spec.bos_id = 0;
  spec.eos_id = 0;
  spec.add_bos = true;
  spec.add_eos = true;
  auto tok = Tokenizer::create(spec);
  const auto ids = tok->encode("hi");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(ids.back(), 0);
  EXPECT_EQ(tok->encode("hi", {.add_special = false}).size(), ids.size() - 2);
}

TEST(ByteLevelBpe, IgnoreMergesEmitsWholeWords) {
  // Vocabulary where merges would split "abc" as a|bc, but "abc" is itself a token.
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.tokens = {"a", "b", "c", "bc", "abc"};
  spec.merges = {"b c"};
  auto plain = Tokenizer::create(spec);
  EXPECT_EQ(plain->encode("abc"), (std::vector<int32_t>{0, 3}));
  spec.ignore_merges = true;
  auto whole = Tokenizer::create(spec);
  EXPECT_EQ(whole->encode("abc"), (std::vector<int32_t>{4}));
}

TEST(ByteLevelBpe, MergeOrderIsByRankThenLeftmost) {
  // Hand-checked: "aaaa" with merges a+a (rank 0) then aa+aa gives one token; "aaa" gives
  // aa|a because the leftmost pair merges first.
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.tokens = {"a", "aa", "aaaa", "b", "ab"};
  spec.merges = {"a a", "aa aa", "a b"};
  auto tok = Tokenizer::create(spec);
  EXPECT_EQ(tok->encode("aaaa"), (std::vector<int32_t>{2}));
  EXPECT_EQ(tok->encode("aaa"), (std::vector<int32_t>{1, 0}));
  // a+a outranks a+b, so "aab" is aa|b, not a|ab.
  EXPECT_EQ(tok->encode("aab"), (std::vector<int32_t>{1, 3}));
  // Bytes the vocabulary lacks are dropped (no unknown token), as Hugging Face does, and
  // their neighbours then merge as if adjacent.
  EXPECT_EQ(tok->encode("axa"), (std::vector<int32_t>{1}));
}

// SentencePiece BPE: the spec comes from a model Debian's spm_train trained, the
// expected IDs from the sentencepiece library.
TokenizerSpec spm_spec() {
  const auto j = fixture_json("spm_spec.json");
  TokenizerSpec spec;
  spec.model = "llama";
  spec.source = "spm.model";
  spec.tokens = j["tokens"].get<std::vector<std::string>>();
  spec.scores = j["scores"].get<std::vector<float>>();
  spec.token_types = j["token_types"].get<std::vector<int32_t>>();
  spec.bos_id = j["bos_id"].get<int32_t>();
  spec.eos_id = j["eos_id"].get<int32_t>();
  spec.unk_id = j["unk_id"].get<int32_t>();
  spec.add_bos = true;
  return spec;
}

TEST(SentencePieceBpe, MatchesTheSentencepieceLibrary) {
  auto tok = Tokenizer::create(spm_spec());
  const auto cases = fixture_json("spm_expected.json");
  ASSERT_GT(cases.size(), 20u);
  int byte_fallbacks = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok->encode(text, {.add_special = false});
    EXPECT_EQ(got, want) << text;
    for (int32_t id : got) byte_fallbacks += tok->token_type(id) == TokenType::byte;
    EXPECT_EQ(tok->decode(got), text);
  }
  // The fixture covers rare characters, so fallback to <0xXX> must have happened.
  EXPECT_GT(byte_fallbacks, 0);
}

TEST(SentencePieceBpe, BosDummyPrefixAndRoundTrips) {
  auto tok = Tokenizer::create(spm_spec());
  const auto ids = tok->encode("Hello world");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), tok->bos_id());
  // The dummy prefix shows as U+2581 on the first piece and is removed by decode.
  EXPECT_EQ(tok->token_text(ids[1]).rfind("\xE2\x96\x81", 0), 0u);
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), "Hello world");
  for (const auto& text : multilingual_texts()) {
    EXPECT_EQ(tok->decode(tok->encode(text), true), text);
  }
  TokenizerSpec no_prefix = spm_spec();
  no_prefix.add_space_prefix = false;
  auto bare = Tokenizer::create(no_prefix);
  const auto bare_ids = bare->encode("Hello", {.add_special = false});
  EXPECT_NE(bare->token_text(bare_ids[0]).rfind("\xE2\x96\x81", 0), 0u);
  EXPECT_EQ(bare->decode(bare_ids), "Hello");
}

TEST(SentencePieceBpe, ByteFallbackSpellsUnknownCharacters) {
  auto tok = Tokenizer::create(spm_spec());
  // U+10348 (Gothic hwair) is not in the tiny vocabulary: four byte tokens.
  const auto ids = tok->encode("\xF0\x90\x8D\x88", {.add_special = false});
  std::vector<std::string> texts;
  for (int32_t id : ids) texts.push_back(tok->token_text(id));
  ASSERT_GE(texts.size(), 4u);
  const std::vector<std::string> tail(texts.end() - 4, texts.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"<0xF0>", "<0x90>", "<0x8D>", "<0x88>"}));
  EXPECT_EQ(tok->token_to_piece(*tok->token_id("<0x41>")), "A");
}

void expect_invalid(const TokenizerSpec& spec, ErrorCode code, const std::string& fragment) {
  try {
    Tokenizer::create(spec);
    ADD_FAILURE() << "accepted a bad spec (" << fragment << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(spec.source), std::string::npos) << e.what();
  }
}

TEST(TokenizerSpecValidation, NamesTheBadField) {
  TokenizerSpec good;
  good.model = "gpt2";
  good.source = "bad.gguf";
  good.tokens = {"a", "b", "ab"};
  good.merges = {"a b"};
  EXPECT_NO_THROW(Tokenizer::create(good));

  auto s = good;
  s.model = "wordpiece";
  expect_invalid(s, ErrorCode::unsupported, "wordpiece");
  s = good;
  s.tokens.clear();
  expect_invalid(s, ErrorCode::invalid_model, "empty");
  s = good;
  s.scores = {1.0f};
  expect_invalid(s, ErrorCode::invalid_model, "scores");
  s = good;
  s.token_types = {1, 1, 9};
  expect_invalid(s, ErrorCode::invalid_model, "token type 9");
  s = good;
  s.bos_id = 3;
  expect_invalid(s, ErrorCode::invalid_model, "bos_token_id 3");
  s = good;
  s.add_eos = true;
  expect_invalid(s, ErrorCode::invalid_model, "add_eos_token");
  s = good;
  s.merges = {"a c"};
  expect_invalid(s, ErrorCode::invalid_model, "merge 0 'a c'");
  s = good;
  s.merges = {"ab"};
  expect_invalid(s, ErrorCode::invalid_model, "merge 0 'ab'");
  s = good;
  s.pre = "no-such-pre";
  expect_invalid(s, ErrorCode::unsupported, "no-such-pre");
  s = good;
  s.model = "llama";  // no <0xXX> tokens and no unknown token
  expect_invalid(s, ErrorCode::invalid_model, "byte tokens");
}

TEST(TokenizerDecode, RejectsIdsOutsideTheVocabulary) {
  auto tok = load_fixture("bpe_gpt2.json");
  for (int32_t bad : {-1, tok->vocab_size()}) {
    const std::vector<int32_t> ids = {1, bad};
    try {
      tok->decode(ids);
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos);
    }
  }
}

ErrorCode hf_error(const std::string& json, std::string* message) {
  try {
    Tokenizer::from_hf_json_text(json, "tok.json");
  } catch (const Error& e) {
    *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "accepted " << json;
  return ErrorCode::internal;
}

TEST(HfJson, RejectsWhatItCannotReproduce) {
  const std::string pre = R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},)";
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  std::string msg;
  EXPECT_NO_THROW(Tokenizer::from_hf_json_text("{" + pre + model + "}", "tok.json"));
  EXPECT_EQ(hf_error("{not json", &msg), ErrorCode::invalid_model);
  EXPECT_NE(msg.find("tok.json"), std::string::npos);
  EXPECT_EQ(hf_error(R"({"normalizer": {"type": "NFC"},)" + pre + model + "}", &msg),
            ErrorCode::unsupported);
  EXPECT_NE(msg.find("NFC"), std::string::npos);
  EXPECT_EQ(hf_error(R"({"model": {"type": "WordPiece", "vocab": {}}})", &msg),
            ErrorCode::unsupported);
  EXPECT_EQ(hf_error("{" + pre + R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 5}, "merges": []}})", &msg),
            ErrorCode::invalid_model);
  EXPECT_NE(msg.find("not contiguous"), std::string::npos);
  EXPECT_EQ(hf_error("{" + pre + R"("model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", &msg),
            ErrorCode::invalid_model);
  EXPECT_EQ(hf_error("{" + pre + R"("model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})", &msg),
            ErrorCode::invalid_model);
  EXPECT_NE(msg.find("merges[0]"), std::string::npos);
  EXPECT_EQ(hf_error(R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "x"}},)" + model + "}", &msg),
            ErrorCode::unsupported);
  EXPECT_EQ(hf_error("{" + pre + model + R"(, "added_tokens": [{"id": 1, "content": "zz", "special": true}]})", &msg),
            ErrorCode::invalid_model);
  EXPECT_NE(msg.find("reuses ID 1"), std::string::npos);
}

TEST(HfJson, TruncatedFilesAreErrorsNotCrashes) {
  const std::string full = testing::read_text(fixture_dir() + "/bpe_qwen2.json");
  for (size_t keep = 0; keep < full.size(); keep += 97) {
    try {
      Tokenizer::from_hf_json_text(full.substr(0, keep), "cut.json");
      ADD_FAILURE() << "accepted a file cut at " << keep;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_model);
      EXPECT_NE(std::string(e.what()).find("cut.json"), std::string::npos);
    }
  }
}

TEST(HfJson, TemplatePostProcessorSetsBos) {
  const std::string json = R"({
    "added_tokens": [{"id": 3, "content": "<s>", "special": true}],
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [3], "tokens": ["<s>"]}}},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})";
  auto tok = Tokenizer::from_hf_json_text(json, "tok.json");
  EXPECT_EQ(tok->encode("abab"), (std::vector<int32_t>{3, 2, 2}));
  EXPECT_EQ(tok->decode(tok->encode("abab"), true), "abab");
}

TEST(TokenizerLoader, UsesRegisteredLoadersBeforeJson) {
  const std::string path = fixture_dir() + "/bpe_gpt2.json";
  EXPECT_EQ(load_tokenizer(path)->vocab_size(), load_fixture("bpe_gpt2.json")->vocab_size());
  int calls = 0;
  register_tokenizer_loader({"fake", [](const std::string& p) { return p.ends_with(".fake"); },
                             [&](const std::string&) {
                               ++calls;
                               TokenizerSpec s;
                               s.model = "gpt2";
                               s.tokens = {"x"};
                               return Tokenizer::create(s);
                             }});
  const std::string fake = fixture_dir() + "/model.fake";
  { std::ofstream(fake) << "x"; }
  EXPECT_EQ(load_tokenizer(fake)->vocab_size(), 1);
  EXPECT_EQ(calls, 1);
  try {
    load_tokenizer(fixture_dir() + "/missing.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
  }
}

}  // namespace
}  // namespace slim::text
