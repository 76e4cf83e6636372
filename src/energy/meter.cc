#include "slim/energy/meter.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "energy/sources.h"
#include "slim/core/error.h"

namespace slim::energy {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

const char* basis_name(Basis basis) {
  return basis == Basis::measured ? "measured" : "estimated";
}

namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int open_readonly(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  return fd < 0 ? -errno : fd;
}

// Cloud Carbon Footprint's model: the CPU channel is the vCPUs' idle draw plus what the
// process's CPU time adds; the memory channel integrates the resident set over time.
class CcfEstimate : public EnergyMeter::Source {
 public:
  CpuPowerModel model;
  int vcpus = 1;
  double seconds0 = 0, cpu0 = 0;
  int statm_fd = -1;
  double last_seconds = 0, last_gb = 0, memory_joules = 0, rss_seconds = -1;

  ~CcfEstimate() override {
    if (statm_fd >= 0) close(statm_fd);
  }

  double resident_gb() const {
    char buf[128];
    const ssize_t n = statm_fd < 0 ? -1 : pread(statm_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return last_gb;
    buf[n] = '\0';
    unsigned long long size = 0, resident = 0;
    if (std::sscanf(buf, "%llu %llu", &size, &resident) != 2) return last_gb;
    return double(resident) * double(sysconf(_SC_PAGESIZE)) * 1e-9;
  }

  void read(double seconds, double cpu_seconds, double* out) override {
    const Estimate e = estimate_energy(model, seconds - seconds0, vcpus, cpu_seconds - cpu0, 0);
    // The resident set moves slowly: reading it at most every 10 ms keeps a reading well
    // under a microsecond (statm alone costs about half of one).
    double gb = last_gb;
    if (seconds - rss_seconds >= 0.01) {
      gb = resident_gb();
      rss_seconds = seconds;
    }
    memory_joules +=
        memory_watts_per_gb() * 0.5 * (last_gb + gb) * (seconds - last_seconds);  // trapezoid
    last_gb = gb;
    last_seconds = seconds;
    out[0] = e.idle_joules + e.cpu_joules;
    out[1] = memory_joules;
  }
};

// Busy CPU time of the whole machine from /proc/stat's first line (USER_HZ ticks): user,
// nice, system, irq and softirq; idle, iowait and the time a hypervisor gave others (steal)
// are not busy.
double machine_busy_seconds(int fd) {
  char buf[256];
  const ssize_t n = fd < 0 ? -1 : pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  if (std::sscanf(buf, "cpu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &system, &idle,
                  &iowait, &irq, &softirq) != 7)
    return 0;
  return double(user + nice + system + irq + softirq) / double(sysconf(_SC_CLK_TCK));
}

}  // namespace

SourcePtr open_estimate(const MeterOptions& o, double seconds, double cpu_seconds) {
  auto src = std::make_unique<CcfEstimate>();
  src->model = o.cpu_model ? *o.cpu_model : CpuPowerModel::detect();
  src->vcpus = o.vcpus > 0 ? o.vcpus : available_vcpus();
  src->seconds0 = src->last_seconds = seconds;
  src->cpu0 = cpu_seconds;
  src->statm_fd = open_readonly("/proc/self/statm");
  src->last_gb = src->resident_gb();
  char watts[96];
  std::snprintf(watts, sizeof watts,
                "CPU time x Cloud Carbon Footprint power model, %d vCPUs: ", src->vcpus);
  src->channels.push_back(
      {"cpu", watts + src->model.describe(), Basis::estimated, src->vcpus * src->model.min_watts});
  std::snprintf(watts, sizeof watts, "resident memory x %g W per GB (Cloud Carbon Footprint)",
                memory_watts_per_gb());
  src->channels.push_back({"memory", watts, Basis::estimated, 0});
  return src;
}

EnergyMeter::EnergyMeter(MeterOptions o) {
  if (!o.open_file) o.open_file = open_readonly;
  if (o.measured) {
    SourcePtr cpu = open_powercap(o, notes_);
    if (!cpu) cpu = open_perf_power(o, notes_);
    if (cpu) {
      machine_cpu_ = true;
      sources_.push_back(std::move(cpu));
    }
  }
  if (sources_.empty())
    sources_.push_back(open_estimate(o, steady_seconds(), process_cpu_seconds()));
  if (o.gpus)
    if (SourcePtr gpu = open_nvml(o, notes_)) sources_.push_back(std::move(gpu));
  for (const auto& s : sources_)
    channels_.insert(channels_.end(), s->channels.begin(), s->channels.end());
  if (machine_cpu_) stat_fd_ = open_readonly("/proc/stat");
}

EnergyMeter::~EnergyMeter() {
  if (stat_fd_ >= 0) close(stat_fd_);
}

Basis EnergyMeter::basis() const {
  for (const auto& c : channels_)
    if (c.basis == Basis::estimated) return Basis::estimated;
  return Basis::measured;
}

std::string EnergyMeter::describe() const {
  std::string out;
  for (size_t i = 0; i < channels_.size();) {
    size_t j = i;
    std::string names;
    for (; j < channels_.size() && channels_[j].source == channels_[i].source; ++j)
      names += (names.empty() ? "" : ", ") + channels_[j].name;
    out += (out.empty() ? "" : "; ") + std::string(basis_name(channels_[i].basis)) + " " + names +
           ": " + channels_[i].source;
    i = j;
  }
  return out;
}

void EnergyMeter::read(Reading& r) {
  std::lock_guard<std::mutex> lock(mu_);
  r.seconds = steady_seconds();
  r.unix_seconds = unix_seconds();
  r.cpu_seconds = process_cpu_seconds();
  r.busy_cpu_seconds = machine_cpu_ ? machine_busy_seconds(stat_fd_) : r.cpu_seconds;
  r.joules.resize(channels_.size());
  double* out = r.joules.data();
  for (const auto& s : sources_) {
    s->read(r.seconds, r.cpu_seconds, out);
    out += s->channels.size();
  }
}

Reading EnergyMeter::read() {
  Reading r;
  read(r);
  return r;
}

Energy EnergyMeter::between(const Reading& a, const Reading& b) const {
  check(a.joules.size() == channels_.size() && b.joules.size() == channels_.size() &&
            b.seconds >= a.seconds,
        ErrorCode::invalid_argument,
        "EnergyMeter::between: readings of another meter, or out of order");
  Energy e;
  e.seconds = b.seconds - a.seconds;
  e.cpu_seconds = b.cpu_seconds - a.cpu_seconds;
  e.busy_cpu_seconds = b.busy_cpu_seconds - a.busy_cpu_seconds;
  e.start_unix = a.unix_seconds;
  e.end_unix = b.unix_seconds;
  for (size_t i = 0; i < channels_.size(); ++i) {
    const double j = std::max(0.0, b.joules[i] - a.joules[i]);
    e.joules.push_back(j);
    e.idle_joules.push_back(std::min(j, channels_[i].idle_watts * e.seconds));
  }
  return e;
}

void EnergyMeter::measure_idle(double seconds) {
  if (std::none_of(channels_.begin(), channels_.end(),
                   [](const Channel& c) { return c.basis == Basis::measured; }))
    return;
  const Reading a = read();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const Reading b = read();
  const double dt = b.seconds - a.seconds;
  for (size_t i = 0; i < channels_.size(); ++i)
    if (channels_[i].basis == Basis::measured && dt > 0)
      channels_[i].idle_watts = (b.joules[i] - a.joules[i]) / dt;
}

double EnergyMeter::idle_watts() const {
  double w = 0;
  for (const auto& c : channels_) w += c.idle_watts;
  return w;
}

double Energy::total() const {
  double s = 0;
  for (double j : joules) s += j;
  return s;
}

double Energy::idle() const {
  double s = 0;
  for (double j : idle_joules) s += j;
  return s;
}

Attribution attribute(const Energy& w, std::span<const double> cpu_seconds) {
  Attribution a;
  double sum = 0;
  for (double c : cpu_seconds) sum += c;
  const double busy = std::max(w.busy_cpu_seconds, sum), work = w.work();
  for (double c : cpu_seconds) a.joules.push_back(busy > 0 ? work * c / busy : 0.0);
  a.other = busy > 0 ? work * (busy - sum) / busy : work;
  a.idle = w.idle();
  return a;
}

}  // namespace slim::energy
