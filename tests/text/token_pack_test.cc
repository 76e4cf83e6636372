#include "slim/text/token_pack.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "slim/core/error.h"

namespace slim::text {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Rewrites the trailing CRC so a test can reach the checks behind it.
void reseal(std::vector<uint8_t>& packed) {
  const uint32_t crc = crc32(std::span<const uint8_t>(packed).first(packed.size() - 4));
  for (int i = 0; i < 4; ++i) packed[packed.size() - 4 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

ErrorCode unpack_error(const std::vector<uint8_t>& packed, std::string* message = nullptr) {
  try {
    unpack_token_ids(packed, "stream.sltk");
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "unpack accepted a damaged stream";
  return ErrorCode::internal;
}

TEST(Crc32, MatchesZlibCheckValues) {
  EXPECT_EQ(crc32(bytes("123456789")), 0xCBF43926u);
  EXPECT_EQ(crc32(bytes("")), 0u);
  EXPECT_EQ(crc32(bytes("The quick brown fox jumps over the lazy dog")), 0x414FA339u);
  // Incremental use gives the same value as one call.
  EXPECT_EQ(crc32(bytes("6789"), crc32(bytes("12345"))), 0xCBF43926u);
}

TEST(TokenPack, RoundTripsEdgeCases) {
  const std::vector<std::vector<int32_t>> streams = {
      {},
      {0},
      {7, 7, 7, 7, 7},
      {0, 1},
      {2147483647, 0, 2147483647},
      {5, 3, 5, 1000000, 3, 0, 128, 127, 16384},
  };
  for (bool zstd : {false, true}) {
    for (const auto& ids : streams) {
      PackOptions o;
      o.zstd = zstd;
      EXPECT_EQ(unpack_token_ids(pack_token_ids(ids, o)), ids);
    }
  }
}

TEST(TokenPack, RoundTripsRandomStreamsAtEveryWidth) {
  std::mt19937 rng(42);
  for (int distinct : {2, 3, 4, 5, 255, 256, 257, 1000, 5000}) {
    std::vector<int32_t> vocab(distinct);
    for (auto& v : vocab) v = static_cast<int32_t>(rng() % 150000);
    std::vector<int32_t> ids(3001);
    for (auto& id : ids) id = vocab[rng() % distinct];
    for (bool zstd : {false, true}) {
      PackOptions o;
      o.zstd = zstd;
      o.zstd_level = 3;
      ASSERT_EQ(unpack_token_ids(pack_token_ids(ids, o)), ids) << distinct << " " << zstd;
    }
  }
}

TEST(TokenPack, UsesTheMinimalWidth) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 1000; ++i) ids.push_back(100000 + (i % 5) * 3);
  PackOptions raw;
  raw.zstd = false;
  const PackStats s = measure_packing(ids, raw);
  EXPECT_EQ(s.tokens, 1000u);
  EXPECT_EQ(s.distinct, 5u);
  EXPECT_EQ(s.bits_per_id, 3);
  EXPECT_EQ(s.raw_bytes, 4000u);
  // header 40 + table (3-byte varint + four 1-byte gaps) + 1000 * 3 bits + crc 4
  EXPECT_EQ(s.packed_bytes, 40u + 3u + 4u + 375u + 4u);
  EXPECT_GT(s.zstd_raw_bytes, 0u);
  EXPECT_DOUBLE_EQ(s.packed_bytes_per_token(), s.packed_bytes / 1000.0);
}

TEST(TokenPack, ZstdIsUsedOnlyWhenItHelps) {
  std::vector<int32_t> repetitive;
  for (int i = 0; i < 20000; ++i) repetitive.push_back(i % 17);
  PackOptions raw;
  raw.zstd = false;
  EXPECT_LT(pack_token_ids(repetitive).size(), pack_token_ids(repetitive, raw).size() / 10);
  // Random indices do not compress, so the raw bits are kept (flag clear, same size).
  std::mt19937 rng(7);
  std::vector<int32_t> noise(4096);
  for (auto& id : noise) id = static_cast<int32_t>(rng() % 256);
  EXPECT_LE(pack_token_ids(noise).size(), pack_token_ids(noise, raw).size());
  EXPECT_EQ(unpack_token_ids(pack_token_ids(noise)), noise);
}

TEST(TokenPack, TextLikeStreamsUseTheRankedLayoutAndBeatZstdOfRaw) {
  // Zipf-like IDs with recurring phrases, as tokenized prose has.
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> phrases(40);
  for (auto& ph : phrases) {
    ph.resize(3 + rng() % 6);
    for (auto& id : ph) id = static_cast<int32_t>((rng() % 400) * (rng() % 400) % 30000);
  }
  std::vector<int32_t> ids;
  while (ids.size() < 20000) {
    if (rng() % 5 != 0) {
      const auto& ph = phrases[rng() % phrases.size()];
      ids.insert(ids.end(), ph.begin(), ph.end());
    } else {
      ids.push_back(static_cast<int32_t>((rng() % 60) * (rng() % 60)));
    }
  }
  const PackStats s = measure_packing(ids);
  EXPECT_EQ(s.layout, "ranked-varint");
  EXPECT_TRUE(s.zstd);
  EXPECT_LT(s.packed_bytes, s.zstd_raw_bytes);
  EXPECT_EQ(unpack_token_ids(pack_token_ids(ids)), ids);
  PackOptions raw;
  raw.zstd = false;
  EXPECT_EQ(measure_packing(ids, raw).layout, "bitpacked");
}

TEST(TokenPack, RejectsNegativeIds) {
  const std::vector<int32_t> ids = {1, -3};
  try {
    pack_token_ids(ids);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("position 1"), std::string::npos);
  }
}

TEST(TokenPack, DetectsEveryFlippedByte) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 300; ++i) ids.push_back((i * 37) % 91);
  const auto packed = pack_token_ids(ids);
  for (size_t i = 0; i < packed.size(); ++i) {
    auto damaged = packed;
    damaged[i] ^= 0x10;
    std::string msg;
    const ErrorCode code = unpack_error(damaged, &msg);
    // Magic, version and flags are checked before the checksum; the rest is integrity.
    if (i < 8) {
      EXPECT_TRUE(code == ErrorCode::invalid_model || code == ErrorCode::unsupported) << i;
    } else if (i >= 24 && i < 32) {
      EXPECT_EQ(code, ErrorCode::invalid_model) << i;  // stored size vs file size
    } else {
      EXPECT_EQ(code, ErrorCode::integrity) << i << ": " << msg;
    }
    EXPECT_NE(msg.find("stream.sltk"), std::string::npos);
  }
}

TEST(TokenPack, RejectsTruncationAndForeignData) {
  const std::vector<int32_t> ids = {1, 2, 3, 2, 1};
  auto packed = pack_token_ids(ids);
  for (size_t keep : {size_t{0}, size_t{10}, size_t{43}, packed.size() - 1}) {
    std::vector<uint8_t> cut(packed.begin(), packed.begin() + keep);
    EXPECT_EQ(unpack_error(cut), ErrorCode::invalid_model) << keep;
  }
  std::vector<uint8_t> foreign(100, 'x');
  std::string msg;
  EXPECT_EQ(unpack_error(foreign, &msg), ErrorCode::invalid_model);
  EXPECT_NE(msg.find("magic"), std::string::npos);
}

TEST(TokenPack, ValidatesHeaderFieldsBehindTheChecksum) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 64; ++i) ids.push_back(i % 4);
  PackOptions raw;
  raw.zstd = false;
  const auto packed = pack_token_ids(ids, raw);
  auto with = [&](size_t offset, uint64_t value, int width) {
    auto p = packed;
    for (int i = 0; i < width; ++i) p[offset + i] = static_cast<uint8_t>(value >> (8 * i));
    reseal(p);
    return p;
  };
  std::string msg;
  EXPECT_EQ(unpack_error(with(4, 2, 2), &msg), ErrorCode::unsupported);  // version
  EXPECT_NE(msg.find("version 2"), std::string::npos);
  EXPECT_EQ(unpack_error(with(6, 4, 2), &msg), ErrorCode::invalid_model);  // unknown flag
  EXPECT_EQ(unpack_error(with(8, uint64_t{1} << 40, 8), &msg), ErrorCode::invalid_model);
  EXPECT_NE(msg.find("token count"), std::string::npos);
  EXPECT_EQ(unpack_error(with(8, 1000, 8), &msg), ErrorCode::invalid_model);  // count vs size
  EXPECT_EQ(unpack_error(with(16, 100, 4), &msg), ErrorCode::invalid_model);  // distinct
  EXPECT_EQ(unpack_error(with(20, 7, 1), &msg), ErrorCode::invalid_model);    // width
  EXPECT_NE(msg.find("index width"), std::string::npos);
  EXPECT_EQ(unpack_error(with(6, 1, 2), &msg), ErrorCode::invalid_model);  // claims zstd
  EXPECT_EQ(unpack_error(with(21, 9, 1), &msg), ErrorCode::invalid_model);  // layout
  EXPECT_NE(msg.find("layout 9"), std::string::npos);
  EXPECT_EQ(unpack_error(with(22, 1, 1), &msg), ErrorCode::invalid_model);  // reserved
  // The ranked layout read as bit-packed (or the reverse) fails the size checks.
  EXPECT_EQ(unpack_error(with(21, 1, 1), &msg), ErrorCode::invalid_model);
}

TEST(TokenPack, RejectsIndicesBeyondTheTable) {
  // Three distinct IDs need 2 bits, so index 3 is representable but must be refused.
  const std::vector<int32_t> ids = {10, 20, 30, 10};
  PackOptions raw;
  raw.zstd = false;
  auto packed = pack_token_ids(ids, raw);
  const size_t body = packed.size() - 4 - 1;  // one byte of 2-bit indices before the crc
  packed[body] |= 0xc0;                       // token 3 -> index 3
  reseal(packed);
  std::string msg;
  EXPECT_EQ(unpack_error(packed, &msg), ErrorCode::invalid_model);
  EXPECT_NE(msg.find("index 3"), std::string::npos);
}

TEST(TokenPack, RejectsDamagedRankedPayloads) {
  const std::vector<int32_t> ids = {4, 4, 9, 4, 1};
  // Stored uncompressed in the ranked layout: header, then the table (4, 9, 1 as zigzag
  // deltas 8, 10, 15), then ranks 0 0 1 0 2.
  std::vector<uint8_t> packed = pack_token_ids(ids, {.zstd = false});
  packed[21] = 1;
  packed.resize(40);
  const std::vector<uint8_t> payload = {8, 10, 15, 0, 0, 1, 0, 2};
  packed.insert(packed.end(), payload.begin(), payload.end());
  auto set_sizes = [](std::vector<uint8_t>& p, uint64_t n) {
    for (int i = 0; i < 8; ++i) p[24 + i] = p[32 + i] = static_cast<uint8_t>(n >> (8 * i));
  };
  set_sizes(packed, payload.size());
  packed.insert(packed.end(), 4, 0);
  reseal(packed);
  EXPECT_EQ(unpack_token_ids(packed), ids);

  auto damaged = [&](size_t payload_index, uint8_t value) {
    auto p = packed;
    p[40 + payload_index] = value;
    reseal(p);
    return p;
  };
  std::string msg;
  EXPECT_EQ(unpack_error(damaged(7, 3), &msg), ErrorCode::invalid_model);  // rank 3 of 3
  EXPECT_NE(msg.find("index 3"), std::string::npos);
  EXPECT_EQ(unpack_error(damaged(2, 9), &msg), ErrorCode::invalid_model);  // 4, 9, 4
  EXPECT_NE(msg.find("twice"), std::string::npos);
  EXPECT_EQ(unpack_error(damaged(2, 19), &msg), ErrorCode::invalid_model);  // 9 - 10 < 0
  EXPECT_NE(msg.find("int32 range"), std::string::npos);
  EXPECT_EQ(unpack_error(damaged(7, 0x80), &msg), ErrorCode::invalid_model);  // cut varint
  EXPECT_NE(msg.find("truncated"), std::string::npos);
}

TEST(TokenPack, MutatedStreamsNeverCrash) {
  // Random damage behind a valid checksum reaches every structural check; each outcome
  // must be a slim::Error or a stream of IDs, never a crash or a huge allocation.
  std::mt19937 rng(5);
  std::vector<int32_t> ids;
  for (int i = 0; i < 500; ++i) ids.push_back(static_cast<int32_t>((rng() % 40) * (rng() % 40)));
  for (bool zstd : {false, true}) {
    const auto packed = pack_token_ids(ids, {.zstd = zstd, .zstd_level = 3});
    for (int round = 0; round < 2000; ++round) {
      auto p = packed;
      const int edits = 1 + rng() % 4;
      for (int e = 0; e < edits; ++e) p[rng() % (p.size() - 4)] = static_cast<uint8_t>(rng());
      reseal(p);
      try {
        const auto got = unpack_token_ids(p);
        EXPECT_LE(got.size(), 1u << 20);
      } catch (const Error& e) {
        EXPECT_NE(e.code(), ErrorCode::internal) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace slim::text
