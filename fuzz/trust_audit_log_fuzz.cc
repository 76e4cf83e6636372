// libFuzzer target for the audit log verifier: any byte string must give a verdict
// (ok, or the first bad line and why), never a crash, a hang or a stray exception.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "slim/core/error.h"
#include "slim/trust/audit_log.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A fixed key so checkpoint records exercise the signature path too.
  static const slim::trust::PublicKey key =
      slim::trust::PrivateKey::generate(slim::trust::KeyAlg::ed25519).public_key();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  slim::trust::verify_audit_log_text(text, "fuzz.jsonl", nullptr);
  slim::trust::verify_audit_log_text(text, "fuzz.jsonl", &key);
  return 0;
}
