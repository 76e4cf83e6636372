#include "slim/trust/digest.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "slim/core/error.h"

namespace slim::trust {

std::string_view hash_alg_name(HashAlg alg) {
  switch (alg) {
    case HashAlg::sha256: return "sha256";
    case HashAlg::sm3: return "sm3";
  }
  return "?";
}

HashAlg parse_hash_alg(std::string_view name, std::string_view what) {
  if (name == "sha256") return HashAlg::sha256;
  if (name == "sm3") return HashAlg::sm3;
  throw Error(ErrorCode::invalid_argument, std::string(what) + ": unknown hash algorithm '" +
                                               std::string(name.substr(0, 64)) +
                                               "' (expected sha256 or sm3)");
}

namespace {
const EVP_MD* evp_md(HashAlg alg) {
  const EVP_MD* md = alg == HashAlg::sha256 ? EVP_sha256() : EVP_sm3();
  if (!md)
    throw Error(ErrorCode::unsupported,
                "this OpenSSL build has no " + std::string(hash_alg_name(alg)));
  return md;
}
}  // namespace

struct Hasher::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Hasher::Hasher(HashAlg alg) : alg_(alg), ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  if (!ctx_->md || EVP_DigestInit_ex(ctx_->md, evp_md(alg), nullptr) != 1)
    throw Error(ErrorCode::internal, "EVP_DigestInit_ex failed");
}
Hasher::~Hasher() = default;
Hasher::Hasher(Hasher&&) noexcept = default;
Hasher& Hasher::operator=(Hasher&&) noexcept = default;

void Hasher::update(const void* data, size_t size) {
  if (size == 0) return;
  if (EVP_DigestUpdate(ctx_->md, data, size) != 1)
    throw Error(ErrorCode::internal, "EVP_DigestUpdate failed");
}

Digest Hasher::finish() {
  Digest out(EVP_MAX_MD_SIZE);
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx_->md, out.data(), &n) != 1)
    throw Error(ErrorCode::internal, "EVP_DigestFinal_ex failed");
  out.resize(n);
  return out;
}

Digest hash_bytes(HashAlg alg, const void* data, size_t size) {
  Hasher h(alg);
  h.update(data, size);
  return h.finish();
}

Digest hash_file(HashAlg alg, const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(ErrorCode::not_found, path + ": cannot open: " + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw Error(ErrorCode::invalid_argument, path + ": not a regular file");
  // The kernel's readahead keeps the disk busy while we hash the previous chunk.
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  Hasher h(alg);
  std::unique_ptr<uint8_t[]> buf(new uint8_t[kFileReadChunk]);
  for (;;) {
    ssize_t n = ::read(fd, buf.get(), kFileReadChunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::invalid_model, path + ": read failed: " + std::strerror(errno));
    }
    if (n == 0) break;
    h.update(buf.get(), size_t(n));
  }
  return h.finish();
}

std::string to_hex(std::span<const uint8_t> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return s;
}

std::vector<uint8_t> from_hex(std::string_view hex, std::string_view what) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0)
    throw Error(ErrorCode::invalid_model,
                std::string(what) + ": hex string has odd length " + std::to_string(hex.size()));
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      throw Error(ErrorCode::invalid_model, std::string(what) + ": not a hex digit at position " +
                                                std::to_string(hi < 0 ? 2 * i : 2 * i + 1));
    out[i] = uint8_t(hi << 4 | lo);
  }
  return out;
}

uint64_t fast_checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

FastChecksum::FastChecksum() : state_(XXH3_createState()) {
  if (!state_) throw Error(ErrorCode::resource_exhausted, "XXH3_createState failed");
  reset();
}
FastChecksum::~FastChecksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void FastChecksum::reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }
void FastChecksum::update(const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}
uint64_t FastChecksum::value() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace slim::trust
