#include "slim/serve/energy_ledger.h"

#include <algorithm>
#include <chrono>
#include <iostream>

#include "slim/core/error.h"
#include "slim/energy/report.h"

namespace slim::serve {
namespace {

template <typename Clock>
double now_seconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// An exponential moving average; 0 means none yet.
void average_in(std::atomic<double>& avg, double x) {
  const double r = avg.load(std::memory_order_relaxed);
  avg.store(r == 0 ? x : 0.8 * r + 0.2 * x, std::memory_order_relaxed);
}

std::string source_label(const energy::EnergyMeter& meter) {
  if (meter.basis() == energy::Basis::estimated) return "estimated";
  std::string out = "measured:";
  std::vector<std::string> seen;
  for (const auto& c : meter.channels())
    if (std::find(seen.begin(), seen.end(), c.source) == seen.end()) {
      out += (seen.empty() ? "" : "+") + c.source;
      seen.push_back(c.source);
    }
  return out;
}

}  // namespace

EnergyLedger::EnergyLedger(const energy::MeterOptions& meter, const energy::CarbonOptions& carbon,
                           Metrics& metrics)
    : meter_(meter), carbon_(carbon), source_(source_label(meter_)), metrics_(metrics) {
  const double now = meter_.read().unix_seconds;
  carbon_.grams(0, now, now);  // a grid series that does not cover the start is an error now
  idle_from_ = energy::measure_idle_power(meter_, 1.0);
  meter_.read(last_);
  metrics.gauge("slim_carbon_intensity_grams_per_kwh", "Grid carbon intensity the carbon counters use (gCO2e/kWh).",
                {{"region", region()}})
      .set(carbon_.g_per_kwh(now, now));
  metrics.gauge("slim_carbon_pue", "Power usage effectiveness the carbon counters include.").set(carbon_.pue());
  metrics.add_collector([this](Metrics& m) { collect(m); });
}

std::vector<std::string> EnergyLedger::describe() const {
  std::vector<std::string> lines;
  for (const auto& [label, text] : energy::describe_setup(meter_, carbon_, idle_from_))
    lines.push_back(label.empty() ? text : label + ": " + text);
  return lines;
}

void EnergyLedger::Series::add(const EnergyCost& c, double n) const {
  joules->inc(c.joules);
  grams->inc(c.grams);
  requests->inc(n);
}

EnergyLedger::Series EnergyLedger::series(const std::string& model, const std::string& version,
                                          const std::string& priority) {
  Labels l = {{"model", model}, {"version", version}, {"priority", priority}, {"source", source_}};
  Series s;
  s.joules = &metrics_.counter("slim_energy_joules_total",
                               "Energy above idle attributed to requests by their CPU time (source: estimated, "
                               "or measured and by what).",
                               l);
  s.requests = &metrics_.counter("slim_energy_requests_total", "Requests whose energy the joules counter holds.", l);
  l.emplace_back("region", region());
  s.grams = &metrics_.counter("slim_carbon_grams_total",
                              "Carbon of the requests' energy: kWh x grid intensity x PUE (gCO2e).", l);
  return s;
}

double EnergyLedger::grams(double joules, double start_unix, double end_unix) {
  try {
    return carbon_.grams(joules, start_unix, end_unix);
  } catch (const Error& e) {  // a grid series that ended: the energy is still counted
    if (!series_warned_.exchange(true))
      std::cerr << "slim serve: warning: carbon is no longer counted: " << e.what() << "\n";
    return 0;
  }
}

void EnergyLedger::collect(Metrics& m) {
  std::lock_guard lock(collect_mu_);
  const energy::Reading now = meter_.read();
  const energy::Energy w = meter_.between(last_, now);
  const double cpu = w.cpu_seconds;
  const energy::Attribution a = energy::attribute(w, std::span<const double>(&cpu, 1));
  const Labels src = {{"source", source_}}, reg = {{"region", region()}};
  m.counter("slim_energy_idle_joules_total",
            "Idle energy of the machine the meter sees (estimated: the vCPUs' idle draw), apart from requests.", src)
      .inc(a.idle);
  m.counter("slim_energy_process_joules_total",
            "Energy above idle of this process: requests and the server's own threads.", src)
      .inc(a.joules[0]);
  m.counter("slim_energy_other_processes_joules_total",
            "Energy above idle of other processes (machine-wide meters only).", src)
      .inc(a.other);
  m.counter("slim_carbon_idle_grams_total", "Carbon of the idle energy (gCO2e).", reg)
      .inc(grams(a.idle, w.start_unix, w.end_unix));
  m.counter("slim_carbon_process_grams_total", "Carbon of this process's energy above idle (gCO2e).", reg)
      .inc(grams(a.joules[0], w.start_unix, w.end_unix));
  last_ = now;
}

EnergyLedger::Span::Span(EnergyLedger& ledger, Kind& kind) : ledger_(ledger), kind_(kind) {
  scope_.emplace(account_);  // first: it throws when this thread has a scope open already
  ticket_ = ledger_.started_.fetch_add(1, std::memory_order_acq_rel);
  alone_ = ledger_.running_.fetch_add(1, std::memory_order_acq_rel) == 0;
  const double now = now_seconds<std::chrono::steady_clock>();
  metered_ = kind_.rate_.load(std::memory_order_relaxed) == 0 ||
             now - kind_.metered_at_.load(std::memory_order_relaxed) >= kSampleSeconds;
  if (metered_) {
    kind_.metered_at_.store(now, std::memory_order_relaxed);
    ledger_.meter_.read(start_);
  }
}

EnergyLedger::Span::~Span() {
  if (open_) ledger_.running_.fetch_sub(1, std::memory_order_acq_rel);
}

EnergyCost EnergyLedger::Span::finish() {
  scope_.reset();
  open_ = false;
  ledger_.running_.fetch_sub(1, std::memory_order_acq_rel);
  const double seen = account_.seconds();
  if (!metered_) {
    const double joules = seen * std::max(1.0, kind_.ratio_.load(std::memory_order_relaxed)) *
                          kind_.rate_.load(std::memory_order_relaxed);
    const double now = now_seconds<std::chrono::system_clock>();
    return {joules, ledger_.grams(joules, now, now)};
  }
  energy::Reading end;
  ledger_.meter_.read(end);
  const bool alone = alone_ && ledger_.started_.load(std::memory_order_acquire) == ticket_ + 1;
  const energy::Energy w = ledger_.meter_.between(start_, end);
  double cpu;
  if (alone) {
    cpu = std::max(seen, w.cpu_seconds);
    // Spans of a few microseconds say little about the ratio (clock granularity).
    if (seen > 20e-6) average_in(kind_.ratio_, cpu / seen);
  } else {
    const double r = kind_.ratio_.load(std::memory_order_relaxed);
    cpu = std::min(seen * std::max(1.0, r), std::max(seen, w.cpu_seconds));
  }
  const energy::Attribution a = energy::attribute(w, std::span<const double>(&cpu, 1));
  if (cpu > 0 && a.joules[0] > 0) average_in(kind_.rate_, a.joules[0] / cpu);
  return {a.joules[0], ledger_.grams(a.joules[0], w.start_unix, w.end_unix)};
}

}  // namespace slim::serve
