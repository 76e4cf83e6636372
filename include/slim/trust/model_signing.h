// Model signatures in the OpenSSF Model Signing (OMS) format that sigstore's
// `model_signing` writes: a Sigstore bundle v0.3 (JSON) holding a DSSE envelope whose
// payload is an in-toto Statement v1 with predicate https://model_signing/signature/v1.0.
//
// What slim implements of the format (docs/compliance.md has the full statement):
// - serialization method "files" only: one resource per regular file, named by its
//   '/'-separated path relative to the model root (the file name for a one-file model),
//   sorted by byte order; hash_type "sha256" (OMS) or "sm3" (slim extension).
// - subject: one entry, name = the model directory (or file) name, digest = hash over
//   the concatenated raw resource digests in manifest order, keyed "sha256" or "sm3".
// - bundle: mediaType application/vnd.dev.sigstore.bundle.v0.3+json,
//   verificationMaterial.publicKey.hint = hex SHA-256 of the signer's PEM public key,
//   empty tlogEntries (key-based signing, no transparency log), one DSSE signature over
//   PAE("application/vnd.in-toto+json", payload).
// - keys: ECDSA P-256 with SHA-256 (OMS "key" method, DER signature), Ed25519, and
//   SM2 with SM3 and distinguishing ID "1234567812345678" (slim extension).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slim/trust/digest.h"
#include "slim/trust/keys.h"

namespace slim::trust {

inline constexpr std::string_view kBundleMediaType =
    "application/vnd.dev.sigstore.bundle.v0.3+json";
inline constexpr std::string_view kInTotoPayloadType = "application/vnd.in-toto+json";
inline constexpr std::string_view kStatementType = "https://in-toto.io/Statement/v1";
inline constexpr std::string_view kModelSigningPredicate =
    "https://model_signing/signature/v1.0";
inline constexpr std::string_view kDefaultSignatureName = "model.sig";
// Always ignored at the model root (OMS ignores the same names).
inline constexpr std::string_view kGitPrefix = ".git";
// A bundle lists one line per file; 64 MiB is far beyond any real model's manifest.
inline constexpr size_t kMaxBundleSize = size_t(64) << 20;

std::string base64_encode(std::span<const uint8_t> bytes);
// Standard alphabet with padding; whitespace is not accepted. Throws invalid_model
// naming `what`.
std::vector<uint8_t> base64_decode(std::string_view text, std::string_view what);

// DSSE v1 pre-authentication encoding: "DSSEv1 " len(type) " " type " " len(body) " " body.
std::string dsse_pae(std::string_view payload_type, std::string_view payload);

struct ResourceDigest {
  std::string name;  // path relative to the model root, '/'-separated
  HashAlg alg = HashAlg::sha256;
  Digest digest;
  uint64_t size = 0;  // bytes hashed; not part of the signed statement
};

struct ModelManifest {
  std::string model_name;
  HashAlg hash_alg = HashAlg::sha256;
  bool allow_symlinks = false;
  std::vector<std::string> ignore_paths;
  std::vector<ResourceDigest> resources;  // sorted by name
  // The subject digest: hash_alg over the resource digests in order.
  Digest root_digest() const;
};

struct HashOptions {
  HashAlg hash_alg = HashAlg::sha256;
  // Paths relative to the model root, skipped with everything below them.
  std::vector<std::string> ignore_paths;
  bool allow_symlinks = false;  // when true, a symlink to a file is hashed as the file
  int threads = 0;              // 0 = the process-wide pool
  bool progress = false;        // show slim::Progress while hashing
};

// Walks a model (a file or a directory) and hashes every file, several at a time.
// Top-level ".git*" entries are skipped. Throws not_found for a missing model,
// invalid_argument for a symlink (unless allowed) or a special file.
ModelManifest hash_model(const std::string& model_path, const HashOptions& options);

// The in-toto statement for a manifest, as the JSON text that gets signed.
std::string statement_json(const ModelManifest& manifest);
// Parses and checks a statement: _type, predicateType, one subject whose digest
// matches the resources, serialization method "files". Throws integrity for a
// statement that is well-formed but not a consistent model signature, invalid_model
// for malformed JSON or fields.
ModelManifest parse_statement(std::string_view json, const std::string& source);

struct SignatureBundle {
  std::string media_type = std::string(kBundleMediaType);
  std::string key_hint;  // may be empty (older bundles)
  std::string payload_type = std::string(kInTotoPayloadType);
  std::string payload;  // decoded DSSE payload bytes
  std::vector<std::vector<uint8_t>> signatures;
};

std::string bundle_json(const SignatureBundle& bundle);
// Strict parse of a bundle: unknown media type is unsupported, anything malformed is
// invalid_model; the message names `source` and the field.
SignatureBundle parse_bundle(std::string_view json, const std::string& source);

// Where `slim sign` puts the signature by default: MODEL/model.sig inside a directory,
// MODEL.sig beside a one-file model.
std::string default_signature_path(const std::string& model_path);

struct SignOptions {
  HashOptions hash;
  std::string signature_path;  // skipped when inside the model; default_signature_path if empty
};

// Hashes the model and returns the bundle JSON (the caller writes it).
std::string sign_model(const std::string& model_path, const PrivateKey& key,
                       const SignOptions& options, ModelManifest* manifest_out = nullptr);

struct VerifyOptions {
  std::string signature_path;  // default_signature_path if empty
  int threads = 0;
  bool progress = false;
};

// What loaders and the server call before a model is used. Verifies the bundle's
// signature with `key`, the statement, and then re-hashes every file: a changed,
// missing or extra file, a wrong key or a wrong payload/predicate type throws
// Error(integrity) naming the file and the reason. Returns the verified manifest.
ModelManifest verify_model(const std::string& model_path, const PublicKey& key,
                           const VerifyOptions& options);

}  // namespace slim::trust
