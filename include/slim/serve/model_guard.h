// What `slim serve` checks about a model version folder before and while serving it:
// a fingerprint of its files (names, sizes, modification times) that repository polling
// compares between polls, the OMS signature gate (the folder's model.sig must verify with
// one of the trusted keys over exactly the files in the folder), and the digests of the
// files as verified at load, which the integrity check compares the files with later.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "slim/trust/keys.h"
#include "slim/trust/model_signing.h"

namespace slim::serve {

// One line per regular file under `dir` ("path size mtime_ns", sorted); "" when the
// folder does not exist. Cheap: no file is read.
std::string folder_fingerprint(const std::string& dir);

// The content digest of a folder: "sha256:<hex>" over every file's digest and name (the
// OMS subject digest of the whole folder); "" when it cannot be read whole. Polling uses it
// second, after the fingerprint changed, so a touched or rewritten but equal file does not
// reload a model.
std::string folder_digest(const std::string& dir);

struct VerifiedVersion {
  std::string digest;  // "sha256:<hex>" over the files' digests (the OMS subject digest)
  std::string signer;  // hint of the key whose signature verified ("" unsigned)
  std::vector<trust::ResourceDigest> files;
};

// Hashes every file of a version folder but its model.sig. With keys, the folder must
// first carry a model.sig that verifies with one of them over exactly its files; else
// Error(integrity) saying why for each key (missing bundle, bad signature, which file
// changed, is missing or was added).
VerifiedVersion verify_version(const std::string& dir, std::span<const trust::PublicKey> keys);

// Re-hashes the folder and compares it with what was verified: "" when it is the same,
// else what differs first ("model.onnx changed", "model.onnx is missing", "extra.bin was
// added").
std::string changed_files(const std::string& dir, const VerifiedVersion& verified);

}  // namespace slim::serve
