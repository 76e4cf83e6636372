#include "slim/trust/model_signing.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "trust/test_util.h"

using namespace slim;
using namespace slim::trust;
using namespace slim::trust::testing;
namespace fs = std::filesystem;

namespace {

std::span<const uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

fs::path make_model(const std::string& tag) {
  fs::path dir = scratch_dir(tag) / "tiny_model";
  write_file(dir / "model.onnx", random_bytes(70000, 1));
  write_file(dir / "weights" / "layer0.bin", random_bytes(5 << 20, 2));  // spans read chunks
  write_file(dir / "weights" / "layer1.bin", random_bytes(1000, 3));
  write_file(dir / "config.json", "{\"hidden\": 16}");
  write_file(dir / "empty.txt", "");
  write_file(dir / ".gitattributes", "*.bin filter=lfs");
  write_file(dir / ".git" / "HEAD", "ref: refs/heads/main");
  return dir;
}

std::string sign_to_default(const fs::path& model, const PrivateKey& key, HashAlg alg = HashAlg::sha256) {
  SignOptions opt;
  opt.hash.hash_alg = alg;
  std::string bundle = sign_model(model.string(), key, opt);
  write_file_atomic(default_signature_path(model.string()), bundle);
  return bundle;
}

ModelManifest verify_default(const fs::path& model, const PublicKey& pub) {
  return verify_model(model.string(), pub, VerifyOptions{});
}

// Re-signs a bundle after `edit` changes its decoded parts, to build validly signed
// bundles with a wrong payload type or predicate.
std::string resign(const std::string& bundle_text, const PrivateKey& key,
                   const std::function<void(SignatureBundle&)>& edit) {
  SignatureBundle b = parse_bundle(bundle_text, "bundle");
  edit(b);
  const std::string pae = dsse_pae(b.payload_type, b.payload);
  b.signatures = {key.sign(bytes(pae))};
  return bundle_json(b);
}

}  // namespace

TEST(Dsse, PaeMatchesSpecExample) {
  // The example from the DSSE protocol specification.
  EXPECT_EQ(dsse_pae("http://example.com/HelloWorld", "hello world"),
            "DSSEv1 29 http://example.com/HelloWorld 11 hello world");
  EXPECT_EQ(dsse_pae("", ""), "DSSEv1 0  0 ");
}

TEST(Base64, RoundTripAndStrictness) {
  for (size_t n = 0; n < 40; ++n) {
    std::string s = random_bytes(n, uint32_t(n));
    std::string enc = base64_encode(bytes(s));
    auto dec = base64_decode(enc, "x");
    EXPECT_EQ(std::string(dec.begin(), dec.end()), s);
  }
  EXPECT_EQ(base64_encode(bytes("foobar")), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(bytes("fo")), "Zm8=");
  expect_error([] { base64_decode("Zm9", "env.payload"); }, ErrorCode::invalid_model, {"env.payload", "multiple of 4"});
  expect_error([] { base64_decode("Zm!=", "sig"); }, ErrorCode::invalid_model, {"unexpected character"});
  expect_error([] { base64_decode("Zm9=", "sig"); }, ErrorCode::invalid_model, {"non-canonical"});
  expect_error([] { base64_decode("Z===", "sig"); }, ErrorCode::invalid_model, {"sig"});
}

TEST(ModelManifest, ListsSortedFilesIgnoringGitAndHashesMatch) {
  fs::path model = make_model("m");
  ModelManifest m = hash_model(model.string(), HashOptions{});
  std::vector<std::string> names;
  for (const auto& r : m.resources) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "empty.txt", "model.onnx", "weights/layer0.bin",
                                             "weights/layer1.bin"}));
  EXPECT_EQ(m.model_name, "tiny_model");
  for (const auto& r : m.resources)
    EXPECT_EQ(r.digest, hash_bytes(HashAlg::sha256, read_file(model / r.name))) << r.name;
  Hasher root(HashAlg::sha256);
  for (const auto& r : m.resources) root.update(r.digest.data(), r.digest.size());
  EXPECT_EQ(m.root_digest(), root.finish());
  // Parallel and serial hashing agree.
  HashOptions one;
  one.threads = 1;
  EXPECT_EQ(hash_model(model.string(), one).root_digest(), m.root_digest());
}

TEST(ModelManifest, StatementRoundTrip) {
  fs::path model = make_model("m");
  HashOptions opt;
  opt.hash_alg = HashAlg::sm3;
  opt.ignore_paths = {"config.json"};
  ModelManifest m = hash_model(model.string(), opt);
  ASSERT_EQ(m.resources.size(), 4u);
  std::string text = statement_json(m);
  auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["predicateType"], "https://model_signing/signature/v1.0");
  EXPECT_EQ(j["_type"], "https://in-toto.io/Statement/v1");
  EXPECT_EQ(j["predicate"]["serialization"]["method"], "files");
  EXPECT_EQ(j["predicate"]["serialization"]["hash_type"], "sm3");
  EXPECT_EQ(j["subject"][0]["digest"]["sm3"], to_hex(m.root_digest()));
  ModelManifest back = parse_statement(text, "s");
  EXPECT_EQ(back.model_name, m.model_name);
  EXPECT_EQ(back.ignore_paths, m.ignore_paths);
  ASSERT_EQ(back.resources.size(), m.resources.size());
  for (size_t i = 0; i < m.resources.size(); ++i) {
    EXPECT_EQ(back.resources[i].name, m.resources[i].name);
    EXPECT_EQ(back.resources[i].digest, m.resources[i].digest);
  }
}

class SignVerify : public ::testing::TestWithParam<KeyAlg> {
 protected:
  void SetUp() override {
    key = PrivateKey::generate(GetParam());
    pub = key.public_key();
    model = make_model("sv");
    bundle = sign_to_default(model, key, GetParam() == KeyAlg::sm2 ? HashAlg::sm3 : HashAlg::sha256);
  }
  PrivateKey key;
  PublicKey pub;
  fs::path model;
  std::string bundle;
};

TEST_P(SignVerify, ValidSignatureVerifies) {
  ModelManifest m = verify_default(model, pub);
  EXPECT_EQ(m.resources.size(), 5u);
  auto j = nlohmann::json::parse(bundle);
  EXPECT_EQ(j["mediaType"], "application/vnd.dev.sigstore.bundle.v0.3+json");
  EXPECT_EQ(j["verificationMaterial"]["publicKey"]["hint"], pub.hint());
  EXPECT_EQ(j["dsseEnvelope"]["payloadType"], "application/vnd.in-toto+json");
}

TEST_P(SignVerify, ChangedByteIsNamed) {
  std::string w = read_file(model / "weights/layer0.bin");
  w[3 << 20] ^= 0x01;
  write_file(model / "weights/layer0.bin", w);
  expect_error([&] { verify_default(model, pub); }, ErrorCode::integrity,
               {"file 'weights/layer0.bin' changed", "1 problem"});
}

TEST_P(SignVerify, RenamedFileIsMissingPlusExtra) {
  fs::rename(model / "config.json", model / "config2.json");
  expect_error([&] { verify_default(model, pub); }, ErrorCode::integrity,
               {"file 'config.json' is missing", "file 'config2.json' is not in the signed manifest"});
}

TEST_P(SignVerify, RemovedFileIsNamed) {
  fs::remove(model / "weights/layer1.bin");
  expect_error([&] { verify_default(model, pub); }, ErrorCode::integrity, {"file 'weights/layer1.bin' is missing"});
}

TEST_P(SignVerify, AddedFileIsNamed) {
  write_file(model / "weights" / "extra.bin", "x");
  expect_error([&] { verify_default(model, pub); }, ErrorCode::integrity,
               {"file 'weights/extra.bin' is not in the signed manifest (extra file)"});
  // .git* at the root stays ignored, as the manifest says.
  fs::remove(model / "weights" / "extra.bin");
  write_file(model / ".gitignore", "*.tmp");
  EXPECT_NO_THROW(verify_default(model, pub));
}

TEST_P(SignVerify, SwappedSignatureFails) {
  // A valid signature by the same key, but over another model's statement.
  fs::path other = scratch_dir("other") / "tiny_model";
  write_file(other / "a.bin", "other model");
  SignOptions opt;
  auto other_bundle = parse_bundle(sign_model(other.string(), key, opt), "other");
  auto mine = parse_bundle(bundle, "mine");
  mine.signatures = other_bundle.signatures;
  write_file(model / "model.sig", bundle_json(mine));
  expect_error([&] { verify_default(model, pub); }, ErrorCode::integrity, {"signature does not verify"});
}

TEST_P(SignVerify, WrongKeyFails) {
  PublicKey other = PrivateKey::generate(GetParam()).public_key();
  expect_error([&] { verify_default(model, other); }, ErrorCode::integrity, {"model.sig", "signed by a different key"});
  // Without a hint the signature check itself must catch it.
  auto b = parse_bundle(bundle, "b");
  b.key_hint.clear();
  write_file(model / "model.sig", bundle_json(b));
  expect_error([&] { verify_default(model, other); }, ErrorCode::integrity, {"signature does not verify"});
  // A key of another algorithm too.
  KeyAlg alt = GetParam() == KeyAlg::ed25519 ? KeyAlg::sm2 : KeyAlg::ed25519;
  expect_error([&] { verify_default(model, PrivateKey::generate(alt).public_key()); }, ErrorCode::integrity,
               {"signature does not verify"});
}

TEST_P(SignVerify, WrongPayloadOrPredicateTypeFails) {
  write_file(model / "model.sig", resign(bundle, key, [](SignatureBundle& b) { b.payload_type = "text/plain"; }));
  expect_error([&] { verify_default(model, pub); }, ErrorCode::integrity, {"payloadType 'text/plain'"});
  write_file(model / "model.sig", resign(bundle, key, [](SignatureBundle& b) {
               auto j = nlohmann::json::parse(b.payload);
               j["predicateType"] = "https://slsa.dev/provenance/v1";
               b.payload = j.dump();
             }));
  expect_error([&] { verify_default(model, pub); }, ErrorCode::integrity,
               {"predicateType is 'https://slsa.dev/provenance/v1'"});
  write_file(model / "model.sig", resign(bundle, key, [](SignatureBundle& b) {
               auto j = nlohmann::json::parse(b.payload);
               j["predicate"]["resources"][0]["digest"] = std::string(64, 'a');
               b.payload = j.dump();
             }));
  expect_error([&] { verify_default(model, pub); }, ErrorCode::integrity, {"subject digest"});
  // Tampered payload without re-signing.
  auto b = parse_bundle(bundle, "b");
  b.payload[b.payload.find("sha256") != std::string::npos ? b.payload.find("sha256") : b.payload.find("sm3")] = 'S';
  write_file(model / "model.sig", bundle_json(b));
  expect_error([&] { verify_default(model, pub); }, ErrorCode::integrity, {"signature does not verify"});
}

INSTANTIATE_TEST_SUITE_P(AllKeyTypes, SignVerify,
                         ::testing::Values(KeyAlg::ecdsa_p256, KeyAlg::ed25519, KeyAlg::sm2),
                         [](const auto& info) {
                           std::string n(key_alg_name(info.param));
                           for (auto& c : n) if (c == '-') c = '_';
                           return n;
                         });

TEST(ModelSigning, SingleFileModelAndExplicitSignaturePath) {
  fs::path dir = scratch_dir("single");
  write_file(dir / "net.onnx", random_bytes(4096, 9));
  PrivateKey key = PrivateKey::generate(KeyAlg::ecdsa_p256);
  EXPECT_EQ(default_signature_path((dir / "net.onnx").string()), (dir / "net.onnx.sig").string());
  sign_to_default(dir / "net.onnx", key);
  ModelManifest m = verify_default(dir / "net.onnx", key.public_key());
  ASSERT_EQ(m.resources.size(), 1u);
  EXPECT_EQ(m.resources[0].name, "net.onnx");
  write_file(dir / "net.onnx", random_bytes(4096, 10));
  expect_error([&] { verify_default(dir / "net.onnx", key.public_key()); }, ErrorCode::integrity,
               {"file 'net.onnx' changed"});

  fs::path model = make_model("explicit");
  SignOptions opt;
  opt.signature_path = (dir / "elsewhere.sig").string();
  write_file_atomic(opt.signature_path, sign_model(model.string(), key, opt));
  VerifyOptions vo;
  vo.signature_path = opt.signature_path;
  EXPECT_NO_THROW(verify_model(model.string(), key.public_key(), vo));
  expect_error([&] { verify_default(model, key.public_key()); }, ErrorCode::not_found, {"model.sig", "not found"});
}

TEST(ModelSigning, IgnorePathsAndSymlinks) {
  fs::path model = make_model("ign");
  PrivateKey key = PrivateKey::generate(KeyAlg::ed25519);
  SignOptions opt;
  opt.hash.ignore_paths = {"weights"};
  ModelManifest m;
  write_file_atomic(default_signature_path(model.string()), sign_model(model.string(), key, opt, &m));
  EXPECT_EQ(m.resources.size(), 3u);
  write_file(model / "weights" / "new.bin", "ignored");
  EXPECT_NO_THROW(verify_default(model, key.public_key()));

  fs::create_symlink(model / "config.json", model / "link.json");
  expect_error([&] { sign_model(model.string(), key, SignOptions{}); }, ErrorCode::invalid_argument,
               {"'link.json' is a symlink"});
  expect_error([&] { verify_default(model, key.public_key()); }, ErrorCode::integrity, {"'link.json' is a symlink"});
  expect_error([&] { sign_model(model.string(), key, [] {
                 SignOptions o;
                 o.hash.ignore_paths = {"../etc"};
                 return o;
               }()); },
               ErrorCode::invalid_model, {"not a plain relative path"});
}

TEST(ModelSigning, MalformedBundlesAreClearErrors) {
  const std::string good = [] {
    fs::path model = make_model("mal");
    return sign_model(model.string(), PrivateKey::generate(KeyAlg::ecdsa_p256), SignOptions{});
  }();
  expect_error([] { parse_bundle("", "m.sig"); }, ErrorCode::invalid_model, {"m.sig", "invalid JSON"});
  expect_error([] { parse_bundle("[1,2]", "m.sig"); }, ErrorCode::invalid_model, {"not a JSON object"});
  expect_error([] { parse_bundle(std::string(100, '['), "m.sig"); }, ErrorCode::invalid_model, {"nested deeper"});
  for (size_t cut : {good.size() / 3, good.size() / 2, good.size() - 3})
    expect_error([&] { parse_bundle(good.substr(0, cut), "m.sig"); }, ErrorCode::invalid_model, {"m.sig"});
  auto j = nlohmann::json::parse(good);
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto c = j;
    edit(c);
    return c.dump();
  };
  expect_error([&] { parse_bundle(with([](auto& c) { c["mediaType"] = "application/vnd.dev.sigstore.bundle+json;version=0.1"; }), "m.sig"); },
               ErrorCode::unsupported, {"mediaType", "not supported"});
  expect_error([&] { parse_bundle(with([](auto& c) { c["mediaType"] = 7; }), "m.sig"); }, ErrorCode::invalid_model,
               {"'mediaType' must be a string"});
  expect_error([&] { parse_bundle(with([](auto& c) { c.erase("dsseEnvelope"); }), "m.sig"); }, ErrorCode::invalid_model,
               {"missing field 'dsseEnvelope'"});
  expect_error([&] { parse_bundle(with([](auto& c) { c["dsseEnvelope"]["payload"] = "not base64!"; }), "m.sig"); },
               ErrorCode::invalid_model, {"dsseEnvelope.payload", "invalid base64"});
  expect_error([&] { parse_bundle(with([](auto& c) { c["dsseEnvelope"]["signatures"] = nlohmann::json::array(); }), "m.sig"); },
               ErrorCode::invalid_model, {"no signatures"});
  expect_error([&] { parse_bundle(with([](auto& c) { c["verificationMaterial"] = {{"certificate", {{"rawBytes", "AA=="}}}}; }), "m.sig"); },
               ErrorCode::unsupported, {"certificate"});
  expect_error([] { parse_statement("{\"_type\": \"https://in-toto.io/Statement/v1\"}", "s"); }, ErrorCode::invalid_model,
               {"missing field 'predicateType'"});
}

// slim and an independent Python implementation must accept each other's bundles.
TEST(ModelSigning, InteropWithPythonReference) {
  if (run_shell("/usr/bin/python3 -c 'import cryptography' 2>/dev/null") != 0)
    GTEST_SKIP() << "python3-cryptography not installed";
  const std::string script = (source_dir() / "tests/fixtures/trust_oms_reference.py").string();
  ASSERT_TRUE(fs::exists(script)) << script;
  for (KeyAlg alg : {KeyAlg::ecdsa_p256, KeyAlg::ed25519}) {
    fs::path model = make_model(std::string(key_alg_name(alg)));
    PrivateKey key = PrivateKey::generate(alg);
    fs::path keys = model.parent_path();
    write_file(keys / "key.pem", key.to_pem());
    write_file(keys / "key.pub", key.public_key().to_pem());
    sign_to_default(model, key);
    const std::string sig = (model / "model.sig").string();
    EXPECT_EQ(run_shell("/usr/bin/python3 " + shell_quote(script) + " verify " + shell_quote(model.string()) + " " +
                        shell_quote(sig) + " " + shell_quote((keys / "key.pub").string())),
              0)
        << key_alg_name(alg) << ": reference rejected slim's bundle";
    // The reference's own bundle, verified by slim.
    fs::remove(sig);
    ASSERT_EQ(run_shell("/usr/bin/python3 " + shell_quote(script) + " sign " + shell_quote(model.string()) + " " +
                        shell_quote((keys / "key.pem").string()) + " " + shell_quote(sig)),
              0);
    EXPECT_NO_THROW(verify_default(model, key.public_key())) << key_alg_name(alg);
    write_file(model / "config.json", "{\"hidden\": 17}");
    expect_error([&] { verify_default(model, key.public_key()); }, ErrorCode::integrity, {"file 'config.json' changed"});
  }
}
