#include "slim/trust/digest.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include "trust/test_util.h"

using namespace slim;
using namespace slim::trust;
using namespace slim::trust::testing;

TEST(Digest, KnownVectors) {
  // FIPS 180-2 and GB/T 32905-2016 example "abc".
  EXPECT_EQ(to_hex(hash_bytes(HashAlg::sha256, "abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(hash_bytes(HashAlg::sm3, "abc")),
            "66c7f0f462eeedd9d1f2d46bdc10e4e24167c4875cf2f7a2297da02b8f4ba8e0");
  EXPECT_EQ(to_hex(hash_bytes(HashAlg::sha256, "")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // GB/T 32905 example 2: "abcd" repeated 16 times.
  std::string abcd;
  for (int i = 0; i < 16; ++i) abcd += "abcd";
  EXPECT_EQ(to_hex(hash_bytes(HashAlg::sm3, abcd)),
            "debe9ff92275b8a138604889c18e5a4d6fdb70e5387e5765293dcba39c0c5732");
}

TEST(Digest, StreamingEqualsOneShotAndFile) {
  const std::string data = random_bytes(kFileReadChunk * 2 + 12345, 7);
  auto dir = scratch_dir("f");
  write_file(dir / "blob", data);
  for (HashAlg alg : {HashAlg::sha256, HashAlg::sm3}) {
    Hasher h(alg);
    for (size_t off = 0; off < data.size(); off += 1000003)
      h.update(data.data() + off, std::min<size_t>(1000003, data.size() - off));
    Digest streamed = h.finish();
    EXPECT_EQ(streamed, hash_bytes(alg, data));
    EXPECT_EQ(streamed, hash_file(alg, (dir / "blob").string()));
  }
}

TEST(Digest, FileErrors) {
  auto dir = scratch_dir("f");
  expect_error([&] { hash_file(HashAlg::sha256, (dir / "missing").string()); }, ErrorCode::not_found,
               {"missing", "cannot open"});
  expect_error([&] { hash_file(HashAlg::sha256, dir.string()); }, ErrorCode::invalid_argument,
               {"not a regular file"});
}

TEST(Digest, HexRoundTripAndErrors) {
  std::vector<uint8_t> b = {0x00, 0x7f, 0x80, 0xff, 0x12};
  EXPECT_EQ(to_hex(b), "007f80ff12");
  EXPECT_EQ(from_hex("007F80ff12", "x"), b);
  expect_error([] { from_hex("abc", "field.digest"); }, ErrorCode::invalid_model, {"field.digest", "odd length"});
  expect_error([] { from_hex("zz", "field.digest"); }, ErrorCode::invalid_model, {"not a hex digit at position 0"});
}

TEST(Digest, ParseHashAlg) {
  EXPECT_EQ(parse_hash_alg("sm3"), HashAlg::sm3);
  expect_error([] { parse_hash_alg("md5", "--hash"); }, ErrorCode::invalid_argument, {"--hash", "md5"});
}

TEST(FastChecksum, MatchesXxh3AndStreams) {
  EXPECT_EQ(fast_checksum("", 0), 0x2D06800538D394C2ull);  // XXH3_64bits of empty input
  const std::string data = random_bytes(300000, 3);
  const uint64_t whole = fast_checksum(data.data(), data.size());
  EXPECT_EQ(whole, XXH3_64bits(data.data(), data.size()));
  FastChecksum s;
  for (size_t off = 0; off < data.size(); off += 65536)
    s.update(data.data() + off, std::min<size_t>(65536, data.size() - off));
  EXPECT_EQ(s.value(), whole);
  std::string flipped = data;
  flipped[123456] ^= 1;
  EXPECT_NE(fast_checksum(flipped.data(), flipped.size()), whole);
}
