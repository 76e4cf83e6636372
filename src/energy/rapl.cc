// RAPL energy counters, two ways: the powercap sysfs files and the perf `power` PMU.
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "energy/sources.h"

namespace slim::energy {

namespace fs = std::filesystem;

namespace {

// pread from offset 0: sysfs regenerates the value on every read.
bool read_u64(int fd, uint64_t* v) {
  char buf[32];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return false;
  buf[n] = '\0';
  char* end = nullptr;
  *v = std::strtoull(buf, &end, 10);
  return end != buf;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return s;
}

class Powercap : public EnergyMeter::Source {
 public:
  struct Zone {
    int fd;
    uint64_t max_uj, last_uj;
    double total_uj = 0;
  };
  std::vector<Zone> zones;

  ~Powercap() override {
    for (auto& z : zones) close(z.fd);
  }

  void read(double, double, double* out) override {
    for (size_t i = 0; i < zones.size(); ++i) {
      Zone& z = zones[i];
      uint64_t v = 0;
      if (read_u64(z.fd, &v)) {
        // The counter wraps at max_energy_range_uj; one wrap between reads at most (one
        // every ~20 minutes at 200 W on common parts). Below a nonsense maximum it restarted.
        z.total_uj += double(v >= z.last_uj          ? v - z.last_uj
                             : z.max_uj >= z.last_uj ? z.max_uj - z.last_uj + v
                                                     : v);
        z.last_uj = v;
      }
      out[i] = z.total_uj * 1e-6;
    }
  }
};

}  // namespace

std::string errno_text(int negative_errno) {
  return std::strerror(-negative_errno);
}

SourcePtr open_powercap(const MeterOptions& o, std::vector<std::string>& notes) {
  const std::string what = "powercap RAPL: ";
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (fs::directory_iterator it(o.powercap_root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("intel-rapl:", 0) == 0) dirs.push_back(it->path());
  }
  if (dirs.empty()) {
    notes.push_back(what + "no intel-rapl zones in " + o.powercap_root);
    return nullptr;
  }
  std::sort(dirs.begin(), dirs.end());
  auto src = std::make_unique<Powercap>();
  std::vector<std::string> skipped;
  for (const auto& dir : dirs) {
    // intel-rapl:N is package N (or psys), intel-rapl:N:M its core, uncore or dram part.
    const std::string id = dir.filename().string().substr(11), zone = read_text(dir / "name");
    const std::string package = id.substr(0, id.find(':'));
    std::string channel;
    if (zone.rfind("package", 0) == 0 && id.find(':') == std::string::npos)
      channel = "package-" + package;
    else if (zone == "dram")
      channel = "dram-" + package;
    else
      continue;  // core and uncore are inside the package; psys overlaps it
    const std::string file = (dir / "energy_uj").string();
    const int fd = o.open_file(file.c_str());
    if (fd < 0) {
      skipped.push_back(what + file + ": " + errno_text(fd) +
                        (fd == -EACCES || fd == -EPERM
                             ? " (root-only since Linux 5.10; see README, Energy)"
                             : ""));
      continue;
    }
    Powercap::Zone z{fd, 0, 0};
    const int max_fd = o.open_file((dir / "max_energy_range_uj").string().c_str());
    const bool ok = max_fd >= 0 && read_u64(max_fd, &z.max_uj) && read_u64(fd, &z.last_uj);
    if (max_fd >= 0) close(max_fd);
    if (!ok) {
      close(fd);
      skipped.push_back(what + dir.string() + ": energy_uj or max_energy_range_uj unreadable");
      continue;
    }
    src->zones.push_back(z);
    src->channels.push_back({channel, "powercap RAPL", Basis::measured, 0});
  }
  notes.insert(notes.end(), skipped.begin(), skipped.end());
  if (src->channels.empty()) {
    if (skipped.empty()) notes.push_back(what + "no package zone in " + o.powercap_root);
    return nullptr;
  }
  return src;
}

namespace {

class PerfPower : public EnergyMeter::Source {
 public:
  struct Counter {
    int fd;
    double scale;  // joules per count
    uint64_t first;
    double joules = 0;
  };
  std::vector<Counter> counters;

  ~PerfPower() override {
    for (auto& c : counters) close(c.fd);
  }

  static bool count(int fd, uint64_t* v) { return ::read(fd, v, sizeof *v) == ssize_t(sizeof *v); }

  void read(double, double, double* out) override {
    for (size_t i = 0; i < counters.size(); ++i) {
      Counter& c = counters[i];
      uint64_t v = 0;
      if (count(c.fd, &v)) c.joules = double(v - c.first) * c.scale;
      out[i] = c.joules;
    }
  }
};

// "0,28" or "0-1" (one CPU per package).
std::vector<int> parse_cpu_list(const std::string& s) {
  std::vector<int> cpus;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string part = s.substr(pos, comma - pos);
    const size_t dash = part.find('-');
    try {
      const int a = std::stoi(part),
                b = dash == std::string::npos ? a : std::stoi(part.substr(dash + 1));
      for (int c = a; c <= b; ++c) cpus.push_back(c);
    } catch (const std::exception&) {
    }
    pos = comma + 1;
  }
  return cpus;
}

}  // namespace

SourcePtr open_perf_power(const MeterOptions& o, std::vector<std::string>& notes) {
  const std::string what = "perf power PMU: ";
  const fs::path pmu(o.perf_pmu);
  std::error_code ec;
  if (!fs::is_directory(pmu / "events", ec)) {
    notes.push_back(what + "no " + o.perf_pmu);
    return nullptr;
  }
  std::vector<int> cpus = parse_cpu_list(read_text(pmu / "cpumask"));
  uint32_t type = 0;
  try {
    type = uint32_t(std::stoul(read_text(pmu / "type")));
  } catch (const std::exception&) {
    cpus.clear();
  }
  if (cpus.empty()) {
    notes.push_back(what + o.perf_pmu + " has no type or cpumask");
    return nullptr;
  }
  // Package and DRAM as with powercap; psys (the whole SoC) only where there is no package.
  std::vector<std::pair<std::string, std::string>> events;  // (event, channel prefix)
  if (fs::exists(pmu / "events" / "energy-pkg")) {
    events.push_back({"energy-pkg", "package-"});
    if (fs::exists(pmu / "events" / "energy-ram")) events.push_back({"energy-ram", "dram-"});
  } else if (fs::exists(pmu / "events" / "energy-psys")) {
    events.push_back({"energy-psys", "psys-"});
  } else {
    notes.push_back(what + "no energy-pkg or energy-psys event");
    return nullptr;
  }
  auto src = std::make_unique<PerfPower>();
  for (const auto& [event, prefix] : events) {
    const std::string config = read_text(pmu / "events" / event);  // "event=0x02"
    const size_t eq = config.find("event=");
    double scale = 0;
    uint64_t code = 0;
    try {
      code =
          std::stoull(config.substr(eq == std::string::npos ? config.size() : eq + 6), nullptr, 0);
      scale = std::stod(read_text(pmu / "events" / (event + ".scale")));
    } catch (const std::exception&) {
    }
    if (scale <= 0) {
      notes.push_back(what + event + ": no event code or scale");
      return nullptr;
    }
    for (size_t p = 0; p < cpus.size(); ++p) {
      perf_event_attr attr{};
      attr.size = sizeof attr;
      attr.type = type;
      attr.config = code;
      const int fd =
          int(syscall(SYS_perf_event_open, &attr, -1, cpus[p], -1, PERF_FLAG_FD_CLOEXEC));
      if (fd < 0) {
        const int err = errno;
        std::string why = what + "perf_event_open power/" + event + ": " + std::strerror(err);
        if (err == EACCES || err == EPERM)
          why += " (kernel.perf_event_paranoid is " +
                 read_text("/proc/sys/kernel/perf_event_paranoid") +
                 "; system-wide events need 0 or less, or CAP_PERFMON)";
        notes.push_back(why);
        return nullptr;
      }
      uint64_t first = 0;
      PerfPower::count(fd, &first);
      src->counters.push_back({fd, scale, first});
      src->channels.push_back({prefix + std::to_string(p), "perf power PMU", Basis::measured, 0});
    }
  }
  // Some VMs expose the PMU with counters that never move: wait (50 ms at most) for a tick.
  std::vector<double> j(src->channels.size(), 0.0);
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    src->read(0, 0, j.data());
    if (std::any_of(j.begin(), j.end(), [](double v) { return v > 0; })) return src;
  }
  notes.push_back(
      what +
      "the energy counters did not move in 50 ms (this machine exposes the PMU without them, "
      "as VMs do)");
  return nullptr;
}

}  // namespace slim::energy
