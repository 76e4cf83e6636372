#include "slim/text/token_pack.h"

#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <new>
#include <unordered_map>

#include "slim/core/error.h"

namespace slim::text {
namespace {

// File layout, little-endian:
//   header (40 bytes): magic "SLTK", u16 version, u16 flags, u64 token count,
//     u32 distinct IDs, u8 index width (bits for `distinct` values), u8 payload layout,
//     2 zero bytes, u64 stored payload size, u64 raw payload size
//   payload (zstd-compressed when flags & kFlagZstd), one of two layouts:
//     kLayoutBitpacked: the distinct IDs ascending as LEB128 varints (first as is, then
//       gap - 1), then per token its index in that table, `width` bits, LSB first.
//       Smallest without zstd.
//     kLayoutRankedVarint: the distinct IDs most frequent first as zigzag-delta varints,
//       then per token its rank as a varint. Byte-aligned, frequent tokens take one byte,
//       and repeated phrases stay repeated byte strings, which is what zstd's matcher
//       needs; bit-packed indices hide those repeats from it.
//   trailer: u32 CRC-32 of everything before it
constexpr char kMagic[4] = {'S', 'L', 'T', 'K'};
constexpr uint16_t kVersion = 1;
constexpr uint16_t kFlagZstd = 1;
constexpr uint8_t kLayoutBitpacked = 0;
constexpr uint8_t kLayoutRankedVarint = 1;
constexpr size_t kHeaderSize = 40;
constexpr size_t kTrailerSize = 4;
constexpr uint64_t kMaxTokens = uint64_t{1} << 32;

int bits_for(size_t distinct) {
  int bits = 0;
  while (distinct > 1 && (size_t{1} << bits) < distinct) ++bits;
  return bits;
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

template <typename T>
T get(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

void put_varint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

uint64_t zigzag(int64_t v) { return v >= 0 ? uint64_t(v) << 1 : ((uint64_t(-v) << 1) - 1); }
int64_t unzigzag(uint64_t v) { return (v & 1) ? -static_cast<int64_t>((v + 1) >> 1) : int64_t(v >> 1); }

std::vector<uint8_t> zstd_compress(const uint8_t* data, size_t size, int level) {
  std::vector<uint8_t> out(ZSTD_compressBound(size));
  const size_t n = ZSTD_compress(out.data(), out.size(), data, size, level);
  if (ZSTD_isError(n))
    throw Error(ErrorCode::internal, std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

std::vector<uint8_t> bitpacked_payload(std::span<const int32_t> ids,
                                       const std::vector<int32_t>& sorted, int bits) {
  std::vector<uint8_t> payload;
  for (size_t i = 0; i < sorted.size(); ++i)
    put_varint(payload, i == 0 ? uint64_t(sorted[0]) : uint64_t(sorted[i] - sorted[i - 1] - 1));
  const size_t body = payload.size();
  payload.resize(body + (ids.size() * bits + 7) / 8, 0);
  uint64_t bitpos = 0;
  for (int32_t id : ids) {
    const uint64_t index = std::lower_bound(sorted.begin(), sorted.end(), id) - sorted.begin();
    for (int b = 0; b < bits; ++b, ++bitpos) {
      if ((index >> b) & 1) payload[body + bitpos / 8] |= uint8_t(1) << (bitpos % 8);
    }
  }
  return payload;
}

std::vector<uint8_t> ranked_payload(std::span<const int32_t> ids) {
  std::unordered_map<int32_t, uint64_t> count;
  for (int32_t id : ids) ++count[id];
  std::vector<std::pair<int32_t, uint64_t>> order(count.begin(), count.end());
  // Ties by ID so the output does not depend on hash order.
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  std::unordered_map<int32_t, uint64_t> rank;
  rank.reserve(order.size());
  std::vector<uint8_t> payload;
  int64_t prev = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    rank[order[i].first] = i;
    put_varint(payload, zigzag(int64_t(order[i].first) - prev));
    prev = order[i].first;
  }
  for (int32_t id : ids) put_varint(payload, rank[id]);
  return payload;
}

struct VarintReader {
  const std::vector<uint8_t>& data;
  size_t pos;
  size_t end;
  const std::string& source;
  uint64_t next(const char* what, uint64_t index) {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (pos >= end || shift > 35)
        throw Error(ErrorCode::invalid_model, source + ": " + what + " " + std::to_string(index) +
                                                  " is truncated or too long");
      const uint8_t b = data[pos++];
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  }
};

}  // namespace

uint32_t crc32(std::span<const uint8_t> data, uint32_t crc) {
  const auto& t = crc_table();
  crc = ~crc;
  for (uint8_t b : data) crc = t[(crc ^ b) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::vector<uint8_t> pack_token_ids(std::span<const int32_t> ids, const PackOptions& options) {
  for (size_t i = 0; i < ids.size(); ++i) {
    check(ids[i] >= 0, ErrorCode::invalid_argument,
          "token ID " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
              " is negative");
  }
  check(ids.size() <= kMaxTokens, ErrorCode::invalid_argument,
        "more than 2^32 tokens in one packed stream");
  std::vector<int32_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const int bits = bits_for(sorted.size());

  uint8_t layout = kLayoutBitpacked;
  uint16_t flags = 0;
  std::vector<uint8_t> payload = bitpacked_payload(ids, sorted, bits);
  std::vector<uint8_t> stored = payload;
  if (options.zstd && !payload.empty()) {
    // Both layouts through zstd; keep whichever of them (or the raw bits) is smallest.
    auto packed_z = zstd_compress(payload.data(), payload.size(), options.zstd_level);
    std::vector<uint8_t> ranked = ranked_payload(ids);
    auto ranked_z = zstd_compress(ranked.data(), ranked.size(), options.zstd_level);
    if (ranked_z.size() < packed_z.size() && ranked_z.size() < stored.size()) {
      layout = kLayoutRankedVarint;
      payload = std::move(ranked);
      stored = std::move(ranked_z);
      flags |= kFlagZstd;
    } else if (packed_z.size() < stored.size()) {
      stored = std::move(packed_z);
      flags |= kFlagZstd;
    }
  }

  std::vector<uint8_t> out;
  out.reserve(kHeaderSize + stored.size() + kTrailerSize);
  out.insert(out.end(), kMagic, kMagic + 4);
  put<uint16_t>(out, kVersion);
  put<uint16_t>(out, flags);
  put<uint64_t>(out, ids.size());
  put<uint32_t>(out, static_cast<uint32_t>(sorted.size()));
  out.push_back(static_cast<uint8_t>(bits));
  out.push_back(layout);
  out.insert(out.end(), 2, 0);
  put<uint64_t>(out, stored.size());
  put<uint64_t>(out, payload.size());
  out.insert(out.end(), stored.begin(), stored.end());
  put<uint32_t>(out, crc32(out));
  return out;
}

std::vector<int32_t> unpack_token_ids(std::span<const uint8_t> data, const std::string& source) {
  auto bad = [&](const std::string& what) {
    throw Error(ErrorCode::invalid_model, source + ": " + what);
  };
  if (data.size() < kHeaderSize + kTrailerSize)
    bad("too short for a packed token stream (" + std::to_string(data.size()) + " bytes)");
  const uint8_t* p = data.data();
  if (std::memcmp(p, kMagic, 4) != 0) bad("not a packed token stream (bad magic)");
  const uint16_t version = get<uint16_t>(p + 4);
  if (version != kVersion)
    throw Error(ErrorCode::unsupported,
                source + ": packed token stream version " + std::to_string(version) +
                    " (this slim reads version " + std::to_string(kVersion) + ")");
  const uint16_t flags = get<uint16_t>(p + 6);
  if (flags & ~kFlagZstd) bad("unknown flags " + std::to_string(flags));
  const uint64_t count = get<uint64_t>(p + 8);
  const uint32_t distinct = get<uint32_t>(p + 16);
  const int bits = p[20];
  const uint8_t layout = p[21];
  const uint64_t stored_size = get<uint64_t>(p + 24);
  const uint64_t raw_size = get<uint64_t>(p + 32);
  if (stored_size != data.size() - kHeaderSize - kTrailerSize)
    bad("payload size " + std::to_string(stored_size) + " does not match the file size " +
        std::to_string(data.size()));
  const uint32_t expected_crc = get<uint32_t>(p + data.size() - kTrailerSize);
  const uint32_t actual_crc = crc32(data.first(data.size() - kTrailerSize));
  if (expected_crc != actual_crc)
    throw Error(ErrorCode::integrity, source + ": checksum mismatch (stored " +
                                          std::to_string(expected_crc) + ", computed " +
                                          std::to_string(actual_crc) + ")");
  if (layout != kLayoutBitpacked && layout != kLayoutRankedVarint)
    bad("unknown payload layout " + std::to_string(layout));
  if (p[22] != 0 || p[23] != 0) bad("reserved header bytes are not zero");
  if (count > kMaxTokens) bad("token count " + std::to_string(count) + " is too large");
  if (distinct > count || (count > 0 && distinct == 0))
    bad(std::to_string(distinct) + " distinct IDs for " + std::to_string(count) + " tokens");
  if (bits != bits_for(distinct))
    bad("index width " + std::to_string(bits) + " bits does not fit " +
        std::to_string(distinct) + " distinct IDs");
  // Each varint takes 1..5 bytes; sizes outside that mean the header was tampered with,
  // and checking them first bounds every allocation below by the file's own size.
  const uint64_t body_bytes = layout == kLayoutBitpacked ? (count * bits + 7) / 8 : 0;
  const uint64_t varints = layout == kLayoutBitpacked ? distinct : uint64_t(distinct) + count;
  if (raw_size < body_bytes + varints || raw_size > body_bytes + 5 * varints)
    bad("raw payload size " + std::to_string(raw_size) + " does not fit " +
        std::to_string(count) + " tokens and " + std::to_string(distinct) + " IDs");

  std::vector<uint8_t> payload;
  const uint8_t* stored = p + kHeaderSize;
  if (flags & kFlagZstd) {
    const unsigned long long content = ZSTD_getFrameContentSize(stored, stored_size);
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN ||
        content != raw_size)
      bad("zstd frame does not hold the " + std::to_string(raw_size) + " bytes the header says");
    // zstd expands at most ~32000x; a larger claim cannot be honest.
    if (raw_size > stored_size * 32768 + 1024) bad("implausible zstd expansion");
    payload.resize(raw_size);
    const size_t n = ZSTD_decompress(payload.data(), payload.size(), stored, stored_size);
    if (ZSTD_isError(n) || n != raw_size)
      bad(std::string("zstd payload is damaged: ") +
          (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output"));
  } else {
    if (stored_size != raw_size) bad("uncompressed payload size differs from the raw size");
    payload.assign(stored, stored + stored_size);
  }

  const size_t table_end = layout == kLayoutBitpacked ? payload.size() - body_bytes : payload.size();
  VarintReader reader{payload, 0, table_end, source};
  std::vector<int32_t> table;
  table.reserve(distinct);
  int64_t prev = layout == kLayoutBitpacked ? -1 : 0;
  for (uint32_t i = 0; i < distinct; ++i) {
    const uint64_t v = reader.next("ID table entry", i);
    const int64_t id = layout == kLayoutBitpacked
                           ? (i == 0 ? int64_t(v) : prev + 1 + int64_t(v))
                           : prev + unzigzag(v);
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      bad("ID table entry " + std::to_string(i) + " is outside the int32 range");
    table.push_back(static_cast<int32_t>(id));
    prev = id;
  }
  if (layout == kLayoutRankedVarint) {
    std::vector<int32_t> check_unique = table;
    std::sort(check_unique.begin(), check_unique.end());
    if (std::adjacent_find(check_unique.begin(), check_unique.end()) != check_unique.end())
      bad("ID table lists an ID twice");
  } else if (reader.pos != table_end) {
    bad("ID table is " + std::to_string(reader.pos) + " bytes, the header implies " +
        std::to_string(table_end));
  }

  std::vector<int32_t> ids;
  try {
    ids.resize(count);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::resource_exhausted,
                source + ": no memory for " + std::to_string(count) + " tokens");
  }
  auto index_error = [&](uint64_t t, uint64_t index) {
    bad("token " + std::to_string(t) + " has index " + std::to_string(index) + " beyond the " +
        std::to_string(distinct) + "-entry ID table");
  };
  if (layout == kLayoutBitpacked) {
    const uint8_t* body = payload.data() + table_end;
    uint64_t bitpos = 0;
    for (uint64_t t = 0; t < count; ++t) {
      uint64_t index = 0;
      for (int b = 0; b < bits; ++b, ++bitpos)
        index |= uint64_t((body[bitpos / 8] >> (bitpos % 8)) & 1) << b;
      if (index >= distinct) index_error(t, index);
      ids[t] = table[index];
    }
  } else {
    for (uint64_t t = 0; t < count; ++t) {
      const uint64_t index = reader.next("token", t);
      if (index >= distinct) index_error(t, index);
      ids[t] = table[index];
    }
    if (reader.pos != payload.size())
      bad(std::to_string(payload.size() - reader.pos) + " stray bytes after the last token");
  }
  return ids;
}

double PackStats::packed_bytes_per_token() const {
  return tokens ? static_cast<double>(packed_bytes) / tokens : 0.0;
}
double PackStats::zstd_raw_bytes_per_token() const {
  return tokens ? static_cast<double>(zstd_raw_bytes) / tokens : 0.0;
}

PackStats measure_packing(std::span<const int32_t> ids, const PackOptions& options) {
  PackStats s;
  s.tokens = ids.size();
  std::vector<int32_t> table(ids.begin(), ids.end());
  std::sort(table.begin(), table.end());
  s.distinct = std::unique(table.begin(), table.end()) - table.begin();
  s.bits_per_id = bits_for(s.distinct);
  s.raw_bytes = ids.size() * 4;
  std::vector<uint8_t> raw;
  raw.reserve(s.raw_bytes);
  for (int32_t id : ids) put<uint32_t>(raw, static_cast<uint32_t>(id));
  s.zstd_raw_bytes = zstd_compress(raw.data(), raw.size(), options.zstd_level).size();
  const auto packed = pack_token_ids(ids, options);
  s.packed_bytes = packed.size();
  s.layout = packed[21] == kLayoutRankedVarint ? "ranked-varint" : "bitpacked";
  s.zstd = (packed[6] & kFlagZstd) != 0;
  return s;
}

}  // namespace slim::text
