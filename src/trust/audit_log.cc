#include "slim/trust/audit_log.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "slim/core/error.h"
#include "slim/trust/model_signing.h"
#include "trust/json_util.h"

namespace slim::trust {

using detail::Json;
using detail::quote;

namespace {

constexpr std::string_view kNoteHeader = "slim-audit/v1 ";
constexpr std::string_view kNoteDash = "\xE2\x80\x94 ";  // U+2014, as in signed notes
constexpr size_t kMaxLineSize = size_t(1) << 20;         // a record is small; this is a bound
constexpr uint64_t kMaxLogSize = uint64_t(16) << 30;     // what open()/verify will read

std::string genesis_hash(HashAlg alg) {
  return std::string(hash_alg_name(alg)) + ":" + std::string(2 * kDigestSize, '0');
}

Json record_json(const AuditRecord& r, bool with_hash) {
  Json j = Json::object();
  j["seq"] = r.seq;
  j["time"] = r.time;
  j["event"] = r.event.event;
  j["model"] = {{"id", r.event.model_id},
                {"version", r.event.model_version},
                {"digest", r.event.model_digest}};
  j["actor"] = r.event.actor;
  j["details"] = r.event.details;
  j["prev"] = r.prev;
  if (with_hash) j["hash"] = r.hash;
  return j;
}

std::string dump(const Json& j) {
  // Replacement instead of throwing on invalid UTF-8 in free-form details, so a writer
  // can never produce a line that it could not re-read.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string compute_hash(HashAlg alg, const AuditRecord& r) {
  return std::string(hash_alg_name(alg)) + ":" + to_hex(hash_bytes(alg, dump(record_json(r, false))));
}

std::string note_body(const std::string& origin, uint64_t count, const std::string& head) {
  return std::string(kNoteHeader) + origin + "\n" + std::to_string(count) + "\n" + head + "\n";
}

bool valid_timestamp(const std::string& t) {
  // YYYY-MM-DDTHH:MM:SS.mmmZ
  static constexpr std::string_view kPattern = "dddd-dd-ddTdd:dd:dd.dddZ";
  if (t.size() != kPattern.size()) return false;
  for (size_t i = 0; i < t.size(); ++i) {
    if (kPattern[i] == 'd' ? !(t[i] >= '0' && t[i] <= '9') : t[i] != kPattern[i]) return false;
  }
  return true;
}

HashAlg parse_hash_ref(const std::string& s, const std::string& field, const std::string& ctx,
                       std::string* hex) {
  size_t colon = s.find(':');
  if (colon == std::string::npos)
    throw Error(ErrorCode::invalid_model, ctx + ": " + field + " " + quote(s) + " is not <alg>:<hex>");
  HashAlg alg = parse_hash_alg(s.substr(0, colon), ctx + ": " + field);
  *hex = s.substr(colon + 1);
  auto bytes = from_hex(*hex, ctx + ": " + field);
  if (bytes.size() != kDigestSize)
    throw Error(ErrorCode::invalid_model, ctx + ": " + field + " has " + std::to_string(bytes.size()) +
                                              " bytes, expected " + std::to_string(kDigestSize));
  return alg;
}

// Parses one line and checks it against the chain so far. `alg` is the log's hash
// algorithm, taken from the first record when `*alg_known` is false.
AuditRecord parse_record(std::string_view line, uint64_t expected_seq, const std::string& expected_prev,
                         HashAlg* alg, bool* alg_known, const std::string& ctx) {
  if (line.size() > kMaxLineSize)
    throw Error(ErrorCode::invalid_model, ctx + ": line longer than " + std::to_string(kMaxLineSize) + " bytes");
  if (line.empty()) throw Error(ErrorCode::invalid_model, ctx + ": empty line");
  Json j = detail::parse_json(line, ctx);
  if (!j.is_object()) throw Error(ErrorCode::invalid_model, ctx + ": record is not a JSON object");
  static const char* kFields[] = {"actor", "details", "event", "hash", "model", "prev", "seq", "time"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* f : kFields) known = known || it.key() == f;
    if (!known) throw Error(ErrorCode::invalid_model, ctx + ": unknown field " + quote(it.key()));
  }
  AuditRecord r;
  const Json& seq = detail::field(j, "seq", ctx);
  if (!seq.is_number_unsigned())
    throw Error(ErrorCode::invalid_model, ctx + ": seq must be a non-negative integer");
  r.seq = seq.get<uint64_t>();
  r.time = detail::string_field(j, "time", ctx);
  if (!valid_timestamp(r.time))
    throw Error(ErrorCode::invalid_model, ctx + ": time " + quote(r.time) + " is not YYYY-MM-DDTHH:MM:SS.mmmZ");
  r.event.event = detail::string_field(j, "event", ctx);
  if (r.event.event.empty()) throw Error(ErrorCode::invalid_model, ctx + ": empty event type");
  const Json& model = detail::object_field(j, "model", ctx);
  r.event.model_id = detail::string_field(model, "id", ctx + ": model");
  r.event.model_version = detail::string_field(model, "version", ctx + ": model");
  r.event.model_digest = detail::string_field(model, "digest", ctx + ": model");
  r.event.actor = detail::string_field(j, "actor", ctx);
  r.event.details = detail::object_field(j, "details", ctx);
  r.prev = detail::string_field(j, "prev", ctx);
  r.hash = detail::string_field(j, "hash", ctx);
  std::string prev_hex, hash_hex;
  HashAlg prev_alg = parse_hash_ref(r.prev, "prev", ctx, &prev_hex);
  HashAlg hash_alg = parse_hash_ref(r.hash, "hash", ctx, &hash_hex);
  if (!*alg_known) {
    *alg = hash_alg;
    *alg_known = true;
  }
  if (hash_alg != *alg || prev_alg != *alg)
    throw Error(ErrorCode::integrity, ctx + ": hash algorithm differs from the log's " +
                                          std::string(hash_alg_name(*alg)));
  // The stored text must be exactly the canonical form, so what was hashed is what a
  // reader sees (no duplicate keys, no alternative spellings of the same record).
  if (dump(j) != line)
    throw Error(ErrorCode::integrity, ctx + ": record was edited (not in the canonical form the writer produces)");
  const std::string computed = compute_hash(*alg, r);
  if (computed != r.hash)
    throw Error(ErrorCode::integrity, ctx + ": record hash mismatch, the record was edited (stored " +
                                          r.hash.substr(0, 23) + "..., content hashes to " +
                                          computed.substr(0, 23) + "...)");
  if (r.seq != expected_seq)
    throw Error(ErrorCode::integrity, ctx + ": sequence number " + std::to_string(r.seq) + ", expected " +
                                          std::to_string(expected_seq) +
                                          ": a record was deleted, reordered or inserted");
  if (r.prev != expected_prev)
    throw Error(ErrorCode::integrity, ctx + ": prev hash does not match the previous record's hash (" +
                                          expected_prev.substr(0, 23) +
                                          "...): a record was deleted, reordered or inserted");
  return r;
}

// Checks a checkpoint record's note against the chain and, with a key, its signature.
// Returns true when the signature was checked.
bool check_checkpoint(const AuditRecord& r, const PublicKey* pub, const std::string& ctx) {
  const Json& d = r.event.details;
  const Json& count = detail::field(d, "count", ctx + ": checkpoint");
  if (!count.is_number_unsigned())
    throw Error(ErrorCode::invalid_model, ctx + ": checkpoint count must be a non-negative integer");
  const std::string& head = detail::string_field(d, "head", ctx + ": checkpoint");
  const std::string& origin = detail::string_field(d, "origin", ctx + ": checkpoint");
  const std::string& hint = detail::string_field(d, "key_hint", ctx + ": checkpoint");
  const std::string& note = detail::string_field(d, "note", ctx + ": checkpoint");
  if (count.get<uint64_t>() != r.seq - 1 || head != r.prev)
    throw Error(ErrorCode::integrity, ctx + ": checkpoint claims " + std::to_string(count.get<uint64_t>()) +
                                          " records with head " + head.substr(0, 23) +
                                          "..., but the chain has " + std::to_string(r.seq - 1) +
                                          " with head " + r.prev.substr(0, 23) + "...");
  const std::string body = note_body(origin, r.seq - 1, r.prev);
  const std::string sig_prefix = body + "\n" + std::string(kNoteDash) + origin + " ";
  if (note.size() < sig_prefix.size() + 2 || note.compare(0, sig_prefix.size(), sig_prefix) != 0 ||
      note.back() != '\n')
    throw Error(ErrorCode::integrity, ctx + ": checkpoint note does not match its count, head and origin");
  if (!pub) return false;
  if (hint != pub->hint())
    throw Error(ErrorCode::integrity, ctx + ": checkpoint was signed by a different key (hint " +
                                          hint.substr(0, 16) + "..., given key " +
                                          pub->hint().substr(0, 16) + "...)");
  auto sig = base64_decode(std::string_view(note).substr(sig_prefix.size(),
                                                         note.size() - sig_prefix.size() - 1),
                           ctx + ": checkpoint signature");
  if (!pub->verify({reinterpret_cast<const uint8_t*>(body.data()), body.size()}, sig))
    throw Error(ErrorCode::integrity, ctx + ": checkpoint signature does not verify with the given key");
  return true;
}

std::string read_log_file(const std::string& path) {
  std::string text = read_small_file(path, size_t(kMaxLogSize), "audit log");
  return text;
}

}  // namespace

std::string utc_timestamp_now() {
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::time_t secs = std::time_t(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, int(ms % 1000));
  return buf;
}

std::string audit_record_line(const AuditRecord& record) { return dump(record_json(record, true)); }

AuditVerifyResult verify_audit_log_text(std::string_view text, const std::string& source,
                                        const PublicKey* pub) {
  AuditVerifyResult res;
  bool alg_known = false;
  HashAlg alg = HashAlg::sha256;
  std::string prev;  // set once the algorithm is known
  size_t pos = 0, line_no = 0;
  try {
    while (pos < text.size()) {
      ++line_no;
      size_t nl = text.find('\n', pos);
      const std::string ctx = source + ": line " + std::to_string(line_no) + " (byte " + std::to_string(pos) + ")";
      res.bad_line = line_no;
      res.bad_offset = pos;
      if (nl == std::string_view::npos) {
        // A crash between the write and its completion leaves a line without its newline.
        res.torn_tail = true;
        throw Error(ErrorCode::integrity,
                    ctx + ": torn last line (" + std::to_string(text.size() - pos) +
                        " bytes without a terminating newline): an append was interrupted; the " +
                        std::to_string(res.records) + " records before it verify");
      }
      std::string_view line = text.substr(pos, nl - pos);
      if (nl + 1 == text.size() && line.find('\0') != std::string_view::npos) {
        // Some filesystems leave zero-filled blocks after a power loss.
        res.torn_tail = true;
        throw Error(ErrorCode::integrity, ctx + ": torn last line (contains NUL bytes): an append was interrupted");
      }
      if (!alg_known) {
        // Peek at the first record's hash algorithm to know the genesis value.
        try {
          Json j = detail::parse_json(line, ctx);
          std::string hex;
          alg = parse_hash_ref(detail::string_field(j, "hash", ctx), "hash", ctx, &hex);
        } catch (const Error&) {
        }
        prev = genesis_hash(alg);
      }
      AuditRecord r = parse_record(line, res.records + 1, prev, &alg, &alg_known, ctx);
      if (r.event.event == audit_event::kCheckpoint) {
        ++res.checkpoints;
        if (check_checkpoint(r, pub, ctx)) ++res.checkpoints_verified;
        res.records_after_last_checkpoint = 0;
      } else {
        ++res.records_after_last_checkpoint;
      }
      prev = r.hash;
      ++res.records;
      pos = nl + 1;
    }
    res.ok = true;
    res.bad_line = 0;
    res.bad_offset = 0;
  } catch (const Error& e) {
    res.ok = false;
    res.error = e.what();
  }
  res.hash_alg = alg;
  res.head = alg_known ? prev : genesis_hash(alg);
  return res;
}

AuditVerifyResult verify_audit_log(const std::string& path, const PublicKey* pub) {
  return verify_audit_log_text(read_log_file(path), path, pub);
}

std::vector<AuditRecord> read_audit_log(const std::string& path, AuditVerifyResult* result) {
  const std::string text = read_log_file(path);
  AuditVerifyResult res = verify_audit_log_text(text, path, nullptr);
  if (!res.ok && !result) throw Error(ErrorCode::integrity, res.error);
  if (result) *result = res;
  std::vector<AuditRecord> out;
  bool alg_known = false;
  HashAlg alg = res.hash_alg;
  std::string prev = genesis_hash(alg);
  size_t pos = 0, line_no = 0;
  while (pos < text.size() && out.size() < res.records) {
    size_t nl = text.find('\n', pos);
    ++line_no;
    AuditRecord r = parse_record(text.substr(pos, nl - pos), out.size() + 1, prev, &alg, &alg_known,
                                 path + ": line " + std::to_string(line_no));
    r.line = line_no;
    prev = r.hash;
    out.push_back(std::move(r));
    pos = nl + 1;
  }
  return out;
}

// ---------------------------------------------------------------- writer

std::unique_ptr<AuditLog> AuditLog::open(const std::string& path, const AuditLogOptions& options) {
  std::unique_ptr<AuditLog> log(new AuditLog());
  log->path_ = path;
  log->options_ = options;
  log->fd_ = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (log->fd_ < 0)
    throw Error(ErrorCode::invalid_argument, path + ": cannot open audit log: " + std::strerror(errno));
  if (::flock(log->fd_, LOCK_EX | LOCK_NB) != 0)
    throw Error(ErrorCode::invalid_argument, path + ": audit log is held by another writer");

  const std::string text = read_log_file(path);
  AuditVerifyResult res = verify_audit_log_text(text, path, nullptr);
  if (!res.ok && !(res.torn_tail && options.recover_torn_tail))
    throw Error(ErrorCode::integrity, "refusing to append to a broken audit log: " + res.error);
  log->alg_ = res.records > 0 ? res.hash_alg : options.hash_alg;
  log->count_ = res.records;
  log->head_ = res.records > 0 ? res.head : genesis_hash(log->alg_);
  if (!res.ok) {
    // Keep the torn bytes for the investigator, then cut them off and say so in the chain.
    const std::string torn(text.substr(size_t(res.bad_offset)));
    const std::string saved = path + ".torn-" + std::to_string(res.bad_offset);
    write_file_atomic(saved, torn, 0640);
    if (::ftruncate(log->fd_, off_t(res.bad_offset)) != 0 || ::fsync(log->fd_) != 0)
      throw Error(ErrorCode::resource_exhausted, path + ": cannot truncate the torn tail: " + std::strerror(errno));
    AuditEvent ev;
    ev.event = audit_event::kTornTailRecovered;
    ev.actor = "slim";
    ev.details = {{"offset", res.bad_offset},
                  {"bytes", torn.size()},
                  {"sha256", to_hex(hash_bytes(HashAlg::sha256, torn))},
                  {"saved_to", saved}};
    std::lock_guard<std::mutex> lock(log->mu_);
    log->append_locked(std::move(ev));
    log->sync();
  }
  return log;
}

AuditLog::~AuditLog() {
  if (fd_ >= 0) {
    if (options_.fsync != FsyncPolicy::never && unsynced_ > 0) ::fdatasync(fd_);
    ::close(fd_);
  }
}

void AuditLog::write_line(const std::string& line) {
  // One write() of the whole line with O_APPEND: a crash leaves a prefix of this line
  // at worst (which the verifier reports as torn), never an interleaving.
  struct stat st{};
  const off_t before = ::fstat(fd_, &st) == 0 ? st.st_size : -1;
  ssize_t n;
  do n = ::write(fd_, line.data(), line.size());
  while (n < 0 && errno == EINTR);
  if (n != ssize_t(line.size())) {
    int err = n < 0 ? errno : ENOSPC;
    if (before >= 0 && ::ftruncate(fd_, before) != 0) {
      // Nothing more to do: the verifier will report the torn line.
    }
    throw Error(ErrorCode::resource_exhausted, path_ + ": audit append failed: " + std::strerror(err));
  }
  ++unsynced_;
  if (options_.fsync == FsyncPolicy::every_record ||
      (options_.fsync == FsyncPolicy::every_n && unsynced_ >= std::max(1, options_.fsync_every))) {
    if (::fdatasync(fd_) != 0)
      throw Error(ErrorCode::resource_exhausted, path_ + ": fdatasync failed: " + std::strerror(errno));
    unsynced_ = 0;
  }
}

AuditRecord AuditLog::append_locked(AuditEvent event) {
  if (event.event.empty()) throw Error(ErrorCode::invalid_argument, "audit event type must not be empty");
  if (!event.details.is_object())
    throw Error(ErrorCode::invalid_argument, "audit event details must be a JSON object");
  AuditRecord r;
  r.seq = count_ + 1;
  r.time = utc_timestamp_now();
  r.event = std::move(event);
  r.prev = head_;
  r.hash = compute_hash(alg_, r);
  // Invalid UTF-8 was replaced when dumping; re-read what will be on disk so the hash
  // matches the text a verifier parses.
  const std::string line = audit_record_line(r);
  bool known = true;
  HashAlg alg = alg_;
  AuditRecord stored = parse_record(line, r.seq, r.prev, &alg, &known, path_ + ": new record");
  if (line.size() > kMaxLineSize)
    throw Error(ErrorCode::invalid_argument, "audit record larger than " + std::to_string(kMaxLineSize) + " bytes");
  write_line(line + "\n");
  ++count_;
  head_ = stored.hash;
  return stored;
}

AuditRecord AuditLog::append(const AuditEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  return append_locked(event);
}

AuditRecord AuditLog::checkpoint(const PrivateKey& key, const std::string& origin) {
  if (origin.empty() || origin.find_first_of(" \n\t") != std::string::npos)
    throw Error(ErrorCode::invalid_argument, "checkpoint origin must be one word: " + quote(origin));
  std::lock_guard<std::mutex> lock(mu_);
  const std::string body = note_body(origin, count_, head_);
  auto sig = key.sign({reinterpret_cast<const uint8_t*>(body.data()), body.size()});
  AuditEvent ev;
  ev.event = audit_event::kCheckpoint;
  ev.actor = "slim";
  ev.details = {{"count", count_},
                {"head", head_},
                {"origin", origin},
                {"key_alg", key_alg_name(key.alg())},
                {"key_hint", key.public_key().hint()},
                {"note", body + "\n" + std::string(kNoteDash) + origin + " " + base64_encode(sig) + "\n"}};
  AuditRecord r = append_locked(std::move(ev));
  if (options_.fsync != FsyncPolicy::never && unsynced_ > 0) {
    ::fdatasync(fd_);
    unsynced_ = 0;
  }
  return r;
}

void AuditLog::sync() {
  if (::fdatasync(fd_) != 0)
    throw Error(ErrorCode::resource_exhausted, path_ + ": fdatasync failed: " + std::strerror(errno));
  unsynced_ = 0;
}

uint64_t AuditLog::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

std::string AuditLog::head_hash() const {
  std::lock_guard<std::mutex> lock(mu_);
  return head_;
}

}  // namespace slim::trust
