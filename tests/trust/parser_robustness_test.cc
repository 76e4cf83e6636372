// Seeded mutation runs over the bundle and audit-log parsers (the same entry points as
// fuzz/trust_*_fuzz.cc): every mutant must be accepted or rejected with a slim::Error.
#include <gtest/gtest.h>

#include <random>

#include "slim/trust/audit_log.h"
#include "slim/trust/model_signing.h"
#include "trust/test_util.h"

using namespace slim;
using namespace slim::trust;
using namespace slim::trust::testing;

namespace {
std::string mutate(std::string s, std::mt19937& rng) {
  const int ops = 1 + int(rng() % 4);
  for (int k = 0; k < ops && !s.empty(); ++k) {
    const size_t pos = rng() % s.size();
    switch (rng() % 5) {
      case 0: s[pos] = char(rng()); break;                                  // byte flip
      case 1: s.erase(pos, 1 + rng() % 8); break;                           // deletion
      case 2: s.insert(pos, s.substr(rng() % s.size(), 1 + rng() % 16)); break;  // duplication
      case 3: s.resize(pos); break;                                         // truncation
      case 4: s.insert(pos, 1, "{}[]\":,\\0\n"[rng() % 11]); break;         // structure
    }
  }
  return s;
}
}  // namespace

TEST(ParserRobustness, MutatedBundlesNeverEscapeAsOtherExceptions) {
  auto dir = scratch_dir("b");
  write_file(dir / "m" / "a.bin", random_bytes(100, 1));
  write_file(dir / "m" / "b" / "c.bin", random_bytes(50, 2));
  const std::string seed = sign_model((dir / "m").string(), PrivateKey::generate(KeyAlg::ecdsa_p256), SignOptions{});
  std::mt19937 rng(12345);
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string m = mutate(seed, rng);
    try {
      SignatureBundle b = parse_bundle(m, "mut.sig");
      parse_statement(b.payload, "mut.sig");
      ++accepted;
    } catch (const Error&) {
    }
  }
  // Most mutants must be rejected; some (e.g. whitespace edits) legitimately parse.
  EXPECT_LT(accepted, 3000);
}

TEST(ParserRobustness, MutatedAuditLogsNeverEscapeAsOtherExceptions) {
  auto dir = scratch_dir("l");
  const std::string path = (dir / "a.jsonl").string();
  PrivateKey key = PrivateKey::generate(KeyAlg::ed25519);
  PublicKey pub = key.public_key();
  {
    AuditLogOptions o;
    o.fsync = FsyncPolicy::never;
    auto log = AuditLog::open(path, o);
    for (int i = 0; i < 4; ++i) log->append(AuditEvent{"model.load", "m", "v1", "", "me", {{"i", i}}});
    log->checkpoint(key);
  }
  const std::string seed = read_file(path);
  ASSERT_TRUE(verify_audit_log_text(seed, "seed", &pub).ok);
  std::mt19937 rng(777);
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string m = mutate(seed, rng);
    AuditVerifyResult r = verify_audit_log_text(m, "mut.jsonl", &pub);
    if (r.ok) {
      ++accepted;
      // Only an untouched prefix of whole records may pass.
      EXPECT_EQ(seed.compare(0, m.size(), m), 0) << m;
    } else {
      EXPECT_FALSE(r.error.empty());
    }
  }
  EXPECT_LT(accepted, 3000);
}
