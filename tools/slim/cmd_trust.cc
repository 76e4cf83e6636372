// `slim keygen`, `slim sign`, `slim verify` and `slim audit ...`: model signatures in the
// OMS format and the hash-chained audit log, over libslim's trust module.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "slim/core/error.h"
#include "slim/trust/audit_log.h"
#include "slim/trust/model_signing.h"

namespace slim::cli {
namespace {

using namespace slim::trust;

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i ? "%.1f %s" : "%.0f %s", v, units[i]);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void add_keygen(CLI::App& app) {
  auto* cmd = app.add_subcommand("keygen", "Generate a signing key pair (PEM): KEY and KEY.pub");
  static std::string alg = "ecdsa-p256", out;
  static bool force = false;
  cmd->add_option("--alg", alg, "Key algorithm: ecdsa-p256 (OMS default), ed25519, sm2 (SM2/SM3)")
      ->check(CLI::IsMember({"ecdsa-p256", "ed25519", "sm2"}));
  cmd->add_option("-o,--output", out, "Private key file; the public key goes to OUTPUT.pub")->required();
  cmd->add_flag("--force", force, "Overwrite existing key files");
  cmd->callback([] {
    const std::string pub_path = out + ".pub";
    if (!force)
      for (const auto& p : {out, pub_path})
        if (std::filesystem::exists(p))
          throw Error(ErrorCode::invalid_argument, p + ": already exists (use --force to overwrite)");
    PrivateKey key = PrivateKey::generate(parse_key_alg(alg));
    write_file_atomic(out, key.to_pem(), 0600);
    PublicKey pub = key.public_key();
    write_file_atomic(pub_path, pub.to_pem(), 0644);
    std::cout << "generated " << key_alg_name(key.alg()) << " key\n  private: " << out
              << "\n  public:  " << pub_path << "\n  hint:    " << pub.hint() << "\n";
  });
}

void add_sign(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "sign", "Sign a model (file or directory) in the OpenSSF Model Signing format");
  static std::string model, key_path, out, hash = "sha256";
  static std::vector<std::string> ignore;
  static bool allow_symlinks = false;
  static int threads = 0;
  cmd->add_option("model", model, "Model file or directory")->required();
  cmd->add_option("--key", key_path, "PEM private key (slim keygen)")->required();
  cmd->add_option("-o,--output", out, "Signature bundle (default MODEL/model.sig or MODEL.sig)");
  cmd->add_option("--hash", hash, "File digest: sha256 (OMS) or sm3")->check(CLI::IsMember({"sha256", "sm3"}));
  cmd->add_option("--ignore", ignore, "Path relative to the model to leave out (repeatable)");
  cmd->add_flag("--allow-symlinks", allow_symlinks, "Hash symlinked files as their targets");
  add_threads_option(cmd, &threads);
  cmd->callback([] {
    PrivateKey key = PrivateKey::load(key_path);
    SignOptions opt;
    opt.hash.hash_alg = parse_hash_alg(hash);
    opt.hash.ignore_paths = ignore;
    opt.hash.allow_symlinks = allow_symlinks;
    opt.hash.threads = threads;
    opt.hash.progress = true;
    opt.signature_path = out.empty() ? default_signature_path(model) : out;
    const auto t0 = std::chrono::steady_clock::now();
    ModelManifest m;
    std::string bundle = sign_model(model, key, opt, &m);
    write_file_atomic(opt.signature_path, bundle);
    const double secs = seconds_since(t0);
    uint64_t bytes = 0;
    for (const auto& r : m.resources) bytes += r.size;
    std::cout << "signed " << m.model_name << ": " << m.resources.size() << " files, "
              << human_bytes(bytes) << ", " << hash_alg_name(m.hash_alg) << " "
              << to_hex(m.root_digest()) << "\n  key:       " << key_alg_name(key.alg())
              << " (hint " << key.public_key().hint().substr(0, 16) << "...)\n  signature: "
              << opt.signature_path << "\n";
    std::fprintf(stdout, "  time:      %.3f s (%.1f MB/s)\n", secs, secs > 0 ? bytes / secs / 1e6 : 0.0);
  });
}

void add_verify(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "verify", "Verify a model's signature and re-hash every file (exit 0 only if all match)");
  static std::string model, pub_path, sig;
  static int threads = 0;
  cmd->add_option("model", model, "Model file or directory")->required();
  cmd->add_option("--pub", pub_path, "PEM public key of the signer")->required();
  cmd->add_option("--sig", sig, "Signature bundle (default MODEL/model.sig or MODEL.sig)");
  add_threads_option(cmd, &threads);
  cmd->callback([] {
    PublicKey pub = PublicKey::load(pub_path);
    VerifyOptions opt;
    opt.signature_path = sig.empty() ? default_signature_path(model) : sig;
    opt.threads = threads;
    opt.progress = true;
    const auto t0 = std::chrono::steady_clock::now();
    ModelManifest m = verify_model(model, pub, opt);
    const double secs = seconds_since(t0);
    uint64_t bytes = 0;
    for (const auto& r : m.resources) bytes += r.size;
    std::cout << "verified " << m.model_name << ": " << m.resources.size() << " files, "
              << human_bytes(bytes) << ", " << hash_alg_name(m.hash_alg) << " "
              << to_hex(m.root_digest()) << "\n  signed by " << key_alg_name(pub.alg())
              << " key " << pub.hint().substr(0, 16) << "...\n";
    std::fprintf(stdout, "  time: %.3f s (%.1f MB/s)\n", secs, secs > 0 ? bytes / secs / 1e6 : 0.0);
  });
}

void print_record(const AuditRecord& r) {
  std::cout << r.seq << "  " << r.time << "  " << r.event.event;
  if (!r.event.model_id.empty()) {
    std::cout << "  " << r.event.model_id;
    if (!r.event.model_version.empty()) std::cout << "@" << r.event.model_version;
  }
  if (!r.event.actor.empty()) std::cout << "  by " << r.event.actor;
  if (!r.event.model_digest.empty()) std::cout << "  digest " << r.event.model_digest.substr(0, 23);
  if (r.event.event == audit_event::kCheckpoint) {
    std::cout << "  count " << r.event.details.value("count", uint64_t(0)) << " key "
              << r.event.details.value("key_alg", std::string()) << " "
              << r.event.details.value("key_hint", std::string()).substr(0, 16) << "...";
  } else if (!r.event.details.empty()) {
    std::cout << "  " << r.event.details.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::cout << "\n";
}

void add_audit(CLI::App& app) {
  auto* audit = app.add_subcommand("audit", "The hash-chained audit log: verify, show, append, checkpoint");
  audit->require_subcommand(1);

  {
    auto* cmd = audit->add_subcommand("verify", "Verify the chain (and checkpoint signatures with --pub)");
    static std::string log, pub_path;
    cmd->add_option("log", log, "Audit log (JSON lines)")->required();
    cmd->add_option("--pub", pub_path, "PEM public key that signed the checkpoints");
    cmd->callback([] {
      std::unique_ptr<PublicKey> pub;
      if (!pub_path.empty()) pub = std::make_unique<PublicKey>(PublicKey::load(pub_path));
      AuditVerifyResult r = verify_audit_log(log, pub.get());
      if (!r.ok)
        throw Error(ErrorCode::integrity, "audit log verification failed at line " + std::to_string(r.bad_line) +
                                              " after " + std::to_string(r.records) + " good records: " + r.error);
      std::cout << "audit log OK: " << log << "\n  records:     " << r.records
                << "\n  checkpoints: " << r.checkpoints;
      if (pub) std::cout << " (" << r.checkpoints_verified << " signatures verified)";
      else if (r.checkpoints) std::cout << " (signatures not checked: pass --pub)";
      std::cout << "\n  after last checkpoint: " << r.records_after_last_checkpoint
                << "\n  head: " << r.head << "\n";
    });
  }
  {
    auto* cmd = audit->add_subcommand("show", "Print records (the verified prefix of a broken log)");
    static std::string log, model, since, event;
    static bool json = false;
    cmd->add_option("log", log, "Audit log (JSON lines)")->required();
    cmd->add_option("--model", model, "Only records about this model id");
    cmd->add_option("--since", since, "Only records at or after this UTC time (e.g. 2026-11-30 or 2026-11-30T01:00)");
    cmd->add_option("--event", event, "Only this event type");
    cmd->add_flag("--json", json, "Print the raw JSON lines");
    cmd->callback([] {
      AuditVerifyResult res;
      std::vector<AuditRecord> records = read_audit_log(log, &res);
      for (const auto& r : records) {
        if (!model.empty() && r.event.model_id != model) continue;
        if (!event.empty() && r.event.event != event) continue;
        // Timestamps are fixed-width UTC, so a string comparison orders them, and a
        // prefix such as "2026-11-30" compares as the start of that day.
        if (!since.empty() && r.time < since) continue;
        if (json) std::cout << audit_record_line(r) << "\n";
        else print_record(r);
      }
      if (!res.ok)
        throw Error(ErrorCode::integrity, "log is broken after record " + std::to_string(res.records) + ": " + res.error);
    });
  }
  {
    auto* cmd = audit->add_subcommand("append", "Append one record (for scripts; the server appends through the library)");
    static std::string log, event, model, version, digest, actor, details = "{}", hash = "sha256", fsync = "always";
    static bool recover = false;
    cmd->add_option("log", log, "Audit log (created if missing)")->required();
    cmd->add_option("--event", event, "Event type, e.g. model.load, model.verify, config.change")->required();
    cmd->add_option("--model", model, "Model id");
    cmd->add_option("--version", version, "Model version");
    cmd->add_option("--digest", digest, "Model digest");
    cmd->add_option("--actor", actor, "Who did it");
    cmd->add_option("--details", details, "JSON object with free-form details");
    cmd->add_option("--hash", hash, "Chain hash of a new log: sha256 or sm3")->check(CLI::IsMember({"sha256", "sm3"}));
    cmd->add_option("--fsync", fsync, "always | never")->check(CLI::IsMember({"always", "never"}));
    cmd->add_flag("--recover-torn-tail", recover, "Cut off (and record) a torn last line left by a crash");
    cmd->callback([] {
      AuditLogOptions opt;
      opt.hash_alg = parse_hash_alg(hash);
      opt.fsync = fsync == "never" ? FsyncPolicy::never : FsyncPolicy::every_record;
      opt.recover_torn_tail = recover;
      AuditEvent ev;
      ev.event = event;
      ev.model_id = model;
      ev.model_version = version;
      ev.model_digest = digest;
      ev.actor = actor;
      try {
        ev.details = nlohmann::json::parse(details);
      } catch (const nlohmann::json::exception& e) {
        throw Error(ErrorCode::invalid_argument, std::string("--details: invalid JSON: ") + e.what());
      }
      if (!ev.details.is_object()) throw Error(ErrorCode::invalid_argument, "--details must be a JSON object");
      auto audit_log = AuditLog::open(log, opt);
      AuditRecord r = audit_log->append(ev);
      std::cout << "appended record " << r.seq << " " << r.hash << "\n";
    });
  }
  {
    auto* cmd = audit->add_subcommand("checkpoint", "Append a checkpoint signed with KEY over the record count and head hash");
    static std::string log, key_path, origin = "slim";
    cmd->add_option("log", log, "Audit log")->required();
    cmd->add_option("--key", key_path, "PEM private key")->required();
    cmd->add_option("--origin", origin, "Name of the log in the signed note (one word)");
    cmd->callback([] {
      PrivateKey key = PrivateKey::load(key_path);
      auto audit_log = AuditLog::open(log);
      AuditRecord r = audit_log->checkpoint(key, origin);
      std::cout << "checkpoint at record " << r.seq << " over " << r.seq - 1 << " records, head "
                << r.prev << "\n";
    });
  }
}

SLIM_COMMAND(60, add_keygen);
SLIM_COMMAND(61, add_sign);
SLIM_COMMAND(62, add_verify);
SLIM_COMMAND(63, add_audit);

}  // namespace
}  // namespace slim::cli
