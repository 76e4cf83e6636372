// Digests for the trust module: cryptographic hashes (SHA-256, SM3) that signatures and
// the audit chain are built on, streamed so a multi-gigabyte weight file is never read
// whole, and a fast non-cryptographic checksum (XXH3-64) for periodic in-memory checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace slim::trust {

enum class HashAlg { sha256, sm3 };

// "sha256" / "sm3": the names used in manifests, audit records and on the command line.
std::string_view hash_alg_name(HashAlg alg);
// Throws invalid_argument naming `what` for an unknown name.
HashAlg parse_hash_alg(std::string_view name, std::string_view what = "hash algorithm");
constexpr size_t kDigestSize = 32;  // both SHA-256 and SM3 produce 256 bits

using Digest = std::vector<uint8_t>;

// An incremental hash over OpenSSL's EVP interface.
class Hasher {
 public:
  explicit Hasher(HashAlg alg);
  ~Hasher();
  Hasher(Hasher&&) noexcept;
  Hasher& operator=(Hasher&&) noexcept;
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Digest finish();  // the hasher must not be used afterwards
  HashAlg alg() const { return alg_; }

 private:
  HashAlg alg_;
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

Digest hash_bytes(HashAlg alg, const void* data, size_t size);
inline Digest hash_bytes(HashAlg alg, std::string_view s) {
  return hash_bytes(alg, s.data(), s.size());
}

// Hashes a file with large sequential reads (kFileReadChunk at a time). Throws
// not_found when it cannot be opened and invalid_model when a read fails.
constexpr size_t kFileReadChunk = size_t(4) << 20;
Digest hash_file(HashAlg alg, const std::string& path);

std::string to_hex(std::span<const uint8_t> bytes);
// Strict lowercase/uppercase hex decoding; throws invalid_model naming `what`.
std::vector<uint8_t> from_hex(std::string_view hex, std::string_view what);

// XXH3-64 of a memory range: not collision resistant, only for catching accidental
// or stray-pointer corruption of data whose cryptographic digest was verified once.
uint64_t fast_checksum(const void* data, size_t size);

// Streaming form of fast_checksum, so a large region can be checked in slices.
class FastChecksum {
 public:
  FastChecksum();
  ~FastChecksum();
  FastChecksum(const FastChecksum&) = delete;
  FastChecksum& operator=(const FastChecksum&) = delete;
  void reset();
  void update(const void* data, size_t size);
  uint64_t value() const;

 private:
  void* state_;  // XXH3_state_t, kept opaque so callers do not include xxhash.h
};

}  // namespace slim::trust
