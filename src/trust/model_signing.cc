#include "slim/trust/model_signing.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "slim/core/error.h"
#include "slim/core/progress.h"
#include "slim/core/thread_pool.h"
#include "trust/json_util.h"

namespace slim::trust {

namespace fs = std::filesystem;
using detail::Json;
using detail::quote;

// ---------------------------------------------------------------- base64, PAE

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_encode(std::span<const uint8_t> in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = uint32_t(in[i]) << 16 | uint32_t(in[i + 1]) << 8 | in[i + 2];
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (size_t rest = in.size() - i) {
    uint32_t v = uint32_t(in[i]) << 16 | (rest == 2 ? uint32_t(in[i + 1]) << 8 : 0);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::vector<uint8_t> base64_decode(std::string_view text, std::string_view what) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  auto fail = [&](const std::string& why) {
    throw Error(ErrorCode::invalid_model, std::string(what) + ": invalid base64: " + why);
  };
  if (text.size() % 4 != 0) fail("length " + std::to_string(text.size()) + " is not a multiple of 4");
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int pad = 0;
    if (last) pad = (text[i + 3] == '=') + (text[i + 2] == '=' && text[i + 3] == '=');
    int v[4];
    for (int k = 0; k < 4 - pad; ++k) {
      v[k] = value(text[i + size_t(k)]);
      if (v[k] < 0) fail("unexpected character at offset " + std::to_string(i + size_t(k)));
    }
    for (int k = 4 - pad; k < 4; ++k) v[k] = 0;
    uint32_t w = uint32_t(v[0]) << 18 | uint32_t(v[1]) << 12 | uint32_t(v[2]) << 6 | uint32_t(v[3]);
    out.push_back(uint8_t(w >> 16));
    if (pad < 2) out.push_back(uint8_t(w >> 8));
    if (pad < 1) out.push_back(uint8_t(w));
    // Non-canonical encodings (stray low bits before the padding) are refused so one
    // signature has exactly one text form.
    if ((pad == 1 && (v[2] & 3)) || (pad == 2 && (v[1] & 15))) fail("non-canonical padding bits");
  }
  return out;
}

std::string dsse_pae(std::string_view payload_type, std::string_view payload) {
  std::string out = "DSSEv1 ";
  out += std::to_string(payload_type.size());
  out += ' ';
  out += payload_type;
  out += ' ';
  out += std::to_string(payload.size());
  out += ' ';
  out += payload;
  return out;
}

// ---------------------------------------------------------------- manifest

Digest ModelManifest::root_digest() const {
  Hasher h(hash_alg);
  for (const auto& r : resources) h.update(r.digest.data(), r.digest.size());
  return h.finish();
}

namespace {

struct FileEntry {
  std::string name;  // relative, '/'-separated
  fs::path path;
  uint64_t size = 0;
};

bool is_ignored(const std::string& rel, const std::vector<std::string>& ignore) {
  // Top-level .git, .github, .gitignore, .gitattributes ... never belong to a model.
  std::string_view top = std::string_view(rel).substr(0, rel.find('/'));
  if (top.substr(0, kGitPrefix.size()) == kGitPrefix) return true;
  for (const auto& ig : ignore) {
    if (ig.empty()) continue;
    if (rel == ig) return true;
    if (rel.size() > ig.size() && rel.compare(0, ig.size(), ig) == 0 && rel[ig.size()] == '/')
      return true;
  }
  return false;
}

std::vector<FileEntry> list_model_files(const fs::path& root, const HashOptions& options,
                                        std::string* model_name) {
  std::error_code ec;
  auto st = fs::symlink_status(root, ec);
  if (ec || !fs::exists(st))
    throw Error(ErrorCode::not_found, root.string() + ": model not found");
  fs::path canon = fs::weakly_canonical(root, ec);
  *model_name = (ec ? root : canon).filename().string();

  auto regular_size = [&](const fs::path& p, const std::string& name) -> uint64_t {
    std::error_code e;
    auto s = fs::symlink_status(p, e);
    if (e) throw Error(ErrorCode::not_found, p.string() + ": cannot stat: " + e.message());
    if (fs::is_symlink(s)) {
      if (!options.allow_symlinks)
        throw Error(ErrorCode::invalid_argument,
                    root.string() + ": '" + name + "' is a symlink (symlinks are not allowed)");
      s = fs::status(p, e);
      if (e || !fs::is_regular_file(s))
        throw Error(ErrorCode::invalid_argument,
                    root.string() + ": symlink '" + name + "' does not point to a regular file");
    }
    if (!fs::is_regular_file(s))
      throw Error(ErrorCode::invalid_argument,
                  root.string() + ": '" + name + "' is not a regular file or directory");
    auto n = fs::file_size(p, e);
    if (e) throw Error(ErrorCode::not_found, p.string() + ": cannot stat: " + e.message());
    return n;
  };

  std::vector<FileEntry> files;
  if (!fs::is_directory(st)) {
    files.push_back({*model_name, root, regular_size(root, *model_name)});
    return files;
  }
  fs::recursive_directory_iterator it(root, fs::directory_options::none, ec), end;
  if (ec) throw Error(ErrorCode::not_found, root.string() + ": cannot list: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw Error(ErrorCode::not_found, root.string() + ": cannot list: " + ec.message());
    const fs::path& p = it->path();
    std::string rel = p.lexically_relative(root).generic_string();
    if (is_ignored(rel, options.ignore_paths)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    auto s = it->symlink_status(ec);
    if (fs::is_directory(s)) continue;
    files.push_back({rel, p, regular_size(p, rel)});
  }
  // Byte order of UTF-8 names equals code point order, which is how OMS sorts.
  std::sort(files.begin(), files.end(),
            [](const FileEntry& a, const FileEntry& b) { return a.name < b.name; });
  return files;
}

// Where the signature lies relative to the model root, if inside it.
std::string relative_inside(const fs::path& root, const std::string& sig) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(root, ec);
  if (ec) return "";
  fs::path s = fs::weakly_canonical(sig, ec);
  if (ec) return "";
  fs::path rel = s.lexically_relative(r);
  std::string g = rel.generic_string();
  if (g.empty() || g == "." || g.rfind("..", 0) == 0) return "";
  return g;
}

}  // namespace

ModelManifest hash_model(const std::string& model_path, const HashOptions& options) {
  ModelManifest m;
  m.hash_alg = options.hash_alg;
  m.allow_symlinks = options.allow_symlinks;
  m.ignore_paths = options.ignore_paths;
  const fs::path root(model_path);
  std::vector<FileEntry> files = list_model_files(root, options, &m.model_name);

  m.resources.resize(files.size());
  uint64_t total = 0;
  for (const auto& f : files) total += f.size;
  // Largest files first, pulled one at a time by each thread: the longest-first
  // order keeps all threads busy until the end on a model with one huge weight file.
  std::vector<size_t> order(files.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return files[a].size > files[b].size; });

  std::unique_ptr<ThreadPool> own_pool;
  if (options.threads > 0) own_pool = std::make_unique<ThreadPool>(options.threads);
  ThreadPool& pool = own_pool ? *own_pool : default_thread_pool();

  std::unique_ptr<Progress> progress;
  if (options.progress) progress = std::make_unique<Progress>("hashing " + m.model_name, int64_t(total));
  std::mutex progress_mu;
  uint64_t done_bytes = 0;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  pool.parallel_for(
      pool.num_threads(),
      [&](int64_t, int64_t) {
        for (;;) {
          if (failed.load()) return;
          size_t k = next.fetch_add(1);
          if (k >= order.size()) return;
          const FileEntry& f = files[order[k]];
          try {
            ResourceDigest& r = m.resources[order[k]];
            r.name = f.name;
            r.alg = options.hash_alg;
            r.digest = hash_file(options.hash_alg, f.path.string());
            r.size = f.size;
          } catch (...) {
            failed = true;
            throw;
          }
          if (progress) {
            std::lock_guard<std::mutex> lock(progress_mu);
            done_bytes += f.size;
            progress->update(int64_t(done_bytes), f.name);
          }
        }
      },
      1);
  return m;
}

// ---------------------------------------------------------------- statement

std::string statement_json(const ModelManifest& m) {
  using OJson = nlohmann::ordered_json;
  OJson resources = OJson::array();
  for (const auto& r : m.resources)
    resources.push_back(
        {{"name", r.name}, {"algorithm", hash_alg_name(r.alg)}, {"digest", to_hex(r.digest)}});
  OJson st;
  st["_type"] = kStatementType;
  st["subject"] = OJson::array(
      {{{"name", m.model_name},
        {"digest", {{std::string(hash_alg_name(m.hash_alg)), to_hex(m.root_digest())}}}}});
  st["predicateType"] = kModelSigningPredicate;
  st["predicate"] = {{"serialization",
                      {{"method", "files"},
                       {"hash_type", hash_alg_name(m.hash_alg)},
                       {"allow_symlinks", m.allow_symlinks},
                       {"ignore_paths", m.ignore_paths}}},
                     {"resources", resources}};
  return st.dump(2);
}

namespace {
// A resource or ignore path must stay inside the model: no absolute paths, no "..",
// no empty components, so a hostile manifest cannot point the verifier elsewhere.
void check_relative_path(const std::string& p, const std::string& ctx) {
  bool ok = !p.empty() && p.front() != '/' && p.find('\0') == std::string::npos;
  size_t start = 0;
  while (ok && start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    std::string_view comp(p.data() + start, end - start);
    if (comp.empty() || comp == "." || comp == "..") ok = false;
    start = end + 1;
  }
  if (!ok) throw Error(ErrorCode::invalid_model, ctx + ": path " + quote(p) + " is not a plain relative path");
}
}  // namespace

ModelManifest parse_statement(std::string_view text, const std::string& source) {
  const std::string ctx = source + ": statement";
  Json st = detail::parse_json(text, ctx);
  if (!st.is_object()) throw Error(ErrorCode::invalid_model, ctx + ": not a JSON object");
  const std::string& type = detail::string_field(st, "_type", ctx);
  if (type != kStatementType)
    throw Error(ErrorCode::integrity, ctx + ": _type is " + quote(type) + ", expected " +
                                          std::string(kStatementType));
  const std::string& ptype = detail::string_field(st, "predicateType", ctx);
  if (ptype != kModelSigningPredicate)
    throw Error(ErrorCode::integrity, ctx + ": predicateType is " + quote(ptype) +
                                          ", expected " + std::string(kModelSigningPredicate));
  const Json& subjects = detail::array_field(st, "subject", ctx);
  if (subjects.size() != 1)
    throw Error(ErrorCode::invalid_model,
                ctx + ": expected exactly one subject, got " + std::to_string(subjects.size()));
  const Json& pred = detail::object_field(st, "predicate", ctx);
  const Json& ser = detail::object_field(pred, "serialization", ctx + ".predicate");
  const std::string sctx = ctx + ".predicate.serialization";
  const std::string& method = detail::string_field(ser, "method", sctx);
  if (method != "files")
    throw Error(ErrorCode::unsupported, sctx + ": method " + quote(method) +
                                            " is not supported (slim verifies method \"files\")");
  ModelManifest m;
  m.hash_alg = parse_hash_alg(detail::string_field(ser, "hash_type", sctx), sctx + ".hash_type");
  if (const Json* a = detail::optional_field(ser, "allow_symlinks")) {
    if (!a->is_boolean())
      throw Error(ErrorCode::invalid_model, sctx + ": allow_symlinks must be a boolean");
    m.allow_symlinks = a->get<bool>();
  }
  if (const Json* ig = detail::optional_field(ser, "ignore_paths")) {
    if (!ig->is_array()) throw Error(ErrorCode::invalid_model, sctx + ": ignore_paths must be an array");
    for (const Json& p : *ig) {
      if (!p.is_string()) throw Error(ErrorCode::invalid_model, sctx + ": ignore_paths entries must be strings");
      check_relative_path(p.get<std::string>(), sctx + ".ignore_paths");
      m.ignore_paths.push_back(p.get<std::string>());
    }
  }
  const std::string subctx = ctx + ".subject[0]";
  m.model_name = detail::string_field(subjects[0], "name", subctx);
  const Json& sdig = detail::object_field(subjects[0], "digest", subctx);
  const std::string& root_hex =
      detail::string_field(sdig, std::string(hash_alg_name(m.hash_alg)).c_str(), subctx + ".digest");

  const Json& res = detail::array_field(pred, "resources", ctx + ".predicate");
  std::set<std::string> seen;
  for (size_t i = 0; i < res.size(); ++i) {
    const std::string rctx = ctx + ".predicate.resources[" + std::to_string(i) + "]";
    ResourceDigest r;
    r.name = detail::string_field(res[i], "name", rctx);
    check_relative_path(r.name, rctx);
    if (!seen.insert(r.name).second)
      throw Error(ErrorCode::invalid_model, rctx + ": duplicate resource " + quote(r.name));
    const std::string& alg = detail::string_field(res[i], "algorithm", rctx);
    r.alg = parse_hash_alg(alg, rctx + ".algorithm");
    if (r.alg != m.hash_alg)
      throw Error(ErrorCode::invalid_model, rctx + ": algorithm " + quote(alg) +
                                                " differs from hash_type " +
                                                std::string(hash_alg_name(m.hash_alg)));
    r.digest = from_hex(detail::string_field(res[i], "digest", rctx), rctx + ".digest");
    if (r.digest.size() != kDigestSize)
      throw Error(ErrorCode::invalid_model, rctx + ": digest has " + std::to_string(r.digest.size()) +
                                                " bytes, expected " + std::to_string(kDigestSize));
    m.resources.push_back(std::move(r));
  }
  Digest root = from_hex(root_hex, subctx + ".digest");
  if (root != m.root_digest())
    throw Error(ErrorCode::integrity,
                ctx + ": subject digest " + quote(root_hex) +
                    " does not match the digest over the listed resources " + to_hex(m.root_digest()));
  return m;
}

// ---------------------------------------------------------------- bundle

std::string bundle_json(const SignatureBundle& b) {
  using OJson = nlohmann::ordered_json;
  OJson sigs = OJson::array();
  for (const auto& s : b.signatures) sigs.push_back({{"sig", base64_encode(s)}});
  OJson out;
  out["mediaType"] = b.media_type;
  out["verificationMaterial"] = {{"publicKey", {{"hint", b.key_hint}}},
                                 {"tlogEntries", OJson::array()}};
  out["dsseEnvelope"] = {
      {"payload", base64_encode({reinterpret_cast<const uint8_t*>(b.payload.data()), b.payload.size()})},
      {"payloadType", b.payload_type},
      {"signatures", sigs}};
  return out.dump(2) + "\n";
}

SignatureBundle parse_bundle(std::string_view text, const std::string& source) {
  if (text.size() > kMaxBundleSize)
    throw Error(ErrorCode::invalid_model, source + ": signature bundle larger than " +
                                              std::to_string(kMaxBundleSize) + " bytes");
  Json j = detail::parse_json(text, source);
  if (!j.is_object()) throw Error(ErrorCode::invalid_model, source + ": bundle is not a JSON object");
  SignatureBundle b;
  b.media_type = detail::string_field(j, "mediaType", source);
  if (b.media_type != kBundleMediaType)
    throw Error(ErrorCode::unsupported, source + ": bundle mediaType " + quote(b.media_type) +
                                            " is not supported (expected " +
                                            std::string(kBundleMediaType) + ")");
  const Json& vm = detail::object_field(j, "verificationMaterial", source);
  if (const Json* pk = detail::optional_field(vm, "publicKey")) {
    if (const Json* hint = detail::optional_field(*pk, "hint")) {
      if (!hint->is_string())
        throw Error(ErrorCode::invalid_model, source + ": verificationMaterial.publicKey.hint must be a string");
      b.key_hint = hint->get<std::string>();
    }
  } else if (detail::optional_field(vm, "certificate") || detail::optional_field(vm, "x509CertificateChain")) {
    throw Error(ErrorCode::unsupported,
                source + ": certificate-based (Sigstore/x509) bundles are not supported; slim verifies key-based bundles");
  } else {
    throw Error(ErrorCode::invalid_model, source + ": verificationMaterial has no publicKey");
  }
  if (detail::optional_field(j, "messageSignature"))
    throw Error(ErrorCode::unsupported, source + ": messageSignature bundles are not model signatures");
  const std::string ectx = source + ": dsseEnvelope";
  const Json& env = detail::object_field(j, "dsseEnvelope", source);
  b.payload_type = detail::string_field(env, "payloadType", ectx);
  auto payload = base64_decode(detail::string_field(env, "payload", ectx), ectx + ".payload");
  b.payload.assign(payload.begin(), payload.end());
  const Json& sigs = detail::array_field(env, "signatures", ectx);
  if (sigs.empty()) throw Error(ErrorCode::invalid_model, ectx + ": no signatures");
  for (size_t i = 0; i < sigs.size(); ++i) {
    const std::string sctx = ectx + ".signatures[" + std::to_string(i) + "]";
    auto sig = base64_decode(detail::string_field(sigs[i], "sig", sctx), sctx + ".sig");
    if (sig.empty()) throw Error(ErrorCode::invalid_model, sctx + ": empty signature");
    b.signatures.push_back(std::move(sig));
  }
  return b;
}

// ---------------------------------------------------------------- sign / verify

std::string default_signature_path(const std::string& model_path) {
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) return (fs::path(model_path) / kDefaultSignatureName).string();
  std::string p = model_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p + ".sig";
}

namespace {
std::vector<std::string> with_signature_ignored(const std::string& model_path,
                                                const std::string& sig_path,
                                                std::vector<std::string> ignore) {
  std::string rel = relative_inside(model_path, sig_path);
  if (!rel.empty() && std::find(ignore.begin(), ignore.end(), rel) == ignore.end())
    ignore.push_back(rel);
  return ignore;
}
}  // namespace

std::string sign_model(const std::string& model_path, const PrivateKey& key,
                       const SignOptions& options, ModelManifest* manifest_out) {
  const std::string sig_path =
      options.signature_path.empty() ? default_signature_path(model_path) : options.signature_path;
  HashOptions h = options.hash;
  for (const auto& p : h.ignore_paths) check_relative_path(p, "--ignore");
  h.ignore_paths = with_signature_ignored(model_path, sig_path, h.ignore_paths);
  ModelManifest m = hash_model(model_path, h);
  SignatureBundle b;
  b.payload = statement_json(m);
  b.key_hint = key.public_key().hint();
  const std::string pae = dsse_pae(b.payload_type, b.payload);
  b.signatures.push_back(key.sign({reinterpret_cast<const uint8_t*>(pae.data()), pae.size()}));
  if (manifest_out) *manifest_out = std::move(m);
  return bundle_json(b);
}

ModelManifest verify_model(const std::string& model_path, const PublicKey& key,
                           const VerifyOptions& options) {
  const std::string sig_path =
      options.signature_path.empty() ? default_signature_path(model_path) : options.signature_path;
  std::error_code ec;
  if (!fs::exists(model_path, ec))
    throw Error(ErrorCode::not_found, model_path + ": model not found");
  SignatureBundle b = parse_bundle(read_small_file(sig_path, kMaxBundleSize, "signature"), sig_path);

  // Signature first: nothing in the payload is believed before it is authenticated.
  const std::string hint = key.hint();
  if (!b.key_hint.empty() && b.key_hint != hint)
    throw Error(ErrorCode::integrity,
                sig_path + ": signed by a different key (bundle key hint " + quote(b.key_hint, 16) +
                    ", given " + std::string(key_alg_name(key.alg())) + " key " + hint.substr(0, 16) + "...)");
  const std::string pae = dsse_pae(b.payload_type, b.payload);
  const std::span<const uint8_t> msg(reinterpret_cast<const uint8_t*>(pae.data()), pae.size());
  bool ok = false;
  for (const auto& s : b.signatures) ok = ok || key.verify(msg, s);
  if (!ok)
    throw Error(ErrorCode::integrity, sig_path + ": signature does not verify with the given " +
                                          std::string(key_alg_name(key.alg())) + " public key");
  if (b.payload_type != kInTotoPayloadType)
    throw Error(ErrorCode::integrity, sig_path + ": DSSE payloadType " + quote(b.payload_type) +
                                          " is not " + std::string(kInTotoPayloadType));
  ModelManifest expected = parse_statement(b.payload, sig_path);

  HashOptions h;
  h.hash_alg = expected.hash_alg;
  h.allow_symlinks = expected.allow_symlinks;
  h.ignore_paths = with_signature_ignored(model_path, sig_path, expected.ignore_paths);
  h.threads = options.threads;
  h.progress = options.progress;
  ModelManifest actual;
  try {
    actual = hash_model(model_path, h);
  } catch (const Error& e) {
    // A symlink or special file that signing would have refused is a mismatch too.
    if (e.code() == ErrorCode::invalid_argument) throw Error(ErrorCode::integrity, e.what());
    throw;
  }

  std::map<std::string, const ResourceDigest*> want, have;
  for (const auto& r : expected.resources) want[r.name] = &r;
  for (const auto& r : actual.resources) have[r.name] = &r;
  std::vector<std::string> problems;
  for (const auto& [name, r] : want) {
    auto it = have.find(name);
    if (it == have.end()) problems.push_back("file '" + name + "' is missing");
    else if (it->second->digest != r->digest)
      problems.push_back("file '" + name + "' changed (" + std::string(hash_alg_name(r->alg)) + " " +
                         to_hex(it->second->digest).substr(0, 16) + "... , signed " +
                         to_hex(r->digest).substr(0, 16) + "...)");
  }
  for (const auto& [name, r] : have)
    if (!want.count(name)) problems.push_back("file '" + name + "' is not in the signed manifest (extra file)");
  if (!problems.empty()) {
    std::string msg = model_path + ": verification failed, " + std::to_string(problems.size()) +
                      (problems.size() == 1 ? " problem: " : " problems: ");
    for (size_t i = 0; i < problems.size() && i < 10; ++i) msg += (i ? "; " : "") + problems[i];
    if (problems.size() > 10) msg += "; ...";
    throw Error(ErrorCode::integrity, msg);
  }
  // Keep sizes from the re-hash so callers can report bytes verified.
  for (auto& r : expected.resources) r.size = have[r.name]->size;
  return expected;
}

}  // namespace slim::trust
