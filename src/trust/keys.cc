#include "slim/trust/keys.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>

#include "slim/core/error.h"
#include "slim/trust/digest.h"

namespace slim::trust {

struct KeyHandle {
  EVP_PKEY* pkey = nullptr;
  explicit KeyHandle(EVP_PKEY* p) : pkey(p) {}
  ~KeyHandle() { EVP_PKEY_free(pkey); }
};

namespace {

std::string openssl_error() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (!e) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

struct Bio {
  BIO* b;
  ~Bio() { BIO_free(b); }
};

struct MdCtx {
  EVP_MD_CTX* c = EVP_MD_CTX_new();
  ~MdCtx() { EVP_MD_CTX_free(c); }
};

// Works out which of slim's algorithms a parsed key is, refusing the rest, so a
// key of the wrong kind never reaches a signature call.
KeyAlg classify(EVP_PKEY* pkey, const std::string& source) {
  if (EVP_PKEY_is_a(pkey, "ED25519")) return KeyAlg::ed25519;
  if (EVP_PKEY_is_a(pkey, "SM2")) return KeyAlg::sm2;
  if (EVP_PKEY_is_a(pkey, "EC")) {
    char group[80] = {0};
    size_t len = 0;
    if (EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group,
                                       &len) != 1) {
      ERR_clear_error();
      throw Error(ErrorCode::unsupported, source + ": EC key without a named curve");
    }
    std::string g(group, len);
    if (g == "prime256v1" || g == "P-256" || g == "secp256r1") return KeyAlg::ecdsa_p256;
    if (g == "SM2") return KeyAlg::sm2;
    throw Error(ErrorCode::unsupported,
                source + ": EC curve " + g + " is not supported (use P-256 or SM2)");
  }
  const char* name = EVP_PKEY_get0_type_name(pkey);
  throw Error(ErrorCode::unsupported, source + ": key type " + std::string(name ? name : "?") +
                                          " is not supported (ecdsa-p256, ed25519, sm2)");
}

// No passphrase callback: an encrypted key must fail, never prompt on a terminal
// that a server or a test does not have.
int no_passphrase(char*, int, int, void*) { return -1; }

// The key `read` (PEM_read_bio_PUBKEY or PEM_read_bio_PrivateKey) finds in `pem`, its
// algorithm checked; else invalid_argument naming `source` and what it is not.
std::pair<KeyAlg, std::shared_ptr<KeyHandle>> key_from_pem(std::string_view pem, EVP_PKEY* (*read)(BIO*, EVP_PKEY**, pem_password_cb*, void*),
                 const std::string& source, const char* not_what) {
  Bio bio{BIO_new_mem_buf(pem.data(), int(pem.size()))};
  if (!bio.b) throw Error(ErrorCode::resource_exhausted, "BIO_new_mem_buf failed");
  EVP_PKEY* pkey = read(bio.b, nullptr, no_passphrase, nullptr);
  if (!pkey) throw Error(ErrorCode::invalid_argument, source + ": " + not_what + ": " + openssl_error());
  auto handle = std::make_shared<KeyHandle>(pkey);
  return {classify(pkey, source), std::move(handle)};
}

// What `write` (a PEM_write_bio_* call) puts in a memory BIO.
std::string pem_text(const std::function<int(BIO*)>& write, const char* what) {
  Bio bio{BIO_new(BIO_s_mem())};
  if (!bio.b || write(bio.b) != 1) throw Error(ErrorCode::internal, std::string(what) + " failed: " + openssl_error());
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.b, &data);
  return std::string(data, size_t(n));
}

const EVP_MD* sign_md(KeyAlg alg) {
  switch (alg) {
    case KeyAlg::ecdsa_p256: return EVP_sha256();
    case KeyAlg::ed25519: return nullptr;  // Ed25519 hashes internally
    case KeyAlg::sm2: return EVP_sm3();
  }
  return nullptr;
}

void set_sm2_id(EVP_PKEY_CTX* pctx, std::string_view id) {
  if (EVP_PKEY_CTX_set1_id(pctx, id.data(), int(id.size())) <= 0)
    throw Error(ErrorCode::internal, "cannot set the SM2 distinguishing ID: " + openssl_error());
}

}  // namespace

std::string_view key_alg_name(KeyAlg alg) {
  switch (alg) {
    case KeyAlg::ecdsa_p256: return "ecdsa-p256";
    case KeyAlg::ed25519: return "ed25519";
    case KeyAlg::sm2: return "sm2";
  }
  return "?";
}

KeyAlg parse_key_alg(std::string_view name) {
  if (name == "ecdsa-p256" || name == "ecdsa") return KeyAlg::ecdsa_p256;
  if (name == "ed25519") return KeyAlg::ed25519;
  if (name == "sm2") return KeyAlg::sm2;
  throw Error(ErrorCode::invalid_argument, "unknown key algorithm '" +
                                               std::string(name.substr(0, 64)) +
                                               "' (expected ecdsa-p256, ed25519 or sm2)");
}

PublicKey PublicKey::from_pem(std::string_view pem, const std::string& source) {
  PublicKey k;
  std::tie(k.alg_, k.key_) = key_from_pem(pem, PEM_read_bio_PUBKEY, source, "not a PEM public key (SubjectPublicKeyInfo)");
  return k;
}

PublicKey PublicKey::load(const std::string& path) {
  return from_pem(read_small_file(path, 1 << 20, "public key"), path);
}

std::string PublicKey::to_pem() const {
  return pem_text([&](BIO* b) { return PEM_write_bio_PUBKEY(b, key_->pkey); }, "PEM_write_bio_PUBKEY");
}

std::string PublicKey::hint() const {
  return to_hex(hash_bytes(HashAlg::sha256, to_pem()));
}

bool PublicKey::verify(std::span<const uint8_t> message, std::span<const uint8_t> signature,
                       std::string_view sm2_id) const {
  MdCtx md;
  EVP_PKEY_CTX* pctx = nullptr;
  if (!md.c || EVP_DigestVerifyInit(md.c, &pctx, sign_md(alg_), nullptr, key_->pkey) != 1)
    throw Error(ErrorCode::internal, "EVP_DigestVerifyInit failed: " + openssl_error());
  if (alg_ == KeyAlg::sm2) set_sm2_id(pctx, sm2_id);
  int rc = EVP_DigestVerify(md.c, signature.data(), signature.size(), message.data(),
                            message.size());
  ERR_clear_error();
  return rc == 1;
}

PrivateKey PrivateKey::generate(KeyAlg alg) {
  EVP_PKEY* pkey = nullptr;
  switch (alg) {
    case KeyAlg::ecdsa_p256: pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"); break;
    case KeyAlg::ed25519: pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"); break;
    case KeyAlg::sm2: pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "SM2"); break;
  }
  if (!pkey)
    throw Error(ErrorCode::internal, "cannot generate a " + std::string(key_alg_name(alg)) +
                                         " key: " + openssl_error());
  PrivateKey k;
  k.alg_ = alg;
  k.key_ = std::make_shared<KeyHandle>(pkey);
  return k;
}

PrivateKey PrivateKey::from_pem(std::string_view pem, const std::string& source) {
  PrivateKey k;
  std::tie(k.alg_, k.key_) = key_from_pem(pem, PEM_read_bio_PrivateKey, source, "not an unencrypted PEM private key");
  return k;
}

PrivateKey PrivateKey::load(const std::string& path) {
  return from_pem(read_small_file(path, 1 << 20, "private key"), path);
}

std::string PrivateKey::to_pem() const {
  return pem_text([&](BIO* b) { return PEM_write_bio_PrivateKey(b, key_->pkey, nullptr, nullptr, 0, nullptr, nullptr); },
                  "PEM_write_bio_PrivateKey");
}

PublicKey PrivateKey::public_key() const {
  // Round trip through DER SubjectPublicKeyInfo: the simplest way in OpenSSL 3 to get a
  // key object that holds only the public half.
  unsigned char* der = nullptr;
  int n = i2d_PUBKEY(key_->pkey, &der);
  if (n <= 0) throw Error(ErrorCode::internal, "i2d_PUBKEY failed: " + openssl_error());
  const unsigned char* p = der;
  EVP_PKEY* pub = d2i_PUBKEY(nullptr, &p, n);
  OPENSSL_free(der);
  if (!pub) throw Error(ErrorCode::internal, "d2i_PUBKEY failed: " + openssl_error());
  PublicKey k;
  k.key_ = std::make_shared<KeyHandle>(pub);
  k.alg_ = classify(pub, "public key");
  return k;
}

std::vector<uint8_t> PrivateKey::sign(std::span<const uint8_t> message,
                                      std::string_view sm2_id) const {
  MdCtx md;
  EVP_PKEY_CTX* pctx = nullptr;
  if (!md.c || EVP_DigestSignInit(md.c, &pctx, sign_md(alg_), nullptr, key_->pkey) != 1)
    throw Error(ErrorCode::internal, "EVP_DigestSignInit failed: " + openssl_error());
  if (alg_ == KeyAlg::sm2) set_sm2_id(pctx, sm2_id);
  size_t len = 0;
  if (EVP_DigestSign(md.c, nullptr, &len, message.data(), message.size()) != 1)
    throw Error(ErrorCode::internal, "EVP_DigestSign (size) failed: " + openssl_error());
  std::vector<uint8_t> sig(len);
  if (EVP_DigestSign(md.c, sig.data(), &len, message.data(), message.size()) != 1)
    throw Error(ErrorCode::internal, "EVP_DigestSign failed: " + openssl_error());
  sig.resize(len);
  return sig;
}

void write_file_atomic(const std::string& path, std::string_view text, unsigned mode) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0)
    throw Error(ErrorCode::invalid_argument, tmp + ": cannot create: " + std::strerror(errno));
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(ErrorCode::resource_exhausted, tmp + ": write failed: " + std::strerror(err));
    }
    off += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::resource_exhausted, tmp + ": fsync/close failed");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::invalid_argument, path + ": rename failed: " + std::strerror(err));
  }
}

std::string read_small_file(const std::string& path, size_t max_size, std::string_view what) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    throw Error(ErrorCode::not_found, path + ": " + std::string(what) + " not found");
  if (!std::filesystem::is_regular_file(status))
    throw Error(ErrorCode::invalid_argument,
                path + ": " + std::string(what) + " is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::not_found, path + ": cannot open " + std::string(what));
  std::string data;
  char buf[65536];
  while (in) {
    in.read(buf, sizeof buf);
    data.append(buf, size_t(in.gcount()));
    if (data.size() > max_size)
      throw Error(ErrorCode::invalid_model, path + ": " + std::string(what) + " is larger than " +
                                                std::to_string(max_size) + " bytes");
  }
  return data;
}

}  // namespace slim::trust
