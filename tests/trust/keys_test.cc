#include "slim/trust/keys.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "slim/trust/digest.h"
#include "trust/test_util.h"

using namespace slim;
using namespace slim::trust;
using namespace slim::trust::testing;

namespace {
std::span<const uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string foreign_public_pem(const char* type, const char* param) {
  EVP_PKEY* k = param ? EVP_PKEY_Q_keygen(nullptr, nullptr, type, param)
                      : EVP_PKEY_Q_keygen(nullptr, nullptr, type, size_t(2048));
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PUBKEY(bio, k);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, size_t(n));
  BIO_free(bio);
  EVP_PKEY_free(k);
  return pem;
}
}  // namespace

class KeysTest : public ::testing::TestWithParam<KeyAlg> {};

TEST_P(KeysTest, SignVerifyAndPemRoundTrip) {
  PrivateKey key = PrivateKey::generate(GetParam());
  EXPECT_EQ(key.alg(), GetParam());
  const std::string msg = "DSSEv1 28 application/vnd.in-toto+json 2 {}";
  auto sig = key.sign(bytes(msg));
  PublicKey pub = key.public_key();
  EXPECT_TRUE(pub.verify(bytes(msg), sig));
  EXPECT_FALSE(pub.verify(bytes(msg + " "), sig));
  auto bad = sig;
  bad[bad.size() / 2] ^= 0x40;
  EXPECT_FALSE(pub.verify(bytes(msg), bad));
  EXPECT_FALSE(pub.verify(bytes(msg), {}));

  PrivateKey reread = PrivateKey::from_pem(key.to_pem(), "key.pem");
  EXPECT_EQ(reread.alg(), GetParam());
  PublicKey pub2 = PublicKey::from_pem(pub.to_pem(), "key.pub");
  EXPECT_EQ(pub2.alg(), GetParam());
  EXPECT_EQ(pub2.hint(), pub.hint());
  EXPECT_TRUE(pub2.verify(bytes(msg), reread.sign(bytes(msg))));
  EXPECT_EQ(pub.hint(), to_hex(hash_bytes(HashAlg::sha256, pub.to_pem())));

  PrivateKey other = PrivateKey::generate(GetParam());
  EXPECT_FALSE(other.public_key().verify(bytes(msg), sig));
  EXPECT_NE(other.public_key().hint(), pub.hint());
}

INSTANTIATE_TEST_SUITE_P(AllKeyTypes, KeysTest,
                         ::testing::Values(KeyAlg::ecdsa_p256, KeyAlg::ed25519, KeyAlg::sm2),
                         [](const auto& info) {
                           std::string n(key_alg_name(info.param));
                           for (auto& c : n) if (c == '-') c = '_';
                           return n;
                         });

TEST(Keys, Sm2DistinguishingIdIsPartOfTheSignature) {
  PrivateKey key = PrivateKey::generate(KeyAlg::sm2);
  const std::string msg = "message";
  auto sig = key.sign(bytes(msg));
  EXPECT_TRUE(key.public_key().verify(bytes(msg), sig, kSm2DefaultId));
  EXPECT_FALSE(key.public_key().verify(bytes(msg), sig, "another-id"));
  auto sig2 = key.sign(bytes(msg), "alice@example");
  EXPECT_TRUE(key.public_key().verify(bytes(msg), sig2, "alice@example"));
  EXPECT_FALSE(key.public_key().verify(bytes(msg), sig2));
}

// The openssl command line is an independent consumer of the same standard encodings:
// it must accept slim's SM2 (with the explicit ID) and ECDSA signatures.
TEST(Keys, OpensslCliVerifiesSlimSignatures) {
  if (run_shell("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl CLI";
  auto dir = scratch_dir("cli");
  const std::string msg = random_bytes(1000, 5);
  write_file(dir / "msg", msg);
  struct Case {
    KeyAlg alg;
    std::string extra;
  };
  for (const Case& c : {Case{KeyAlg::sm2, "-digest sm3 -pkeyopt distid:1234567812345678"},
                        Case{KeyAlg::ecdsa_p256, "-digest sha256"}, Case{KeyAlg::ed25519, ""}}) {
    PrivateKey key = PrivateKey::generate(c.alg);
    write_file(dir / "pub.pem", key.public_key().to_pem());
    auto sig = key.sign(bytes(msg));
    write_file(dir / "sig", std::string(sig.begin(), sig.end()));
    const std::string cmd = "openssl pkeyutl -verify -pubin -inkey " + shell_quote((dir / "pub.pem").string()) +
                            " -rawin " + c.extra + " -in " + shell_quote((dir / "msg").string()) +
                            " -sigfile " + shell_quote((dir / "sig").string()) + " >/dev/null 2>&1";
    EXPECT_EQ(run_shell(cmd), 0) << key_alg_name(c.alg) << ": " << cmd;
  }
}

TEST(Keys, BadAndForeignKeys) {
  expect_error([] { PublicKey::from_pem("garbage", "k.pub"); }, ErrorCode::invalid_argument,
               {"k.pub", "not a PEM public key"});
  expect_error([] { PrivateKey::from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "k.pem"); },
               ErrorCode::invalid_argument, {"k.pem", "private key"});
  expect_error([] { PublicKey::from_pem(foreign_public_pem("EC", "P-384"), "p384.pub"); }, ErrorCode::unsupported,
               {"p384.pub", "secp384r1"});
  expect_error([] { PublicKey::from_pem(foreign_public_pem("RSA", nullptr), "rsa.pub"); }, ErrorCode::unsupported,
               {"rsa.pub", "RSA"});
  // A public key where a private key is expected.
  PrivateKey k = PrivateKey::generate(KeyAlg::ed25519);
  expect_error([&] { PrivateKey::from_pem(k.public_key().to_pem(), "swapped.pem"); }, ErrorCode::invalid_argument,
               {"swapped.pem"});
  expect_error([] { PublicKey::load("/nonexistent/slim.pub"); }, ErrorCode::not_found, {"/nonexistent/slim.pub"});
  expect_error([] { parse_key_alg("rsa"); }, ErrorCode::invalid_argument, {"rsa"});
}
