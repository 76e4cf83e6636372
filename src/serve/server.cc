#include "slim/serve/server.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>

#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "slim/core/thread_pool.h"
#include "slim/serve/canary.h"
#include "slim/serve/energy_ledger.h"
#include "slim/serve/metrics.h"
#include "slim/serve/repository.h"
#include "slim/trust/audit_log.h"

namespace slim::serve {
namespace {

struct CanaryStats {
  std::mutex mu;
  uint64_t count[2] = {0, 0}, errors[2] = {0, 0};
  std::vector<double> latency_ms[2];  // at most kKeep per side
  static constexpr size_t kKeep = 100000;
  void add(int side, bool error, double ms) {
    std::lock_guard lock(mu);
    ++count[side];
    errors[side] += error;
    if (latency_ms[side].size() < kKeep) latency_ms[side].push_back(ms);
  }
};

struct Canary {
  std::shared_ptr<LoadedModel> model;
  CanaryPolicy policy;
  Clock::time_point until;
  nlohmann::json reference;  // its outputs against the serving version's on the reference set
  std::shared_ptr<CanaryStats> stats = std::make_shared<CanaryStats>();
  std::shared_ptr<std::atomic<uint64_t>> routed = std::make_shared<std::atomic<uint64_t>>(0);
};

double p99(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, size_t(double(v.size()) * 0.99));
  std::nth_element(v.begin(), v.begin() + long(k), v.end());
  return v[k];
}

struct ModelSlot {
  std::optional<Canary> canary;           // a new version on trial beside `model`
  std::shared_ptr<LoadedModel> model;     // null while not loaded
  std::shared_ptr<LoadedModel> previous;  // what the last (re)load replaced, for rollback
  std::shared_ptr<LoadedModel> quarantined;  // taken out of service: its files changed
  std::string reason;                     // why it is not loaded
  bool wanted = false;                    // counts for strict readiness
  // Repository polling: the model folder's fingerprint when it was loaded, as last seen
  // (a folder must look the same on two polls in a row before it is loaded), and when a
  // load of it failed (not retried until it changes again).
  std::string loaded_fp, seen_fp, failed_fp;
  std::string loaded_digest;  // the folder's content digest when it was loaded (poll mode)
  bool outside_repository = false;  // slim serve --model: polling leaves it alone
  std::optional<size_t> variant;    // the variant it serves (reloads keep it); none: not chosen yet
  // Resident bytes of each variant as measured: the memory its load added, and the memory
  // a switch away from it gave back (which includes what it grew while serving); 0: unknown.
  std::vector<int64_t> resident;
};

// Why a model is (re)loaded, for the audit record: an empty event means a load or an update.
struct LoadCause {
  std::string event;
  nlohmann::json details = nlohmann::json::object();
  bool trial = true;                  // a new version may go on trial (canary)
  std::optional<size_t> variant;      // load this variant (a switch)
  // What rollback restores: the model replaced (an update), or what it was (a variant
  // switch keeps it), or nothing (a switch down lets it go: memory is short).
  enum class Previous { replaced, unchanged, released } previous = Previous::replaced;
};

// Hands the memory of a dropped model back to the kernel: freed tensor buffers are kept
// for reuse and glibc keeps freed heap pages below its top, and a server that switched to
// a smaller variant to save memory must really save it. Returns the tensor bytes released.
size_t return_freed_memory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  return Storage::release_cached();
}

// The newest version's name and digest, and every version, for an audit record.
void describe_versions(const LoadedModel& m, trust::AuditEvent& e) {
  const LoadedVersion& newest = *m.versions.begin()->second;
  e.model_version = newest.name;
  if (newest.verified) e.model_digest = newest.verified->digest;
  nlohmann::json versions = nlohmann::json::array();
  for (const auto& [v, lv] : m.versions) {
    nlohmann::json j = {{"version", lv->name}};
    if (lv->verified) {
      j["digest"] = lv->verified->digest;
      if (!lv->verified->signer.empty()) j["signer"] = lv->verified->signer;
    }
    versions.push_back(j);
  }
  e.details["versions"] = versions;
}

std::string names_of(const std::vector<ServedTensor>& ts) {
  std::string s;
  for (const auto& t : ts) s += (s.empty() ? "" : ", ") + t.spec.name;
  return s;
}

std::string sample_str(const Tensor& t, bool batching) {
  Shape s = t.shape();
  if (batching) s.erase(s.begin());
  return shape_str(s);
}

// The process's resident memory in bytes (0 where /proc has no statm).
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

// What each variant of a model takes while it serves: what the server measured of it
// (`measured`, 0 where it has not), else its files' size scaled as the serving variant's
// measurement is to its files (parsed weights, packed copies, buffers); a larger variant
// never below a smaller one.
std::vector<int64_t> resident_estimate(const LoadedModel& m, const std::vector<int64_t>& measured) {
  const size_t n = m.variants.size();
  const double ratio = std::max(1.0, double(measured[m.variant]) / double(m.variant_bytes[m.variant]));
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = measured[i] > 0 ? measured[i] : int64_t(double(m.variant_bytes[i]) * ratio);
  out[n - 1] = std::max<int64_t>(out[n - 1], 1);
  for (size_t i = n - 1; i-- > 0;) out[i] = std::max(out[i], out[i + 1] + 1);
  return out;
}

// Process CPU time and resident memory, read from /proc at each scrape.
void collect_process(Metrics& m, double start_unix) {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (std::getline(stat, line)) {
    // Fields after the command name (which may hold spaces) start at the last ')'.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string f;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> f; ++i) {
      if (i == 14) utime = std::stod(f);
      if (i == 15) stime = std::stod(f);
    }
    m.counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.")
        .set((utime + stime) / double(sysconf(_SC_CLK_TCK)));
  }
  if (const int64_t resident = resident_bytes())
    m.gauge("process_resident_memory_bytes", "Resident memory size in bytes.").set(double(resident));
  m.gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.")
      .set(start_unix);
}

}  // namespace

struct InferenceServer::Impl {
  ServerOptions opt;
  Metrics metrics;
  std::unique_ptr<EnergyLedger> energy;  // --energy
  std::unique_ptr<Repository> repo;
  mutable std::mutex mu;  // slots; loads and unloads of one model are serialized by load_mu
  std::map<std::string, ModelSlot> slots;
  std::mutex load_mu;
  std::atomic<bool> started{false}, stopping{false};
  std::atomic<int64_t> in_flight{0};
  std::mutex flight_mu;
  std::condition_variable flight_cv;
  InferenceServer* owner = nullptr;
  std::vector<trust::PublicKey> keys;     // trusted signers
  std::unique_ptr<trust::AuditLog> audit;
  std::optional<trust::PrivateKey> audit_key;
  std::mutex audit_mu;
  std::unique_ptr<MemorySource> memory;     // memory-aware variants, when on
  std::unique_ptr<VariantController> variants;
  std::string memory_error;                 // the last reading's error, logged once
  // The largest resident bytes / file bytes measured of a variant so far: a first load
  // scales the file sizes of a model never seen by it (under mu).
  double resident_ratio = 1.0;
  std::thread watcher;  // polling, integrity checks, canary decisions, variant switches
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool watch_stop = false;

  // Appends one record (and a checkpoint signed with the audit key when there is one); a
  // no-op without a log.
  void record(std::string_view event, const std::string& model, const LoadedModel* m, nlohmann::json details) {
    if (!audit) return;
    trust::AuditEvent e;
    e.event = std::string(event);
    e.model_id = model;
    e.actor = "slim serve";
    e.details = std::move(details);
    if (m) describe_versions(*m, e);
    // A record that cannot be written is reported, never allowed to undo what happened.
    try {
      std::lock_guard lock(audit_mu);
      audit->append(e);
      if (audit_key) audit->checkpoint(*audit_key, "slim-serve");
    } catch (const std::exception& ex) {
      std::cerr << "slim serve: error: cannot write the audit log " << audit->path() << ": " << ex.what() << "\n";
    }
  }
  void warm_up(const LoadedModel& m) const;
  NamedTensors run_reference(const LoadedModel& m, const CanaryPolicy& p, bool run) const;
  void watch();
  void decide_canaries();
  void switch_variants();
  std::shared_ptr<LoadedModel> find_or_null(const std::string& name) const {
    std::lock_guard lock(mu);
    auto it = slots.find(name);
    return it == slots.end() ? nullptr : it->second.model;
  }

  std::shared_ptr<LoadedModel> find(const std::string& name) const {
    std::lock_guard lock(mu);
    return find_locked(name);
  }
  std::shared_ptr<LoadedModel> find_locked(const std::string& name) const {
    auto it = slots.find(name);
    if (it == slots.end()) throw Error(ErrorCode::not_found, "unknown model '" + name + "'");
    if (!it->second.model)
      throw Error(ErrorCode::unavailable,
                  "model '" + name + "' is not ready" +
                      (it->second.reason.empty() ? "" : ": " + it->second.reason));
    return it->second.model;
  }

  // The model a request goes to: the serving one, or the canary on trial for its share
  // (and level); `stats`/`side` record the outcome when a canary is on trial.
  struct Route {
    std::shared_ptr<LoadedModel> model;
    std::shared_ptr<CanaryStats> stats;
    int side = 0;
  };
  Route route(const std::string& name, const InferRequest& req) const {
    std::lock_guard lock(mu);
    auto it = slots.find(name);
    if (it == slots.end() || !it->second.model || !it->second.canary || !req.version.empty()) return {find_locked(name), nullptr, 0};
    const Canary& c = *it->second.canary;
    const bool eligible = c.policy.priority == 0 || req.priority.value_or(0) == c.policy.priority;
    // Eligible request k goes to the canary when floor((k + 1) * share) steps past
    // floor(k * share): the share, evenly spread, without a random source.
    const uint64_t k = eligible ? c.routed->fetch_add(1) : 0;
    const bool to_canary = eligible && uint64_t(double(k + 1) * c.policy.share) > uint64_t(double(k) * c.policy.share);
    return {to_canary ? c.model : it->second.model, c.stats, to_canary ? 1 : 0};
  }

  static std::shared_ptr<LoadedVersion> version_of(const LoadedModel& m,
                                                   const std::string& version) {
    if (version.empty()) return m.versions.begin()->second;
    for (const auto& [v, lv] : m.versions)
      if (lv->name == version) return lv;
    std::string served;
    for (const auto& [v, lv] : m.versions) served += (served.empty() ? "" : ", ") + lv->name;
    throw Error(ErrorCode::not_found, "model '" + m.name + "' has no version '" + version +
                                          "' (serving: " + served + ")");
  }

  std::unique_ptr<ScheduledRequest> schedule(const LoadedModel& m, InferRequest req,
                                             InferCallback done) const;
  void load(const std::string& name, const LoadCause& cause = {});
};

std::unique_ptr<ScheduledRequest> InferenceServer::Impl::schedule(const LoadedModel& m,
                                                                  InferRequest req,
                                                                  InferCallback done) const {
  const bool batching = m.config.max_batch_size > 0;
  check(!req.energy || energy, ErrorCode::invalid_argument,
        "request parameter 'energy': this server does not meter energy (start slim serve with --energy)");
  auto s = std::make_unique<ScheduledRequest>();
  const std::string model = "model '" + m.name + "'";
  int64_t rows = -1;
  std::vector<bool> seen(m.inputs.size());
  for (auto& [name, t] : req.inputs) {
    auto it = std::find_if(m.inputs.begin(), m.inputs.end(),
                           [&](const ServedTensor& st) { return st.spec.name == name; });
    if (it == m.inputs.end())
      throw Error(ErrorCode::invalid_argument,
                  model + " has no input '" + name + "' (its inputs: " + names_of(m.inputs) + ")");
    const size_t k = size_t(it - m.inputs.begin());
    if (seen[k]) throw Error(ErrorCode::invalid_argument, "input '" + name + "' is given twice");
    seen[k] = true;
    if (!t.defined()) throw Error(ErrorCode::invalid_argument, "input '" + name + "' has no data");
    if (t.dtype() != it->spec.dtype)
      throw Error(ErrorCode::invalid_argument,
                  "input '" + name + "' is " + std::string(kserve_dtype_name(t.dtype())) + ", " +
                      model + " expects " + std::string(kserve_dtype_name(it->spec.dtype)));
    if (t.numel() > opt.max_tensor_elements)
      throw Error(ErrorCode::invalid_argument, "input '" + name + "' has " +
                                                   std::to_string(t.numel()) +
                                                   " elements, above the server's limit of " +
                                                   std::to_string(opt.max_tensor_elements));
    const Shape& want = it->spec.shape;
    bool ok = t.rank() == int(want.size());
    for (size_t i = batching ? 1 : 0; ok && i < want.size(); ++i)
      ok = want[i] < 0 || want[i] == t.shape()[i];
    if (!ok)
      throw Error(ErrorCode::invalid_argument, "input '" + name + "' has shape " +
                                                   shape_str(t.shape()) + ", " + model +
                                                   " expects " + shape_str(want));
    if (batching) {
      const int64_t n = t.shape()[0];
      if (!(n >= 1 && n <= m.config.max_batch_size))
        throw Error(ErrorCode::invalid_argument,
                    "input '" + name + "' has batch size " + std::to_string(n) + ", " + model +
                        " takes 1 to " + std::to_string(m.config.max_batch_size));
      if (!(rows < 0 || rows == n))
        throw Error(ErrorCode::invalid_argument, "inputs disagree on the batch size (" +
                                                     std::to_string(rows) + " and " +
                                                     std::to_string(n) + ")");
      rows = n;
    }
    Tensor in = t.contiguous();
    if (!it->model_sample_dims.empty()) {
      Shape shape = it->model_sample_dims;
      if (batching) shape.insert(shape.begin(), rows);
      in = in.reshape(shape);
    }
    s->shape_key += sample_str(t, batching) + ";";
    s->inputs[name] = std::move(in);
  }
  for (size_t k = 0; k < seen.size(); ++k)
    if (!seen[k])
      throw Error(ErrorCode::invalid_argument,
                  model + " needs input '" + m.inputs[k].spec.name + "'");
  s->rows = batching ? rows : 1;

  auto add_output = [&](const ServedTensor& st) {
    s->outputs.push_back(st.spec.name);
    s->output_sample_dims.push_back(st.model_sample_dims.empty() ? Shape{} : st.sample_dims);
  };
  if (req.outputs.empty()) {
    for (const auto& st : m.outputs) add_output(st);
  } else {
    for (const auto& o : req.outputs) {
      auto it = std::find_if(m.outputs.begin(), m.outputs.end(),
                             [&](const ServedTensor& st) { return st.spec.name == o.name; });
      if (it == m.outputs.end())
        throw Error(
            ErrorCode::invalid_argument,
            model + " has no output '" + o.name + "' (its outputs: " + names_of(m.outputs) + ")");
      add_output(*it);
    }
  }

  const BatchPolicy& p = m.policy;
  s->level = p.default_level;
  if (req.priority && *req.priority != 0 && p.levels > 1) {
    if (*req.priority > p.levels)
      throw Error(ErrorCode::invalid_argument, "priority " + std::to_string(*req.priority) +
                                                   " is outside 1.." + std::to_string(p.levels) +
                                                   " of " + model);
    s->level = *req.priority;
  }
  const QueuePolicy& qp = p.queue_policy[s->level - 1];
  uint64_t timeout = qp.default_timeout_microseconds;
  if (req.timeout_us && qp.allow_timeout_override) timeout = *req.timeout_us;
  if (opt.request_timeout_us && (timeout == 0 || timeout > opt.request_timeout_us))
    timeout = opt.request_timeout_us;
  if (timeout > 0) s->deadline = req.arrival + std::chrono::microseconds(timeout);

  s->request = std::move(req);
  s->done = std::move(done);
  return s;
}

// A request of zeros through each new version, twice, before it is swapped in, so that
// clients' first requests do not pay for first-run set-up: packed weights, and the plan a
// session specializes for input shapes it sees a second time. A model that cannot run
// zeros (say, a size-1 spatial dim too small for it) still loads.
void InferenceServer::Impl::warm_up(const LoadedModel& m) const {
  if (m.platform == "slim_llm") return;
  for (const auto& [v, lv] : m.versions)
    for (int run = 0; run < 2; ++run) {
      InferRequest req;
      req.model = m.name;
      for (const ServedTensor& t : m.inputs) {
        Shape shape = t.spec.shape;
        for (int64_t& d : shape) d = d < 0 ? 1 : d;
        req.inputs.emplace_back(t.spec.name, Tensor(t.spec.dtype, shape));
      }
      std::promise<InferResult> done;
      auto s = schedule(m, std::move(req), [&done](InferResult&& r) { done.set_value(std::move(r)); });
      lv->batcher->enqueue(std::move(s));
      InferResult r = done.get_future().get();
      if (r.error) {
        std::cerr << "slim serve: warning: model '" << m.name << "' version " << lv->name
                  << " did not run its warm-up request: " << r.error->what() << "\n";
        break;
      }
    }
}

// `m`'s outputs on the canary reference set, run through its newest version as clients'
// requests are (chunks of at most max_batch_size rows, or row by row when it does not
// batch), with the rows stacked again. run = false only checks that the set fits `m`'s
// inputs; a set that does not is invalid_model.
NamedTensors InferenceServer::Impl::run_reference(const LoadedModel& m, const CanaryPolicy& p, bool run) const {
  const int64_t step = std::max<int64_t>(1, m.config.max_batch_size);
  const std::vector<NamedTensors> chunks = reference_chunks(p.reference, m.config.max_batch_size);
  std::vector<std::promise<InferResult>> done(chunks.size());
  std::vector<std::unique_ptr<ScheduledRequest>> queued;
  auto rows = [&](size_t k) {
    const int64_t first = int64_t(k) * step;
    const int64_t last = std::min(first + step, p.reference[0].second.shape()[0]) - 1;
    return first == last ? "reference row " + std::to_string(first)
                         : "reference rows " + std::to_string(first) + " to " + std::to_string(last);
  };
  for (size_t k = 0; k < chunks.size(); ++k) {
    InferRequest req;
    req.model = m.name;
    req.inputs = chunks[k];
    try {
      queued.push_back(
          schedule(m, std::move(req), [&done, k](InferResult&& r) { done[k].set_value(std::move(r)); }));
    } catch (const Error& e) {
      throw Error(ErrorCode::invalid_model, "model '" + m.name + "': parameter 'canary_reference' (" +
                                                p.reference_file + "), " + rows(k) + ": " + e.what());
    }
  }
  if (!run) return {};
  const LoadedVersion& lv = *m.versions.begin()->second;
  std::vector<NamedTensors> outputs;
  for (size_t k = 0; k < chunks.size(); ++k) {
    lv.batcher->enqueue(std::move(queued[k]));
    InferResult r = done[k].get_future().get();
    if (r.error)
      throw Error(r.error->code(), "version " + lv.name + " failed on " + rows(k) + ": " + r.error->what());
    outputs.push_back(std::move(r.response.outputs));
  }
  return stack_chunks(outputs, m.config.max_batch_size > 0);
}

void InferenceServer::Impl::load(const std::string& name, const LoadCause& cause) {
  std::lock_guard load_lock(load_mu);
  std::vector<std::string> warnings;
  LoadOptions lo;
  lo.threads = opt.threads;
  lo.llm = opt.llm;
  lo.max_queue_size = opt.max_queue_size;
  lo.metrics = &metrics;
  lo.energy = energy.get();
  lo.hash_versions = audit != nullptr || opt.integrity_interval_secs > 0;
  lo.trusted_keys = keys;
  // A switch names its variant; a reload keeps the slot's; a first load takes the largest
  // that leaves enough memory.
  lo.choose_variant = [&](const std::vector<int64_t>& bytes) -> size_t {
    if (cause.variant) return *cause.variant;
    {
      std::lock_guard lock(mu);
      if (auto it = slots.find(name); it != slots.end() && it->second.variant) return *it->second.variant;
    }
    if (!variants) return 0;
    std::vector<int64_t> scaled = bytes;
    {
      std::lock_guard lock(mu);
      for (int64_t& b : scaled) b = int64_t(double(b) * resident_ratio);
    }
    try {
      return variants->initial(scaled, memory->read());
    } catch (const Error& e) {
      std::cerr << "slim serve: warning: cannot read the memory to choose a variant of '" << name << "': " << e.what()
                << "\n";
      return 0;
    }
  };
  std::shared_ptr<LoadedModel> fresh, old, released;
  CanaryPolicy canary;
  const int64_t rss_before = resident_bytes();
  // Taken before loading: a folder that changes while it loads looks changed to the next poll.
  const std::string dir = repo ? (std::filesystem::path(repo->root()) / name).string() : "";
  const std::string fp = repo ? folder_fingerprint(dir) : "";
  const std::string digest = repo && opt.model_control == ServerOptions::ModelControl::poll ? folder_digest(dir) : "";
  try {
    if (repo == nullptr)
      throw Error(ErrorCode::not_found,
                  "the server has no model repository to load '" + name + "' from");
    fresh = repo->load(name, lo, &warnings);
    canary = canary_policy(fresh->config, (std::filesystem::path(repo->root()) / name).string());
    if (!canary.reference.empty() && fresh->platform != "slim_llm") run_reference(*fresh, canary, false);
    warm_up(*fresh);
  } catch (const Error& e) {
    for (const auto& w : warnings) std::cerr << "slim serve: warning: " << w << "\n";
    {
      std::lock_guard lock(mu);
      ModelSlot& slot = slots[name];
      slot.wanted = true;
      slot.failed_fp = fp;
      if (!slot.model) slot.reason = e.what();  // a failed reload keeps the version that serves
    }
    nlohmann::json details = cause.details;
    details["reason"] = e.what();
    if (!cause.event.empty()) details["during"] = cause.event;
    record(e.code() == ErrorCode::integrity ? trust::audit_event::kModelVerifyFailed : "model.load_failed", name,
           nullptr, details);
    throw;
  }
  for (const auto& w : warnings) std::cerr << "slim serve: warning: " << w << "\n";
  const int64_t grew = resident_bytes() - rss_before;
  // A trial with a reference set starts only when the new version's outputs on it agree
  // with the serving version's; otherwise it is dropped before any request reaches it.
  const bool trial = cause.trial && canary.share > 0 && fresh->platform != "slim_llm";
  const std::shared_ptr<LoadedModel> serving = trial ? find_or_null(name) : nullptr;
  nlohmann::json reference;
  std::string refused;
  if (serving && !canary.reference.empty()) {
    reference = {{"file", canary.reference_file}};
    try {
      const OutputAgreement a =
          compare_outputs(run_reference(*serving, canary, true), run_reference(*fresh, canary, true));
      reference = agreement_json(a, canary);
      refused = disagreement(a, canary);
    } catch (const Error& e) {
      refused = "its outputs on the reference inputs could not be compared with the serving version's: " +
                std::string(e.what());
    }
  }
  bool on_trial = false;
  {
    std::lock_guard lock(mu);
    ModelSlot& slot = slots[name];
    if (trial && slot.model) {
      if (refused.empty())
        slot.canary = Canary{fresh, canary, Clock::now() + std::chrono::seconds(canary.window_secs), reference};
      slot.loaded_fp = slot.seen_fp = fp;
      slot.loaded_digest = digest;
      slot.failed_fp.clear();
      on_trial = true;
    }
  }
  const std::string version = fresh->versions.begin()->second->name;
  if (on_trial && !refused.empty()) {
    std::cerr << "slim serve: model '" << name << "' canary version " << version << " rolled back: " << refused
              << "\n";
    record("model.canary_rolled_back", name, serving.get(),
           {{"version", version}, {"decision", "rolled back"}, {"reason", refused}, {"reference", reference}});
    return;
  }
  if (on_trial) {
    std::cerr << "slim serve: model '" << name << "' version " << version
              << " on trial for " << canary.window_secs << " s with " << canary.share * 100 << " % of the requests\n";
    nlohmann::json details = {
        {"share", canary.share}, {"window_secs", canary.window_secs}, {"priority", canary.priority}};
    if (!reference.is_null()) details["reference"] = reference;
    record("model.canary_started", name, fresh.get(), details);
    return;
  }
  {
    std::lock_guard lock(mu);
    ModelSlot& slot = slots[name];
    old = std::move(slot.model);
    slot.model = fresh;
    if (cause.previous == LoadCause::Previous::replaced && old) slot.previous = old;
    if (cause.previous == LoadCause::Previous::released) released = std::move(slot.previous);
    slot.quarantined.reset();
    slot.reason.clear();
    slot.wanted = true;
    slot.loaded_fp = slot.seen_fp = fp;
    slot.loaded_digest = digest;
    slot.failed_fp.clear();
    slot.variant = fresh->variants.empty() ? std::nullopt : std::optional<size_t>(fresh->variant);
  }
  if (!fresh->variants.empty())
    metrics.gauge("slim_model_variant", "The variant a model serves: 0 is the first (largest) its config lists.",
                  {{"model", name}})
        .set(double(fresh->variant));
  std::string versions;
  for (const auto& [v, lv] : fresh->versions) versions += (versions.empty() ? "" : ", ") + lv->name;
  std::cerr << "slim serve: loaded model '" << name << "' version " << versions << " ("
            << fresh->platform << (fresh->variants.empty() ? "" : ", variant " + fresh->variants[fresh->variant]) << ")\n";
  nlohmann::json details = cause.details;
  details["platform"] = fresh->platform;
  if (!fresh->variants.empty()) details["variant"] = fresh->variants[fresh->variant];
  details["resident_bytes_grew"] = grew;
  if (old) details["replaced"] = old->versions.begin()->second->name;
  record(!cause.event.empty() ? cause.event
         : old              ? trust::audit_event::kModelUpdate
                            : trust::audit_event::kModelLoad,
         name, fresh.get(), details);
  const std::optional<size_t> from =
      old && old->variants == fresh->variants ? std::optional<size_t>(old->variant) : std::nullopt;
  old.reset();  // drains the replaced versions outside the lock
  released.reset();
  return_freed_memory();
  if (!variants) return;
  if (fresh->variants.size() < 2) {
    variants->remove_model(name);
    return;
  }
  const int64_t net = resident_bytes() - rss_before;  // grew, less what the replaced one gave back
  std::vector<int64_t> estimate;
  {
    std::lock_guard lock(mu);
    std::vector<int64_t>& r = slots[name].resident;
    if (r.size() != fresh->variants.size()) r.assign(fresh->variants.size(), 0);
    r[fresh->variant] = std::max(r[fresh->variant], grew);
    if (from && *from != fresh->variant && grew - net > 0) r[*from] = grew - net;
    for (size_t i = 0; i < r.size(); ++i)  // small files: the process's own growth would swamp them
      if (fresh->variant_bytes[i] >= (int64_t(8) << 20))
        resident_ratio = std::max(resident_ratio, double(r[i]) / double(fresh->variant_bytes[i]));
    estimate = resident_estimate(*fresh, r);
  }
  variants->set_model(name, estimate, fresh->variant);
}

void InferenceServer::rollback_model(const std::string& name) {
  std::shared_ptr<LoadedModel> now;
  {
    std::lock_guard load_lock(impl_->load_mu);
    std::lock_guard lock(impl_->mu);
    auto it = impl_->slots.find(name);
    if (it == impl_->slots.end()) throw Error(ErrorCode::not_found, "unknown model '" + name + "'");
    ModelSlot& slot = it->second;
    if (!slot.previous)
      throw Error(ErrorCode::not_found, "model '" + name + "' has no earlier version to roll back to");
    now = slot.model;
    slot.model = std::move(slot.previous);
    slot.previous = now;
    slot.variant = slot.model->variants.empty() ? std::nullopt : std::optional<size_t>(slot.model->variant);
    if (impl_->variants && slot.model->variants.size() > 1) {
      slot.resident.resize(slot.model->variants.size());
      impl_->variants->set_model(name, resident_estimate(*slot.model, slot.resident), slot.model->variant);
    }
    slot.reason.clear();
    impl_->record(trust::audit_event::kModelRollback, name, slot.model.get(),
                  {{"replaced", now ? now->versions.begin()->second->name : ""}, {"by", "api"}});
  }
  std::cerr << "slim serve: model '" << name << "' rolled back\n";
}

void InferenceServer::poll_repository() {
  if (!impl_->repo || impl_->stopping) return;
  const auto names = impl_->repo->model_names();
  for (const auto& name : names) {
    const std::string fp = folder_fingerprint((std::filesystem::path(impl_->repo->root()) / name).string());
    {
      std::lock_guard lock(impl_->mu);
      ModelSlot& slot = impl_->slots[name];
      if (fp == slot.loaded_fp || fp == slot.failed_fp) continue;
      if (fp != slot.seen_fp) {  // new or still being written: wait for it to settle
        slot.seen_fp = fp;
        if (!slot.model && slot.reason.empty()) slot.reason = "waiting for its files to settle";
        continue;
      }
    }
    // Settled but changed by names, sizes or times: the content decides (a touched file,
    // or one copied again unchanged, does not reload the model).
    std::string loaded_digest;
    {
      std::lock_guard lock(impl_->mu);
      if (impl_->slots[name].model) loaded_digest = impl_->slots[name].loaded_digest;
    }
    if (!loaded_digest.empty() &&
        folder_digest((std::filesystem::path(impl_->repo->root()) / name).string()) == loaded_digest) {
      std::lock_guard lock(impl_->mu);
      impl_->slots[name].loaded_fp = fp;
      continue;
    }
    try {
      impl_->load(name);
    } catch (const Error& e) {
      std::cerr << "slim serve: model '" << name << "' failed to load: " << e.what() << "\n";
    }
  }
  // Models whose folders are gone are unloaded.
  std::vector<std::string> gone;
  {
    std::lock_guard lock(impl_->mu);
    for (const auto& [name, slot] : impl_->slots)
      if (slot.wanted && !slot.outside_repository && std::find(names.begin(), names.end(), name) == names.end())
        gone.push_back(name);
  }
  for (const auto& name : gone) {
    unload_model(name);
    impl_->record("model.unload", name, nullptr, {{"reason", "its folder left the repository"}});
  }
}

void InferenceServer::check_integrity() {
  std::vector<std::pair<std::string, std::shared_ptr<LoadedModel>>> serving, held;
  {
    std::lock_guard lock(impl_->mu);
    for (const auto& [name, slot] : impl_->slots) {
      if (slot.model) serving.emplace_back(name, slot.model);
      if (slot.quarantined) held.emplace_back(name, slot.quarantined);
    }
  }
  for (const auto& [name, m] : serving)
    for (const auto& [v, lv] : m->versions) {
      if (!lv->verified) continue;
      const std::string diff = changed_files(lv->dir, *lv->verified);
      if (diff.empty()) continue;
      const std::string reason = "version " + lv->name + " failed its integrity check: " + diff;
      {
        std::lock_guard lock(impl_->mu);
        ModelSlot& slot = impl_->slots[name];
        if (slot.model != m) break;  // swapped meanwhile
        slot.quarantined = std::move(slot.model);
        slot.reason = reason;
      }
      std::cerr << "slim serve: model '" << name << "' taken out of service: " << reason << "\n";
      impl_->record(trust::audit_event::kIntegrityViolation, name, m.get(), {{"reason", reason}});
      break;
    }
  // A quarantined model comes back once its files verify again (reloaded from them).
  for (const auto& [name, m] : held) {
    bool restored = true;
    for (const auto& [v, lv] : m->versions) restored = restored && lv->verified && changed_files(lv->dir, *lv->verified).empty();
    if (!restored) continue;
    try {
      impl_->load(name);
      impl_->record("model.restored", name, m.get(), {{"reason", "its files verify again"}});
    } catch (const Error& e) {
      std::cerr << "slim serve: model '" << name << "' could not be restored: " << e.what() << "\n";
    }
  }
}

// Ends the trials whose window is over: the canary is promoted when its error rate and
// p99 latency stay within the policy's bounds of the serving version's, else dropped.
void InferenceServer::Impl::decide_canaries() {
  std::vector<std::pair<std::string, nlohmann::json>> decisions;
  std::vector<std::shared_ptr<LoadedModel>> released;
  {
    std::lock_guard load_lock(load_mu);
    std::lock_guard lock(mu);
    for (auto& [name, slot] : slots) {
      if (!slot.canary || Clock::now() < slot.canary->until) continue;
      Canary c = std::move(*slot.canary);
      slot.canary.reset();
      std::lock_guard stats_lock(c.stats->mu);
      const CanaryStats& st = *c.stats;
      auto rate = [&](int side) { return st.count[side] ? double(st.errors[side]) / double(st.count[side]) : 0.0; };
      const double p99_old = p99(st.latency_ms[0]), p99_new = p99(st.latency_ms[1]);
      std::string why;
      if (st.count[1] == 0) why = "no request reached it";
      else if (rate(1) > rate(0) + c.policy.max_error_rate_increase) why = "its error rate is above the serving version's";
      else if (st.count[0] > 0 && p99_new > p99_old * c.policy.max_p99_ratio) why = "its p99 latency is above the bound";
      nlohmann::json d = {{"requests", {st.count[0], st.count[1]}},     {"errors", {st.errors[0], st.errors[1]}},
                          {"p99_ms", {p99_old, p99_new}},               {"max_p99_ratio", c.policy.max_p99_ratio},
                          {"max_error_rate_increase", c.policy.max_error_rate_increase},
                          {"version", c.model->versions.begin()->second->name}};
      if (!c.reference.is_null()) d["reference"] = c.reference;
      if (why.empty()) {
        slot.previous = std::move(slot.model);
        slot.model = c.model;
        d["decision"] = "promoted";
      } else {
        released.push_back(c.model);  // drains outside the locks
        d["decision"] = "rolled back";
        d["reason"] = why;
      }
      decisions.emplace_back(name, d);
    }
  }
  for (auto& [name, d] : decisions) {
    std::cerr << "slim serve: model '" << name << "' canary version " << d["version"].get<std::string>() << " "
              << d["decision"].get<std::string>() << (d.contains("reason") ? ": " + d["reason"].get<std::string>() : "")
              << "\n";
    record(d["decision"] == "promoted" ? "model.canary_promoted" : "model.canary_rolled_back", name,
           find_or_null(name).get(), d);
  }
}

// Reads the memory, publishes it, and makes the one variant switch the controller asks for
// (a hot swap, as an update is); a switch that fails leaves the model where it was, to be
// tried again after its dwell.
void InferenceServer::Impl::switch_variants() {
  MemoryReading r;
  try {
    r = memory->read();
    memory_error.clear();
  } catch (const Error& e) {
    if (memory_error != e.what()) std::cerr << "slim serve: warning: cannot read the memory: " << e.what() << "\n";
    memory_error = e.what();
    return;
  }
  metrics.gauge("slim_memory_limit_bytes", "The memory the server may use (-1: no limit).").set(double(r.limit_bytes));
  metrics.gauge("slim_memory_available_bytes", "Memory available under the limit.").set(double(r.available_bytes));
  metrics.gauge("slim_memory_pressure", "Memory pressure: PSI some avg10, percent of time stalled.")
      .set(r.pressure_some_avg10);
  const VariantPolicy& p = opt.variant_policy;
  if ((r.headroom() < p.low_headroom || r.pressure_some_avg10 > p.pressure_down) && return_freed_memory() > 0) {
    try {  // what the server kept for reuse may be all it needs to give back
      r = memory->read();
    } catch (const Error&) {
      return;  // the next reading says
    }
  }
  const auto sw = variants->decide(r, Clock::now());
  if (!sw) return;
  std::vector<std::string> names;  // not the model itself: the switch must be able to free it
  if (const auto m = find_or_null(sw->model)) names = m->variants;
  if (names.size() <= std::max(sw->from, sw->to)) {
    variants->remove_model(sw->model);
    return;
  }
  std::cerr << "slim serve: model '" << sw->model << "' switches from variant " << names[sw->from] << " to "
            << names[sw->to] << ": " << sw->reason << "\n";
  LoadCause cause;
  cause.event = "model.variant_switch";
  cause.details = {{"from", names[sw->from]}, {"to", names[sw->to]}, {"reason", sw->reason},
                   {"memory", describe(r)}};
  cause.trial = false;
  cause.variant = sw->to;
  cause.previous = sw->to > sw->from ? LoadCause::Previous::released : LoadCause::Previous::unchanged;
  size_t now_serving = sw->to;
  try {
    load(sw->model, cause);
    metrics
        .counter("slim_variant_switches_total", "Variant switches, by model and direction.",
                 {{"model", sw->model}, {"direction", sw->to > sw->from ? "down" : "up"}})
        .inc();
  } catch (const Error& e) {
    std::cerr << "slim serve: model '" << sw->model << "' stays on variant " << names[sw->from] << ": "
              << e.what() << "\n";
    now_serving = sw->from;
  }
  variants->applied(sw->model, now_serving, Clock::now());
}

// Polls, integrity checks, canary decisions and variant switches, each when due; wakes at
// least every second.
void InferenceServer::Impl::watch() {
  using namespace std::chrono;
  const bool polling = opt.model_control == ServerOptions::ModelControl::poll;
  const bool checking = opt.integrity_interval_secs > 0;
  const auto poll_every = seconds(std::max(1, opt.poll_secs));
  const auto check_every = seconds(std::max(1, opt.integrity_interval_secs));
  const auto memory_every = seconds(std::max(1, opt.memory_interval_secs));
  auto next_poll = steady_clock::now() + poll_every, next_check = steady_clock::now() + check_every;
  auto next_memory = steady_clock::now() + memory_every;
  std::unique_lock lock(watch_mu);
  for (;;) {
    auto next = steady_clock::now() + seconds(1);
    if (polling) next = std::min(next, next_poll);
    if (checking) next = std::min(next, next_check);
    if (variants) next = std::min(next, next_memory);
    if (watch_cv.wait_until(lock, next, [&] { return watch_stop; })) return;
    lock.unlock();
    if (polling && steady_clock::now() >= next_poll) {
      owner->poll_repository();
      next_poll = steady_clock::now() + poll_every;
    }
    if (checking && steady_clock::now() >= next_check) {
      owner->check_integrity();
      next_check = steady_clock::now() + check_every;
    }
    decide_canaries();
    if (variants && steady_clock::now() >= next_memory) {
      switch_variants();
      next_memory = steady_clock::now() + memory_every;
    }
    lock.lock();
  }
}

InferenceServer::InferenceServer(ServerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  set_num_threads(impl_->opt.threads);
  if (!impl_->opt.repository.empty())
    impl_->repo = std::make_unique<Repository>(impl_->opt.repository);
  const double start_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  impl_->metrics.add_collector([start_unix](Metrics& m) { collect_process(m, start_unix); });
  if (impl_->opt.energy) {
    impl_->energy = std::make_unique<EnergyLedger>(*impl_->opt.energy, impl_->opt.carbon, impl_->metrics);
    for (const auto& line : impl_->energy->describe()) std::cerr << "slim serve: " << line << "\n";
  }
  impl_->owner = this;
  for (const auto& path : impl_->opt.require_signature_keys) impl_->keys.push_back(trust::PublicKey::load(path));
  if (!impl_->opt.audit_log.empty()) {
    trust::AuditLogOptions ao;
    ao.recover_torn_tail = true;  // a server killed mid-append records the loss and goes on
    impl_->audit = trust::AuditLog::open(impl_->opt.audit_log, ao);
  }
  if (!impl_->opt.audit_key.empty()) {
    check(impl_->audit != nullptr, ErrorCode::invalid_argument, "--audit-key needs --audit-log");
    impl_->audit_key = trust::PrivateKey::load(impl_->opt.audit_key);
  }
  if (impl_->opt.memory_interval_secs > 0) {
    impl_->variants = std::make_unique<VariantController>(impl_->opt.variant_policy);
    if (!impl_->opt.memory_source.empty()) {
      impl_->memory = file_memory_source(impl_->opt.memory_source);
    } else {
      try {  // a machine whose memory slim cannot read still serves, at the first variants
        impl_->memory = system_memory_source();
      } catch (const Error& e) {
        std::cerr << "slim serve: warning: variant switching is off: " << e.what() << "\n";
        impl_->variants.reset();
      }
    }
  }
}

InferenceServer::~InferenceServer() {
  impl_->stopping = true;
  {
    std::lock_guard lock(impl_->watch_mu);
    impl_->watch_stop = true;
  }
  impl_->watch_cv.notify_all();
  if (impl_->watcher.joinable()) impl_->watcher.join();
  std::map<std::string, ModelSlot> slots;
  {
    std::lock_guard lock(impl_->mu);
    slots.swap(impl_->slots);
  }
  slots.clear();  // each LoadedModel drains and stops its schedulers
}

void InferenceServer::start() {
  if (impl_->repo) {
    const auto names = impl_->repo->model_names();
    const auto& wanted = impl_->opt.load_models;
    const bool all = impl_->opt.model_control != ServerOptions::ModelControl::explicit_ ||
                     std::find(wanted.begin(), wanted.end(), "*") != wanted.end();
    for (const auto& name : names) {
      std::lock_guard lock(impl_->mu);
      impl_->slots[name].reason = "not loaded";
    }
    std::vector<std::string> to_load = all ? names : wanted;
    to_load.erase(std::remove(to_load.begin(), to_load.end(), "*"), to_load.end());
    for (const auto& name : to_load) {
      try {
        impl_->load(name);
      } catch (const Error& e) {
        std::cerr << "slim serve: model '" << name << "' failed to load: " << e.what() << "\n";
      }
    }
  }
  impl_->started = true;
  if (impl_->repo || impl_->opt.integrity_interval_secs > 0 || impl_->variants)
    impl_->watcher = std::thread([impl = impl_.get()] { impl->watch(); });
}

void InferenceServer::infer(InferRequest request, InferCallback done) {
  std::unique_ptr<ScheduledRequest> s;
  std::shared_ptr<LoadedVersion> lv;
  try {
    if (impl_->stopping) throw Error(ErrorCode::unavailable, "the server is shutting down");
    const Impl::Route route = impl_->route(request.model, request);
    const auto& m = route.model;
    lv = Impl::version_of(*m, request.version);
    if (lv->llm)
      throw Error(ErrorCode::invalid_argument, "model '" + m->name +
                                                   "' is a language model: call it through the OpenAI API "
                                                   "(/v1/chat/completions, /v1/completions)");
    impl_->in_flight.fetch_add(1);
    Impl* impl = impl_.get();
    auto finish = [impl, done = std::move(done), stats = route.stats, side = route.side,
                   t0 = Clock::now()](InferResult&& r) {
      if (stats) stats->add(side, r.error.has_value(), std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      done(std::move(r));
      if (impl->in_flight.fetch_sub(1) == 1) {
        std::lock_guard lock(impl->flight_mu);
        impl->flight_cv.notify_all();
      }
    };
    try {
      s = impl_->schedule(*m, std::move(request), finish);
    } catch (const Error& e) {
      InferResult r;
      r.error = e;
      finish(std::move(r));
      return;
    }
  } catch (const Error& e) {
    InferResult r;
    r.error = e;
    done(std::move(r));
    return;
  }
  lv->batcher->enqueue(std::move(s));
}

InferResult InferenceServer::infer_sync(InferRequest request) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<InferResult> out;
  infer(std::move(request), [&](InferResult&& r) {
    std::lock_guard lock(mu);
    out = std::move(r);
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return out.has_value(); });
  return std::move(*out);
}

bool InferenceServer::live() const {
  return !impl_->stopping;
}

bool InferenceServer::ready() const {
  if (!impl_->started || impl_->stopping) return false;
  std::lock_guard lock(impl_->mu);
  for (const auto& [name, slot] : impl_->slots)
    if (slot.wanted && !slot.model) return false;
  return true;
}

bool InferenceServer::model_ready(const std::string& name, const std::string& version) const {
  try {
    const auto m = impl_->find(name);
    Impl::version_of(*m, version);
    return !impl_->stopping;
  } catch (const Error&) {
    return false;
  }
}

ModelMetadata InferenceServer::model_metadata(const std::string& name,
                                              const std::string& version) const {
  const auto m = impl_->find(name);
  Impl::version_of(*m, version);
  ModelMetadata md;
  md.name = m->name;
  if (version.empty()) {
    for (const auto& [v, lv] : m->versions) md.versions.push_back(lv->name);
  } else {
    md.versions.push_back(version);
  }
  md.platform = m->platform;
  md.max_batch_size = m->config.max_batch_size;
  for (const auto& t : m->inputs) md.inputs.push_back(t.spec);
  for (const auto& t : m->outputs) md.outputs.push_back(t.spec);
  if (const auto& lv = Impl::version_of(*m, version); lv->verified) {
    md.digest = lv->verified->digest;
    md.signer = lv->verified->signer;
  }
  md.variants = m->variants;
  if (!m->variants.empty()) md.variant = m->variants[m->variant];
  return md;
}

ModelConfig InferenceServer::model_config(const std::string& name, const std::string& version) const {
  const auto m = impl_->find(name);
  Impl::version_of(*m, version);
  ModelConfig c = m->config;
  if (c.platform.empty()) c.platform = m->platform;
  auto complete = [](std::vector<TensorConfig>& out, const std::vector<ServedTensor>& served) {
    if (out.empty())
      for (const auto& t : served) out.push_back({t.spec.name, t.spec.dtype, t.sample_dims});
  };
  complete(c.inputs, m->inputs);
  complete(c.outputs, m->outputs);
  return c;
}

const ServerOptions& InferenceServer::options() const {
  return impl_->opt;
}

std::vector<RepositoryEntry> InferenceServer::repository_index() const {
  std::map<std::string, ModelSlot> slots;
  {
    std::lock_guard lock(impl_->mu);
    slots = impl_->slots;
  }
  if (impl_->repo)
    for (const auto& name : impl_->repo->model_names())
      if (!slots.count(name)) slots[name].reason = "not loaded";
  std::vector<RepositoryEntry> out;
  for (const auto& [name, slot] : slots) {
    if (!slot.model) {
      out.push_back({name, "", "UNAVAILABLE", slot.reason});
      continue;
    }
    for (const auto& [v, lv] : slot.model->versions) out.push_back({name, lv->name, "READY", ""});
  }
  return out;
}

void InferenceServer::load_model(const std::string& name) {
  if (impl_->stopping) throw Error(ErrorCode::unavailable, "the server is shutting down");
  impl_->load(name);
}

void InferenceServer::unload_model(const std::string& name) {
  std::shared_ptr<LoadedModel> old;
  {
    std::lock_guard load_lock(impl_->load_mu);
    {
      std::lock_guard lock(impl_->mu);
      auto it = impl_->slots.find(name);
      if (it == impl_->slots.end())
        throw Error(ErrorCode::not_found, "unknown model '" + name + "'");
      old = std::move(it->second.model);
      it->second.reason = "unloaded";
      it->second.wanted = false;
      it->second.variant.reset();
    }
    if (impl_->variants) impl_->variants->remove_model(name);
    old.reset();  // drains its queued requests
    return_freed_memory();
    impl_->metrics.remove_series({{"model", name}});
  }
  std::cerr << "slim serve: unloaded model '" << name << "'\n";
}

void InferenceServer::add_language_model(const std::string& name, const std::string& gguf_path) {
  auto m = std::make_shared<LoadedModel>();
  m->name = name;
  m->config.name = name;
  m->platform = "slim_llm";
  auto lv = std::make_shared<LoadedVersion>();
  lv->version = 1;
  lv->name = "1";
  lv->llm = std::make_shared<LlmService>(name, gguf_path, impl_->opt.llm, &impl_->metrics, impl_->energy.get());
  m->versions[1] = std::move(lv);
  std::lock_guard lock(impl_->mu);
  check(!impl_->slots.count(name), ErrorCode::invalid_argument, "a model named '" + name + "' is already served");
  ModelSlot& slot = impl_->slots[name];
  slot.model = std::move(m);
  slot.wanted = true;
  slot.outside_repository = true;
}

std::shared_ptr<LlmService> InferenceServer::language_model(const std::string& name) const {
  const auto m = impl_->find(name);
  const auto& lv = m->versions.begin()->second;
  if (!lv->llm)
    throw Error(ErrorCode::invalid_argument, "model '" + name + "' is not a language model (" + m->platform +
                                                 "): call it through KServe v2 (/v2/models/" + name + "/infer)");
  return lv->llm;
}

std::vector<std::shared_ptr<LlmService>> InferenceServer::language_models() const {
  std::vector<std::shared_ptr<LlmService>> out;
  std::lock_guard lock(impl_->mu);
  for (const auto& [name, slot] : impl_->slots)
    if (slot.model && slot.model->versions.begin()->second->llm)
      out.push_back(slot.model->versions.begin()->second->llm);
  return out;
}

std::shared_ptr<void> InferenceServer::hold_request() {
  if (impl_->stopping) throw Error(ErrorCode::unavailable, "the server is shutting down");
  impl_->in_flight.fetch_add(1);
  Impl* impl = impl_.get();
  return std::shared_ptr<void>(nullptr, [impl](void*) {
    if (impl->in_flight.fetch_sub(1) == 1) {
      std::lock_guard lock(impl->flight_mu);
      impl->flight_cv.notify_all();
    }
  });
}

std::string InferenceServer::metrics_text() const {
  return impl_->metrics.render();
}

Metrics& InferenceServer::metrics() {
  return impl_->metrics;
}

bool InferenceServer::shutdown(std::chrono::milliseconds timeout) {
  impl_->stopping = true;
  std::unique_lock lock(impl_->flight_mu);
  return impl_->flight_cv.wait_for(lock, timeout, [&] { return impl_->in_flight.load() == 0; });
}

int64_t InferenceServer::in_flight() const {
  return impl_->in_flight.load();
}

std::vector<std::string> InferenceServer::extensions() {
  // Triton's names: the repository API, binary tensors, priority and queue policies,
  // request parameters (priority, timeout, binary_data_output), and model configs.
  return {"model_repository", "binary_tensor_data", "schedule_policy", "parameters", "model_configuration"};
}

}  // namespace slim::serve
