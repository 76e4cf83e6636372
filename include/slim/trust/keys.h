// Signing keys for model signatures and audit checkpoints: ECDSA P-256 (the OMS key
// method), Ed25519, and SM2 with SM3 for GB/T deployments. Keys are PEM files
// (PKCS#8 private, SubjectPublicKeyInfo public), read and written through OpenSSL 3.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace slim::trust {

enum class KeyAlg { ecdsa_p256, ed25519, sm2 };

std::string_view key_alg_name(KeyAlg alg);  // "ecdsa-p256", "ed25519", "sm2"
KeyAlg parse_key_alg(std::string_view name);

// GM/T 0009-2012's default distinguishing ID. Always set explicitly, because OpenSSL 3
// otherwise signs with an empty ID and no other SM2 implementation would agree.
inline constexpr std::string_view kSm2DefaultId = "1234567812345678";

struct KeyHandle;  // owns an EVP_PKEY

class PublicKey {
 public:
  // PEM SubjectPublicKeyInfo. Throws invalid_argument naming `source` for anything
  // else, and unsupported for a key type or curve slim does not sign with.
  static PublicKey from_pem(std::string_view pem, const std::string& source);
  static PublicKey load(const std::string& path);

  KeyAlg alg() const { return alg_; }
  std::string to_pem() const;
  // OMS key hint: hex SHA-256 of the PEM text, as model_signing writes it.
  std::string hint() const;
  // True when `signature` is valid for `message`. Never throws for a bad signature.
  bool verify(std::span<const uint8_t> message, std::span<const uint8_t> signature,
              std::string_view sm2_id = kSm2DefaultId) const;

 private:
  friend class PrivateKey;
  KeyAlg alg_{};
  std::shared_ptr<KeyHandle> key_;
};

class PrivateKey {
 public:
  static PrivateKey generate(KeyAlg alg);
  // PEM PKCS#8 (or traditional EC) private key, unencrypted.
  static PrivateKey from_pem(std::string_view pem, const std::string& source);
  static PrivateKey load(const std::string& path);

  KeyAlg alg() const { return alg_; }
  std::string to_pem() const;
  PublicKey public_key() const;
  // ECDSA: DER signature over SHA-256; Ed25519: pure; SM2: DER signature with SM3 and
  // the given distinguishing ID.
  std::vector<uint8_t> sign(std::span<const uint8_t> message,
                            std::string_view sm2_id = kSm2DefaultId) const;

 private:
  KeyAlg alg_{};
  std::shared_ptr<KeyHandle> key_;
};

// Writes `text` to `path` via a temporary file and rename, so a crash never leaves a
// half-written key or signature. `mode` is the permission of the new file.
void write_file_atomic(const std::string& path, std::string_view text, unsigned mode = 0644);
// Reads a whole small file (keys, signature bundles), refusing anything over max_size.
std::string read_small_file(const std::string& path, size_t max_size, std::string_view what);

}  // namespace slim::trust
