#include "slim/trust/audit_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "trust/test_util.h"

using namespace slim;
using namespace slim::trust;
using namespace slim::trust::testing;
namespace fs = std::filesystem;

namespace {

AuditLogOptions fast_options(HashAlg alg = HashAlg::sha256) {
  AuditLogOptions o;
  o.hash_alg = alg;
  o.fsync = FsyncPolicy::never;
  return o;
}

AuditEvent event(std::string type, std::string model, int i) {
  AuditEvent e;
  e.event = std::move(type);
  e.model_id = std::move(model);
  e.model_version = "v" + std::to_string(i);
  e.model_digest = "sha256:" + std::string(64, char('a' + i % 6));
  e.actor = "tester";
  e.details = {{"i", i}, {"note", "r\u00e9sum\u00e9 \"quoted\""}, {"ratio", 0.1 * i}};
  return e;
}

fs::path write_log(const std::string& tag, int n, HashAlg alg = HashAlg::sha256) {
  fs::path p = scratch_dir(tag) / "audit.jsonl";
  auto log = AuditLog::open(p.string(), fast_options(alg));
  const std::string_view types[] = {audit_event::kModelLoad, audit_event::kModelVerify, audit_event::kModelUpdate,
                                    audit_event::kConfigChange, audit_event::kModelRollback};
  for (int i = 0; i < n; ++i) log->append(event(std::string(types[i % 5]), i % 2 ? "digits" : "gpt2", i));
  return p;
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> out;
  std::istringstream in(read_file(p));
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

void write_lines(const fs::path& p, const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  write_file(p, s);
}

void expect_bad(const fs::path& p, size_t line, std::initializer_list<std::string> needles) {
  AuditVerifyResult r = verify_audit_log(p.string());
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, line) << r.error;
  EXPECT_EQ(r.records, line - 1);
  for (const auto& n : needles) EXPECT_NE(r.error.find(n), std::string::npos) << r.error;
}

}  // namespace

TEST(AuditLog, ChainVerifiesAndRecordsReadBack) {
  for (HashAlg alg : {HashAlg::sha256, HashAlg::sm3}) {
    fs::path p = write_log(std::string(hash_alg_name(alg)), 7, alg);
    AuditVerifyResult r = verify_audit_log(p.string());
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.records, 7u);
    EXPECT_EQ(r.hash_alg, alg);
    auto records = read_audit_log(p.string());
    ASSERT_EQ(records.size(), 7u);
    EXPECT_EQ(records[0].prev, std::string(hash_alg_name(alg)) + ":" + std::string(64, '0'));
    for (size_t i = 0; i < records.size(); ++i) {
      EXPECT_EQ(records[i].seq, i + 1);
      EXPECT_EQ(records[i].event.details["i"], int(i));
      EXPECT_EQ(records[i].event.details["note"], "r\u00e9sum\u00e9 \"quoted\"");
      if (i) {
        EXPECT_EQ(records[i].prev, records[i - 1].hash);
      }
    }
    EXPECT_EQ(r.head, records.back().hash);
    // The hash is the digest of the canonical line without "hash", checked here
    // independently of the verifier.
    auto j = nlohmann::json::parse(lines_of(p)[2]);
    const std::string stored = j["hash"];
    j.erase("hash");
    EXPECT_EQ(stored, std::string(hash_alg_name(alg)) + ":" + to_hex(hash_bytes(alg, j.dump())));
  }
}

TEST(AuditLog, EditedRecordIsDetected) {
  fs::path p = write_log("edit", 6);
  auto lines = lines_of(p);
  const size_t pos = lines[3].find("\"actor\":\"tester\"");
  ASSERT_NE(pos, std::string::npos);
  lines[3].replace(pos, 16, "\"actor\":\"mallet\"");
  write_lines(p, lines);
  expect_bad(p, 4, {"line 4", "record hash mismatch", "edited"});
}

TEST(AuditLog, ReformattedRecordIsDetected) {
  fs::path p = write_log("fmt", 3);
  auto lines = lines_of(p);
  lines[1] = nlohmann::json::parse(lines[1]).dump(1);  // same content, other spelling
  lines[1].erase(std::remove(lines[1].begin(), lines[1].end(), '\n'), lines[1].end());
  write_lines(p, lines);
  expect_bad(p, 2, {"edited", "canonical"});
}

TEST(AuditLog, DeletedRecordIsDetected) {
  fs::path p = write_log("del", 6);
  auto lines = lines_of(p);
  lines.erase(lines.begin() + 2);
  write_lines(p, lines);
  expect_bad(p, 3, {"sequence number 4, expected 3", "deleted"});
  // Deleting the first record too.
  lines = lines_of(write_log("del0", 3));
  lines.erase(lines.begin());
  write_lines(p, lines);
  expect_bad(p, 1, {"sequence number 2, expected 1"});
}

TEST(AuditLog, ReorderedRecordsAreDetected) {
  fs::path p = write_log("swap", 6);
  auto lines = lines_of(p);
  std::swap(lines[1], lines[2]);
  write_lines(p, lines);
  expect_bad(p, 2, {"sequence number 3, expected 2", "reordered"});
}

TEST(AuditLog, InsertedRecordIsDetected) {
  fs::path p = write_log("ins", 5);
  auto lines = lines_of(p);
  // A well-formed record forged to follow record 2 (right seq, prev and own hash):
  // the chain breaks at the record after it.
  auto records = read_audit_log(p.string());
  AuditRecord forged = records[2];
  forged.seq = 3;
  forged.prev = records[1].hash;
  forged.event.actor = "intruder";
  auto j = nlohmann::json::parse(audit_record_line(forged));
  j.erase("hash");
  forged.hash = "sha256:" + to_hex(hash_bytes(HashAlg::sha256, j.dump()));
  lines.insert(lines.begin() + 2, audit_record_line(forged));
  write_lines(p, lines);
  expect_bad(p, 4, {"sequence number 3, expected 4", "inserted"});
  // A copy of an existing record inserted verbatim.
  lines = lines_of(write_log("dup", 5));
  lines.insert(lines.begin() + 3, lines[1]);
  write_lines(p, lines);
  expect_bad(p, 4, {"sequence number 2, expected 4"});
}

TEST(AuditLog, TornLastLineIsReportedNotDropped) {
  fs::path p = write_log("torn", 4);
  std::string text = read_file(p);
  const size_t last_start = text.rfind('\n', text.size() - 2) + 1;
  write_file(p, text.substr(0, last_start + 40));  // a crash mid-append
  AuditVerifyResult r = verify_audit_log(p.string());
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.torn_tail);
  EXPECT_EQ(r.records, 3u);
  EXPECT_EQ(r.bad_line, 4u);
  EXPECT_EQ(r.bad_offset, last_start);
  EXPECT_NE(r.error.find("torn last line (40 bytes without a terminating newline)"), std::string::npos) << r.error;
  // Whole line present but the newline missing: still torn, never accepted.
  write_file(p, text.substr(0, text.size() - 1));
  r = verify_audit_log(p.string());
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.torn_tail);
  // Zero-filled tail after a power loss.
  write_file(p, text.substr(0, last_start) + std::string(50, '\0') + "\n");
  r = verify_audit_log(p.string());
  EXPECT_TRUE(r.torn_tail) << r.error;
  EXPECT_FALSE(r.ok);
}

TEST(AuditLog, EveryTruncationIsRejectedOrAConsistentPrefix) {
  fs::path p = write_log("cut", 3);
  const std::string text = read_file(p);
  for (size_t n = 1; n < text.size(); n += 7) {
    AuditVerifyResult r = verify_audit_log_text(std::string_view(text).substr(0, n), "cut");
    const bool at_boundary = text[n - 1] == '\n';
    EXPECT_EQ(r.ok, at_boundary) << n << ": " << r.error;
    if (!at_boundary) {
      EXPECT_TRUE(r.torn_tail) << n;
    }
  }
}

TEST(AuditLog, WriterContinuesChainAndRefusesBrokenLog) {
  fs::path p = write_log("reopen", 3);
  {
    auto log = AuditLog::open(p.string(), fast_options(HashAlg::sm3));  // an existing log keeps sha256
    EXPECT_EQ(log->count(), 3u);
    EXPECT_EQ(log->hash_alg(), HashAlg::sha256);
    AuditRecord r = log->append(event("model.verify_failed", "gpt2", 9));
    EXPECT_EQ(r.seq, 4u);
    // A second writer is refused while the first holds the log.
    expect_error([&] { AuditLog::open(p.string(), fast_options()); }, ErrorCode::invalid_argument,
                 {"held by another writer"});
  }
  AuditVerifyResult r = verify_audit_log(p.string());
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.records, 4u);

  auto lines = lines_of(p);
  lines[1][lines[1].find("tester")] = 'T';
  write_lines(p, lines);
  expect_error([&] { AuditLog::open(p.string(), fast_options()); }, ErrorCode::integrity,
               {"refusing to append", "line 2"});
}

TEST(AuditLog, TornTailRecoveryIsRecordedInTheChain) {
  fs::path p = write_log("recover", 3);
  std::string text = read_file(p);
  const std::string torn = "{\"actor\":\"tes";
  write_file(p, text + torn);
  expect_error([&] { AuditLog::open(p.string(), fast_options()); }, ErrorCode::integrity, {"torn last line"});
  AuditLogOptions o = fast_options();
  o.recover_torn_tail = true;
  {
    auto log = AuditLog::open(p.string(), o);
    EXPECT_EQ(log->count(), 4u);
    log->append(event("model.load", "gpt2", 1));
  }
  AuditVerifyResult r = verify_audit_log(p.string());
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.records, 5u);
  auto records = read_audit_log(p.string());
  EXPECT_EQ(records[3].event.event, audit_event::kTornTailRecovered);
  EXPECT_EQ(records[3].event.details["offset"], text.size());
  EXPECT_EQ(records[3].event.details["bytes"], torn.size());
  EXPECT_EQ(read_file(p.string() + ".torn-" + std::to_string(text.size())), torn);
}

class AuditCheckpoint : public ::testing::TestWithParam<KeyAlg> {};

TEST_P(AuditCheckpoint, SignedCheckpointsVerifyWithTheRightKeyOnly) {
  PrivateKey key = PrivateKey::generate(GetParam());
  PublicKey pub = key.public_key();
  fs::path p = write_log("cp", 3);
  {
    auto log = AuditLog::open(p.string(), fast_options());
    AuditRecord cp = log->checkpoint(key, "test-log");
    EXPECT_EQ(cp.event.details["count"], 3u);
    const std::string note = cp.event.details["note"];
    EXPECT_EQ(note.rfind("slim-audit/v1 test-log\n3\n" + cp.prev + "\n\n\xE2\x80\x94 test-log ", 0), 0u) << note;
    log->append(event("model.load", "gpt2", 4));
    log->checkpoint(key, "test-log");
    log->append(event("model.load", "gpt2", 5));
  }
  AuditVerifyResult r = verify_audit_log(p.string(), &pub);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.checkpoints, 2u);
  EXPECT_EQ(r.checkpoints_verified, 2u);
  EXPECT_EQ(r.records_after_last_checkpoint, 1u);
  r = verify_audit_log(p.string());  // without a key: chain only
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.checkpoints_verified, 0u);

  PublicKey other = PrivateKey::generate(GetParam()).public_key();
  r = verify_audit_log(p.string(), &other);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 4u);
  EXPECT_NE(r.error.find("signed by a different key"), std::string::npos) << r.error;

  // Someone rewrites the whole chain after an edit (recomputing every hash) but cannot
  // re-sign the checkpoint: its signature fails.
  auto records = read_audit_log(p.string());
  records[1].event.actor = "mallet";
  std::string prev = std::string("sha256:") + std::string(64, '0');
  std::string rewritten;
  for (auto& rec : records) {
    rec.prev = prev;
    if (rec.event.event == audit_event::kCheckpoint) {
      rec.event.details["head"] = prev;
      std::string note = rec.event.details["note"];
      const size_t a = note.find('\n', note.find('\n') + 1) + 1;
      note.replace(a, note.find('\n', a) - a, prev);
      rec.event.details["note"] = note;
    }
    auto j = nlohmann::json::parse(audit_record_line(rec));
    j.erase("hash");
    rec.hash = "sha256:" + to_hex(hash_bytes(HashAlg::sha256, j.dump()));
    prev = rec.hash;
    rewritten += audit_record_line(rec) + "\n";
  }
  write_file(p, rewritten);
  EXPECT_TRUE(verify_audit_log(p.string()).ok);  // the chain alone cannot tell
  r = verify_audit_log(p.string(), &pub);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 4u);
  EXPECT_NE(r.error.find("checkpoint signature does not verify"), std::string::npos) << r.error;
}

INSTANTIATE_TEST_SUITE_P(AllKeyTypes, AuditCheckpoint,
                         ::testing::Values(KeyAlg::ecdsa_p256, KeyAlg::ed25519, KeyAlg::sm2),
                         [](const auto& info) {
                           std::string n(key_alg_name(info.param));
                           for (auto& c : n) if (c == '-') c = '_';
                           return n;
                         });

TEST(AuditLog, MalformedLinesAreClearErrors) {
  struct Case {
    std::string text;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"not json\n", "invalid JSON"},
      {"[1]\n", "not a JSON object"},
      {"{}\n", "missing field 'seq'"},
      {"\n", "empty line"},
      {"{\"seq\":-1}\n", "seq must be a non-negative integer"},
      {"{\"extra\":1}\n", "unknown field 'extra'"},
      {std::string(64, '{') + "\n", "nested deeper"},
  };
  for (const auto& c : cases) {
    AuditVerifyResult r = verify_audit_log_text(c.text, "x.jsonl");
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("x.jsonl: line 1"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find(c.needle), std::string::npos) << r.error;
  }
  fs::path p = write_log("mal", 2);
  auto lines = lines_of(p);
  auto j = nlohmann::json::parse(lines[1]);
  j["time"] = "yesterday";
  lines[1] = j.dump();
  write_lines(p, lines);
  expect_bad(p, 2, {"time 'yesterday'"});
  EXPECT_TRUE(verify_audit_log_text("", "empty").ok);
  expect_error([] { verify_audit_log("/nonexistent/audit.jsonl"); }, ErrorCode::not_found, {"/nonexistent/audit.jsonl"});
}

TEST(AuditLog, SyncPolicyEveryRecordWritesDurably) {
  fs::path p = scratch_dir("sync") / "a.jsonl";
  AuditLogOptions o;
  o.fsync = FsyncPolicy::every_n;
  o.fsync_every = 2;
  auto log = AuditLog::open(p.string(), o);
  for (int i = 0; i < 5; ++i) log->append(event("config.change", "", i));
  log->sync();
  EXPECT_TRUE(verify_audit_log(p.string()).ok);
  expect_error([&] { log->append(AuditEvent{}); }, ErrorCode::invalid_argument, {"event type must not be empty"});
}
