#include "slim/serve/model_guard.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "slim/core/error.h"
#include "slim/trust/digest.h"

namespace slim::serve {
namespace fs = std::filesystem;

std::string folder_fingerprint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  std::vector<std::string> lines;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code fe;
    if (!it->is_regular_file(fe)) continue;
    const auto size = it->file_size(fe);
    const auto mtime = it->last_write_time(fe).time_since_epoch().count();
    if (fe) continue;  // gone between listing and looking: the next poll sees the folder settled
    lines.push_back(fs::relative(it->path(), dir, fe).generic_string() + " " + std::to_string(size) + " " +
                    std::to_string(mtime));
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

std::string folder_digest(const std::string& dir) {
  try {
    const trust::ModelManifest m = trust::hash_model(dir, trust::HashOptions{});
    return std::string(trust::hash_alg_name(m.hash_alg)) + ":" + trust::to_hex(m.root_digest());
  } catch (const Error&) {
    return "";  // a file vanished or cannot be read: the folder is not settled
  }
}

namespace {

trust::HashOptions version_hash_options() {
  trust::HashOptions h;
  h.ignore_paths = {std::string(trust::kDefaultSignatureName)};
  return h;
}

VerifiedVersion from_manifest(const trust::ModelManifest& m, std::string signer) {
  VerifiedVersion v;
  v.digest = std::string(trust::hash_alg_name(m.hash_alg)) + ":" + trust::to_hex(m.root_digest());
  v.signer = std::move(signer);
  v.files = m.resources;
  return v;
}

}  // namespace

VerifiedVersion verify_version(const std::string& dir, std::span<const trust::PublicKey> keys) {
  if (keys.empty()) return from_manifest(trust::hash_model(dir, version_hash_options()), "");
  const std::string sig = (fs::path(dir) / trust::kDefaultSignatureName).string();
  if (!fs::exists(sig))
    throw Error(ErrorCode::integrity, dir + ": no signature bundle (" + std::string(trust::kDefaultSignatureName) +
                                          ") and signatures are required");
  std::string reasons;
  for (const trust::PublicKey& key : keys) {
    try {
      trust::VerifyOptions vo;
      vo.signature_path = sig;
      return from_manifest(trust::verify_model(dir, key, vo), key.hint());
    } catch (const Error& e) {
      reasons += std::string(reasons.empty() ? "" : "; ") + e.what();
    }
  }
  throw Error(ErrorCode::integrity, "signature check failed: " + reasons);
}

std::string changed_files(const std::string& dir, const VerifiedVersion& verified) {
  trust::HashOptions h = version_hash_options();
  if (!verified.files.empty()) h.hash_alg = verified.files.front().alg;
  trust::ModelManifest now;
  try {
    now = trust::hash_model(dir, h);
  } catch (const Error& e) {
    return e.what();
  }
  std::map<std::string, const trust::ResourceDigest*> current;
  for (const auto& r : now.resources) current[r.name] = &r;
  for (const auto& r : verified.files) {
    auto it = current.find(r.name);
    if (it == current.end()) return r.name + " is missing";
    if (it->second->digest != r.digest) return r.name + " changed";
    current.erase(it);
  }
  if (!current.empty()) return current.begin()->first + " was added";
  return "";
}

}  // namespace slim::serve
