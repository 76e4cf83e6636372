// The audit trail: an append-only JSON-lines file in which every record carries the hash
// of the record before it, so any edit, deletion, reordering or insertion breaks the
// chain, and periodic checkpoints signed with a key pin the head against a rewrite.
//
// Record (one line, canonical JSON: sorted keys, no spaces):
//   {"actor":..,"details":{..},"event":"model.load","hash":"sha256:<hex>",
//    "model":{"digest":..,"id":..,"version":..},"prev":"sha256:<hex>","seq":1,
//    "time":"2026-11-30T01:02:03.456Z"}
// hash = H(the canonical line without "hash"); prev of record 1 is H-name + 64 zeros.
// A checkpoint is a record with event "audit.checkpoint" whose details hold a signed
// note over "slim-audit/v1 <origin>\n<count>\n<head>\n" (count records before it,
// head = their last hash), in the style of a transparency-log signed note.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "slim/trust/digest.h"
#include "slim/trust/keys.h"

namespace slim::trust {

// Event types the project writes; any other non-empty type is accepted as free-form.
namespace audit_event {
inline constexpr std::string_view kModelLoad = "model.load";
inline constexpr std::string_view kModelVerify = "model.verify";
inline constexpr std::string_view kModelVerifyFailed = "model.verify_failed";
inline constexpr std::string_view kModelUpdate = "model.update";
inline constexpr std::string_view kModelRollback = "model.rollback";
inline constexpr std::string_view kIntegrityViolation = "integrity.violation";
inline constexpr std::string_view kConfigChange = "config.change";
inline constexpr std::string_view kCheckpoint = "audit.checkpoint";
inline constexpr std::string_view kTornTailRecovered = "audit.torn_tail_recovered";
}  // namespace audit_event

struct AuditEvent {
  std::string event;  // e.g. audit_event::kModelLoad
  std::string model_id, model_version, model_digest;
  std::string actor;
  nlohmann::json details = nlohmann::json::object();
};

struct AuditRecord {
  uint64_t seq = 0;
  std::string time;  // UTC, "YYYY-MM-DDTHH:MM:SS.mmmZ"
  AuditEvent event;
  std::string prev, hash;  // "<alg>:<hex>"
  size_t line = 0;         // 1-based line in the file (0 when not read from a file)
};

enum class FsyncPolicy {
  every_record,  // fdatasync after each append: nothing acknowledged is ever lost
  every_n,       // after every `fsync_every` appends and at close
  never,         // leave it to the OS (tests, throwaway logs)
};

struct AuditLogOptions {
  HashAlg hash_alg = HashAlg::sha256;  // for a new log; an existing log keeps its own
  FsyncPolicy fsync = FsyncPolicy::every_record;
  int fsync_every = 64;
  // A torn last line (crash mid-append) makes open() fail unless this is set; then the
  // torn bytes are saved to LOG.torn-<offset>, cut off, and an audit.torn_tail_recovered
  // record says so: the loss is recorded in the chain, never silent.
  bool recover_torn_tail = false;
};

// Single writer per file (enforced with flock). Thread-safe.
class AuditLog {
 public:
  // Creates the file or continues an existing chain after verifying it. Throws
  // integrity for a broken chain or an unrecovered torn tail, invalid_argument when
  // another process holds the log.
  static std::unique_ptr<AuditLog> open(const std::string& path, const AuditLogOptions& options = {});
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  AuditRecord append(const AuditEvent& event);
  // Appends a checkpoint record signed by `key` over the current count and head.
  AuditRecord checkpoint(const PrivateKey& key, const std::string& origin = "slim");
  void sync();

  uint64_t count() const;        // records in the log
  std::string head_hash() const;  // "<alg>:<hex>" of the last record (genesis when empty)
  HashAlg hash_alg() const { return alg_; }
  const std::string& path() const { return path_; }

 private:
  AuditLog() = default;
  AuditRecord append_locked(AuditEvent event);
  void write_line(const std::string& line);

  std::string path_;
  int fd_ = -1;
  HashAlg alg_ = HashAlg::sha256;
  AuditLogOptions options_;
  uint64_t count_ = 0;
  std::string head_;
  int unsynced_ = 0;
  mutable std::mutex mu_;
};

struct AuditVerifyResult {
  bool ok = false;
  uint64_t records = 0;               // records that verified, in order
  uint64_t checkpoints = 0;           // checkpoint records among them
  uint64_t checkpoints_verified = 0;  // whose signature was checked against the key
  uint64_t records_after_last_checkpoint = 0;
  std::string head;                   // hash of the last good record
  HashAlg hash_alg = HashAlg::sha256;
  // On failure: where and why. torn_tail marks a crash-torn last line.
  size_t bad_line = 0;
  uint64_t bad_offset = 0;
  bool torn_tail = false;
  std::string error;
};

// Verifies the whole chain; with `pub`, also every checkpoint's signature (a checkpoint
// signed by another key fails). Never throws for bad content: it is in the result.
// Throws not_found for a missing file.
AuditVerifyResult verify_audit_log(const std::string& path, const PublicKey* pub = nullptr);
AuditVerifyResult verify_audit_log_text(std::string_view text, const std::string& source,
                                        const PublicKey* pub = nullptr);

// Parses the records (checking the chain as verify does). Without `result`, a bad log
// throws integrity naming the first bad line; with it, the records before the first bad
// line are returned and `result` says what is wrong (for `slim audit show`).
std::vector<AuditRecord> read_audit_log(const std::string& path, AuditVerifyResult* result = nullptr);

// The canonical JSON line of a record (without trailing newline).
std::string audit_record_line(const AuditRecord& record);
std::string utc_timestamp_now();

}  // namespace slim::trust
