// GGUF reading and writing: metadata and tensor infos of generated files, and the errors
// malformed files must produce (never a crash).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "llm_test_util.h"
#include "slim/core/error.h"
#include "slim/llm/gguf.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/llm/model.h"

namespace slim::llm {
namespace {

using testing::fixture;
using testing::tmp_dir;

TEST(Gguf, ReadsFixtureMetadataAndTensors) {
  auto g = GgufFile::open(fixture("llama_q4_k.gguf"));
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->alignment(), 32u);
  EXPECT_EQ(g->get_string("general.architecture"), "llama");
  EXPECT_EQ(g->get_int("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(float(g->get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(g->find("tokenizer.ggml.tokens")->strings.size(), 300u);
  EXPECT_EQ(g->find("tokenizer.ggml.tokens")->strings[7], "<tok7>");
  EXPECT_EQ(g->find("tokenizer.ggml.token_type")->integers.size(), 300u);
  const GgufTensorInfo& t = g->tensor("blk.0.ffn_down.weight");
  EXPECT_EQ(t.type(), GgmlType::q4_k);
  EXPECT_EQ(t.dims, (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(t.size, 256u * 2 * 144);
  EXPECT_EQ(g->get_int("missing.key", 42), 42);
  EXPECT_THROW(g->get_int("missing.key"), Error);
  try {
    g->get_int("general.architecture");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_model);
    EXPECT_NE(std::string(e.what()).find("general.architecture"), std::string::npos);
  }
}

TEST(Gguf, WriterRoundTrip) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("a.u32", 7);
  w.set_i32("a.i32", -5);
  w.set_f32("a.f32", 2.5f);
  w.set_bool("a.bool", true);
  w.set_u32("a.u32", 8);  // replaces
  std::vector<uint8_t> data(34 * 2);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7);
  w.add_tensor("x", GgmlType::q8_0, {64, 1}, data);
  w.add_tensor("y", GgmlType::f32, {3}, std::vector<uint8_t>(12, 1));
  const std::string p = tmp_dir() + "/llm_writer.gguf";
  w.write(p);
  auto g = GgufFile::open(p);
  EXPECT_EQ(g->get_int("a.u32"), 8);
  EXPECT_EQ(g->get_int("a.i32"), -5);
  EXPECT_EQ(g->get_float("a.f32"), 2.5);
  EXPECT_TRUE(g->get_bool("a.bool", false));
  EXPECT_EQ(g->metadata_order().size(), 5u);
  const auto& x = g->tensor("x");
  ASSERT_EQ(x.size, data.size());
  EXPECT_EQ(0, std::memcmp(g->tensor_data(x), data.data(), data.size()));
  EXPECT_EQ(g->tensor("y").offset % 32, 0u);
}

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// A small valid file; returns its bytes and the offset of tensor "x"'s info fields. Each
// caller names its own file: ctest runs tests in parallel processes, and one writing the
// file while another reads it gave the reader a short file (and a crash).
std::vector<uint8_t> small_file(const std::string& name, size_t* dims_at) {
  GgufWriter w;
  w.set_string("k", "v");
  w.add_tensor("x", GgmlType::q8_0, {32, 2}, std::vector<uint8_t>(68, 3));
  const std::string p = tmp_dir() + "/" + name + ".gguf";
  w.write(p);
  std::vector<uint8_t> b = read_all(p);
  // header 24 + key (8+1) + type 4 + string (8+1) = 46; then name (8+1), n_dims 4.
  *dims_at = 46 + 9 + 4;
  return b;
}

void expect_error(const std::vector<uint8_t>& bytes, ErrorCode code, const std::string& needle) {
  const std::string p = tmp_dir() + "/llm_bad.gguf";
  write_all(p, bytes);
  try {
    GgufFile::open(p);
    FAIL() << "expected an error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Gguf, RejectsMalformedFiles) {
  size_t dims_at;
  const std::vector<uint8_t> good = small_file("llm_small_malformed", &dims_at);
  {
    auto b = good;
    b[0] = 'X';
    expect_error(b, ErrorCode::invalid_model, "bad magic");
  }
  {
    auto b = good;
    b[4] = 1;
    expect_error(b, ErrorCode::unsupported, "version 1");
  }
  {
    auto b = good;
    b.resize(40);
    expect_error(b, ErrorCode::invalid_model, "exceeds the file size");
  }
  {
    auto b = good;
    uint64_t huge = uint64_t(1) << 60;
    std::memcpy(&b[16], &huge, 8);  // metadata count
    expect_error(b, ErrorCode::invalid_model, "metadata count");
  }
  {
    auto b = good;
    uint64_t huge = uint64_t(1) << 62;
    std::memcpy(&b[24], &huge, 8);  // length of the first key
    expect_error(b, ErrorCode::invalid_model, "truncated");
  }
  {
    auto b = good;
    uint64_t dim = 33;  // not a multiple of the Q8_0 block
    std::memcpy(&b[dims_at], &dim, 8);
    expect_error(b, ErrorCode::invalid_model, "block size");
  }
  {
    auto b = good;
    uint64_t dim = uint64_t(1) << 40;  // far past the end of the file
    std::memcpy(&b[dims_at + 8], &dim, 8);
    expect_error(b, ErrorCode::invalid_model, "runs past the end");
  }
  {
    auto b = good;
    uint64_t dim = uint64_t(1) << 62;  // element count overflows
    std::memcpy(&b[dims_at], &dim, 8);
    std::memcpy(&b[dims_at + 8], &dim, 8);
    expect_error(b, ErrorCode::invalid_model, "tensor 'x'");
  }
  {
    auto b = good;
    uint32_t type = 99;
    std::memcpy(&b[dims_at + 16], &type, 4);
    expect_error(b, ErrorCode::unsupported, "unknown tensor type 99");
  }
  {
    auto b = good;
    uint64_t off = 8;  // misaligned
    std::memcpy(&b[dims_at + 20], &off, 8);
    expect_error(b, ErrorCode::invalid_model, "alignment");
  }
  {
    auto b = good;
    uint32_t nd = 9;
    std::memcpy(&b[dims_at - 4], &nd, 4);
    expect_error(b, ErrorCode::invalid_model, "9 dimensions");
  }
  {
    auto b = good;
    uint32_t vt = 77;  // metadata value type
    std::memcpy(&b[24 + 9], &vt, 4);
    expect_error(b, ErrorCode::invalid_model, "unknown value type 77");
  }
  EXPECT_THROW(GgufFile::open(tmp_dir() + "/does_not_exist.gguf"), Error);
}

TEST(Gguf, TruncationAtEveryLengthIsAnError) {
  size_t dims_at;
  const std::vector<uint8_t> good = small_file("llm_small_trunc", &dims_at);
  const std::string p = tmp_dir() + "/llm_trunc.gguf";
  // The last 28 bytes are padding after the tensor's 68 bytes; without them the file is whole.
  for (size_t n = 0; n < good.size() - 28; n += 3) {
    write_all(p, std::vector<uint8_t>(good.begin(), good.begin() + long(n)));
    EXPECT_THROW(GgufFile::open(p), Error) << "length " << n;
  }
}

// Random corruption of the header, metadata and tensor infos must end in a slim::Error or
// a model that loads; never a crash (run under the sanitizers in CI builds with SLIM_SANITIZE).
TEST(Gguf, RandomCorruptionNeverCrashes) {
  const std::vector<uint8_t> good = read_all(fixture("qwen2_q4_k.gguf"));
  auto g = GgufFile::open(fixture("qwen2_q4_k.gguf"));
  // The header ends where the data section starts: the first tensor's data.
  const size_t header_end = size_t(g->tensor_data(g->tensors()[0]) - g->file().data());
  std::mt19937 rng(123);
  const std::string p = tmp_dir() + "/llm_fuzz.gguf";
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<uint8_t> b = good;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = rng() % header_end;
      b[at] = (rng() % 2) ? uint8_t(rng()) : uint8_t(b[at] ^ (1u << (rng() % 8)));
    }
    if (rng() % 8 == 0) b.resize(rng() % b.size());
    write_all(p, b);
    try {
      LlamaModel::load(p);
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded + rejected, 300);
  EXPECT_GT(rejected, 0);
}

TEST(Gguf, TokenizerSpecFromMetadata) {
  auto g = GgufFile::open(fixture("llama_f32.gguf"));
  text::TokenizerSpec s = tokenizer_spec_from_gguf(*g);
  EXPECT_EQ(s.model, "gpt2");
  EXPECT_EQ(s.tokens.size(), 300u);
  EXPECT_EQ(s.bos_id, 1);
  EXPECT_EQ(s.eos_id, 2);
  EXPECT_FALSE(s.add_bos);
  EXPECT_TRUE(is_gguf_file(fixture("llama_f32.gguf")));
  EXPECT_FALSE(is_gguf_file(fixture("llama_f32.tokens.npy")));
}

}  // namespace
}  // namespace slim::llm
