// Token-ID packing: a lossless codec for streams of token IDs (datasets, prompt caches).
// IDs the stream uses are remapped to a dense range and bit-packed at the minimal width;
// with zstd on, a byte-aligned layout (IDs ranked by frequency, varint ranks) is tried too
// and the smaller kept. A versioned header and CRC-32 make damage detectable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace slim::text {

struct PackOptions {
  bool zstd = true;     // try zstd on both layouts; the raw bits are kept if it does not help
  int zstd_level = 19;
};

// Packs IDs (each >= 0) into a self-describing byte buffer.
// Throws invalid_argument for a negative ID.
std::vector<uint8_t> pack_token_ids(std::span<const int32_t> ids, const PackOptions& options = {});

// Reverses pack_token_ids. Throws invalid_model (bad magic, version, sizes) or integrity
// (checksum mismatch), naming `source`.
std::vector<int32_t> unpack_token_ids(std::span<const uint8_t> data,
                                      const std::string& source = "packed token stream");

struct PackStats {
  size_t tokens = 0;
  size_t distinct = 0;     // distinct IDs in the stream
  int bits_per_id = 0;     // packed width
  size_t raw_bytes = 0;    // 4 bytes per token (uint32)
  size_t zstd_raw_bytes = 0;  // zstd of the raw uint32 stream, same level
  size_t packed_bytes = 0;    // pack_token_ids output, header included
  std::string layout;         // "bitpacked" or "ranked-varint"
  bool zstd = false;          // whether the payload ended up zstd-compressed
  double packed_bytes_per_token() const;
  double zstd_raw_bytes_per_token() const;
};

// Measures the codec against raw uint32 and zstd(raw uint32) for the same IDs.
PackStats measure_packing(std::span<const int32_t> ids, const PackOptions& options = {});

// CRC-32 (IEEE 802.3, as zlib computes it); exposed for tests.
uint32_t crc32(std::span<const uint8_t> data, uint32_t crc = 0);

}  // namespace slim::text
