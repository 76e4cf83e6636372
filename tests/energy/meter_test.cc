#include "slim/energy/meter.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "slim/core/error.h"
#include "slim/core/thread_pool.h"
#include "slim/energy/report.h"

using namespace slim;
using namespace slim::energy;
namespace fs = std::filesystem;

namespace {

// A powercap tree the test writes: zones with name, energy_uj and max_energy_range_uj.
struct FakePowercap {
  fs::path root;
  explicit FakePowercap(const std::string& test) {
    const char* env = std::getenv("SLIM_TEST_TMP");
    root = fs::path(env ? env : fs::temp_directory_path().string()) /
           ("slim_energy_" + test + "_" + std::to_string(getpid())) / "powercap";
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~FakePowercap() { fs::remove_all(root.parent_path()); }
  void zone(const std::string& id, const std::string& name, uint64_t uj,
            uint64_t max_uj = 262143328850) {
    const fs::path d = root / ("intel-rapl:" + id);
    fs::create_directories(d);
    std::ofstream(d / "name") << name << "\n";
    set(id, uj);
    std::ofstream(d / "max_energy_range_uj") << max_uj << "\n";
  }
  void set(const std::string& id, uint64_t uj) {
    std::ofstream(root / ("intel-rapl:" + id) / "energy_uj", std::ios::trunc) << uj << "\n";
  }
  // Only powercap from this tree: perf and NVML point nowhere.
  MeterOptions options() const {
    MeterOptions o;
    o.powercap_root = root.string();
    o.perf_pmu = (root / "no_power_pmu").string();
    o.cpu_model = CpuPowerModel::named("Cascade Lake");
    o.vcpus = 4;
    return o;
  }
};

bool has_note(const EnergyMeter& m, const std::string& text) {
  for (const auto& n : m.notes())
    if (n.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(Powercap, ReadsPackageAndDramZonesAndSkipsTheRest) {
  FakePowercap fake("zones");
  fake.zone("0", "package-0", 1000);
  fake.zone("0:0", "core", 500);
  fake.zone("0:1", "dram", 2000);
  fake.zone("1", "package-1", 3000);
  fake.zone("2", "psys", 4000);
  EnergyMeter m(fake.options());
  ASSERT_EQ(m.channels().size(), 3u);
  EXPECT_EQ(m.channels()[0].name, "package-0");
  EXPECT_EQ(m.channels()[1].name, "dram-0");
  EXPECT_EQ(m.channels()[2].name, "package-1");
  EXPECT_EQ(m.basis(), Basis::measured);
  EXPECT_EQ(m.describe(), "measured package-0, dram-0, package-1: powercap RAPL");
  const Reading a = m.read();
  fake.set("0", 1000 + 2'500'000);
  fake.set("0:1", 2000 + 500'000);
  fake.set("1", 3000 + 1'000'000);
  const Reading b = m.read();
  const Energy e = m.between(a, b);
  EXPECT_DOUBLE_EQ(e.joules[0], 2.5);
  EXPECT_DOUBLE_EQ(e.joules[1], 0.5);
  EXPECT_DOUBLE_EQ(e.joules[2], 1.0);
  EXPECT_DOUBLE_EQ(e.total(), 4.0);
}

TEST(Powercap, CounterWrapsAtMaxEnergyRange) {
  FakePowercap fake("wrap");
  const uint64_t max = 65'532'610'987;
  fake.zone("0", "package-0", max - 1000, max);
  EnergyMeter m(fake.options());
  const Reading a = m.read();
  fake.set("0", 500);  // wrapped: 1000 uJ to the top, then 500
  const Reading b = m.read();
  fake.set("0", 2500);
  const Reading c = m.read();
  EXPECT_DOUBLE_EQ(m.between(a, b).joules[0], 1500e-6);
  EXPECT_DOUBLE_EQ(m.between(a, c).joules[0], 3500e-6);
}

TEST(Powercap, MissingDomainsAreSkippedWithANote) {
  FakePowercap fake("missing");
  fake.zone("0", "package-0", 10);
  fs::create_directories(fake.root / "intel-rapl:1");
  std::ofstream(fake.root / "intel-rapl:1" / "name") << "package-1\n";  // no energy_uj
  EnergyMeter m(fake.options());
  ASSERT_EQ(m.channels().size(), 1u);
  EXPECT_EQ(m.channels()[0].name, "package-0");
  EXPECT_TRUE(has_note(m, "intel-rapl:1/energy_uj: No such file or directory"))
      << m.notes().front();
}

TEST(Powercap, PermissionDeniedFallsBackToTheEstimateAndSaysSo) {
  FakePowercap fake("denied");
  fake.zone("0", "package-0", 10);
  fake.zone("0:0", "dram", 10);
  MeterOptions o = fake.options();
  // Root opens a mode-000 file anyway; the opener stands in for an unprivileged user.
  o.open_file = [](const char* path) {
    return std::string(path).ends_with("/energy_uj") ? -EACCES : -ENOENT;
  };
  EnergyMeter m(o);
  EXPECT_EQ(m.basis(), Basis::estimated);
  ASSERT_EQ(m.channels().size(), 2u);
  EXPECT_EQ(m.channels()[0].name, "cpu");
  EXPECT_EQ(m.channels()[1].name, "memory");
  const std::string denied = (fake.root / "intel-rapl:0" / "energy_uj").string() +
                             ": Permission denied (root-only since Linux 5.10; see README, Energy)";
  EXPECT_TRUE(has_note(m, denied)) << m.notes().front();
  EXPECT_TRUE(has_note(m, "perf power PMU: no " + o.perf_pmu));
  EXPECT_EQ(
      m.describe().rfind(
          "estimated cpu: CPU time x Cloud Carbon Footprint power model, 4 vCPUs: Cascade Lake", 0),
      0u)
      << m.describe();
}

TEST(Powercap, NoTreeFallsBack) {
  MeterOptions o;
  o.powercap_root = "/nonexistent/powercap";
  o.perf_pmu = "/nonexistent/power";
  o.cpu_model = CpuPowerModel::named("Skylake");
  EnergyMeter m(o);
  EXPECT_EQ(m.basis(), Basis::estimated);
  EXPECT_EQ(m.notes().at(0), "powercap RAPL: no intel-rapl zones in /nonexistent/powercap");
  EXPECT_EQ(m.notes().at(1), "perf power PMU: no /nonexistent/power");
}

TEST(Nvml, AbsentLibraryIsNotAvailable) {
  MeterOptions o;
  o.measured = false;
  o.gpus = true;
  o.nvml_library = "libnvidia-ml-slim-test-absent.so.1";
  o.cpu_model = CpuPowerModel::named("Skylake");
  EnergyMeter m(o);
  EXPECT_EQ(m.channels().size(), 2u);  // the estimate only
  ASSERT_EQ(m.notes().size(), 1u);
  EXPECT_EQ(
      m.notes()[0].rfind(
          "NVML: not available (libnvidia-ml-slim-test-absent.so.1: cannot open shared object file",
          0),
      0u)
      << m.notes()[0];
}

TEST(Estimate, IsCloudCarbonFootprintsFormula) {
  const CpuPowerModel cl = CpuPowerModel::named("cascade lake");
  EXPECT_EQ(cl.microarchitecture, "Cascade Lake");
  EXPECT_EQ(cl.min_watts, 0.64);
  EXPECT_EQ(cl.max_watts, 3.97);
  // 4 vCPUs for 10 s, 25 % busy: CCF's average watts 0.64 + 0.25 x (3.97 - 0.64) per vCPU.
  const Estimate e = estimate_energy(cl, 10, 4, 10, 2);
  EXPECT_NEAR(e.total() - e.memory_joules, (0.64 + 0.25 * (3.97 - 0.64)) * 4 * 10, 1e-12);
  EXPECT_DOUBLE_EQ(e.idle_joules, 0.64 * 4 * 10);
  EXPECT_DOUBLE_EQ(e.memory_joules, 0.392 * 2 * 10);
  EXPECT_DOUBLE_EQ(memory_watts_per_gb(), 0.392);
}

TEST(Estimate, UnknownCpuModelListsTheNames) {
  try {
    CpuPowerModel::named("Pentium");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    EXPECT_NE(std::string(e.what()).find(
                  "no CPU power coefficients for 'Pentium'; known: AMD EPYC 1st Gen,"),
              std::string::npos)
        << e.what();
  }
}

TEST(Estimate, MicroarchitectureFromCpuid) {
  EXPECT_EQ(x86_microarchitecture("GenuineIntel", 6, 0x55, 4), "Skylake");
  EXPECT_EQ(x86_microarchitecture("GenuineIntel", 6, 0x55, 7), "Cascade Lake");
  EXPECT_EQ(x86_microarchitecture("GenuineIntel", 6, 0x3F, 2), "Haswell");
  EXPECT_EQ(x86_microarchitecture("GenuineIntel", 6, 0xCF, 2), "Emerald Rapids");
  EXPECT_EQ(x86_microarchitecture("AuthenticAMD", 0x17, 0x31, 0), "AMD EPYC 2nd Gen");
  EXPECT_EQ(x86_microarchitecture("AuthenticAMD", 0x19, 0x01, 1), "AMD EPYC 3rd Gen");
  EXPECT_EQ(x86_microarchitecture("AuthenticAMD", 0x19, 0x11, 1), "EPYC 4th Gen");
  EXPECT_EQ(x86_microarchitecture("GenuineIntel", 15, 4, 1), "");
  EXPECT_EQ(arm_microarchitecture(0x41, 0xD0C), "AWS Graviton2");
  EXPECT_EQ(arm_microarchitecture(0x51, 0xD0C), "");
}

TEST(EstimatedMeter, ChargesIdleAndCpuTimeApart) {
  MeterOptions o;
  o.measured = false;
  o.cpu_model = CpuPowerModel::named("Skylake");
  o.vcpus = 2;
  EnergyMeter m(o);
  ASSERT_EQ(m.channels().size(), 2u);
  EXPECT_DOUBLE_EQ(m.channels()[0].idle_watts, 2 * 0.65);
  EXPECT_DOUBLE_EQ(m.idle_watts(), 2 * 0.65);
  const Reading a = m.read();
  const int64_t until = thread_cpu_ns() + 30'000'000;
  while (thread_cpu_ns() < until) {
  }
  const Reading b = m.read();
  const Energy e = m.between(a, b);
  EXPECT_NEAR(e.joules[0], 2 * 0.65 * e.seconds + (4.26 - 0.65) * e.cpu_seconds, 1e-9);
  EXPECT_NEAR(e.idle_joules[0], 2 * 0.65 * e.seconds, 1e-12);
  EXPECT_GE(e.cpu_seconds, 0.03);
  EXPECT_EQ(e.idle_joules[1], 0);                // memory held by the work is work
  EXPECT_EQ(e.busy_cpu_seconds, e.cpu_seconds);  // the estimate sees this process only
}

TEST(Attribution, TwoWorkloadsGetTheirCpuShareAndIdleStaysApart) {
  Energy w;
  w.seconds = 2;
  w.cpu_seconds = 3;
  w.busy_cpu_seconds = 4;  // a measured meter: the machine was busy 4 CPU-s, this process 3
  w.joules = {30, 6};
  w.idle_joules = {10, 2};
  const double cpu[] = {2.0, 1.0};
  const Attribution a = attribute(w, cpu);
  ASSERT_EQ(a.joules.size(), 2u);
  EXPECT_DOUBLE_EQ(a.idle, 12);
  EXPECT_DOUBLE_EQ(a.joules[0], 24.0 * 2 / 4);
  EXPECT_DOUBLE_EQ(a.joules[1], 24.0 * 1 / 4);
  EXPECT_DOUBLE_EQ(a.other, 24.0 * 1 / 4);
  // More CPU time than the window saw busy (tick rounding): shares of their sum, nothing other.
  const double big[] = {3.0, 3.0};
  const Attribution b = attribute(w, big);
  EXPECT_DOUBLE_EQ(b.joules[0], 12);
  EXPECT_DOUBLE_EQ(b.other, 0);
}

TEST(Attribution, ConcurrentPoolWorkSplitsAnEstimatedWindow) {
  MeterOptions o;
  o.measured = false;
  o.cpu_model = CpuPowerModel::named("Cascade Lake");
  o.vcpus = 2;
  EnergyMeter m(o);
  ThreadPool pool(2);
  CpuTimeAccount heavy, light;
  auto burn = [](int64_t ns) {
    const int64_t until = thread_cpu_ns() + ns;
    while (thread_cpu_ns() < until) {
    }
  };
  const Reading a = m.read();
  std::thread t1([&] {
    CpuTimeScope s(heavy);
    pool.parallel_for(2, [&](int64_t, int64_t) { burn(20'000'000); });
  });
  std::thread t2([&] {
    CpuTimeScope s(light);
    burn(10'000'000);
  });
  t1.join();
  t2.join();
  const Reading b = m.read();
  const Energy e = m.between(a, b);
  const double cpu[] = {heavy.seconds(), light.seconds()};
  const Attribution at = attribute(e, cpu);
  EXPECT_GE(heavy.seconds(), 0.02);
  EXPECT_GE(light.seconds(), 0.01);
  // The CPU channel's work is (max - min) x CPU time; each workload gets the window's work
  // by its share of the busy CPU seconds. Pool workers are charged the steady-clock time of
  // their chunks, so with three busy threads on fewer cores the accounts can add up to more
  // than the process's CPU time: then the shares are of their sum.
  const double busy = std::max(e.busy_cpu_seconds, heavy.seconds() + light.seconds());
  EXPECT_NEAR(e.work(), (3.97 - 0.64) * e.cpu_seconds + e.joules[1], 1e-9);
  EXPECT_NEAR(at.joules[0], e.work() * heavy.seconds() / busy, 1e-9);
  EXPECT_NEAR(at.joules[1], e.work() * light.seconds() / busy, 1e-9);
  EXPECT_NEAR(at.joules[0] + at.joules[1] + at.other, e.work(), 1e-9);
  EXPECT_DOUBLE_EQ(at.idle, e.idle());
}

TEST(MeasuredMeter, BusyLoopEnergyGrowsWithItsLength) {
  MeterOptions o;
  o.cpu_model = CpuPowerModel::named("Skylake");
  EnergyMeter m(o);
  if (m.basis() != Basis::measured) {
    std::string why;
    for (const auto& n : m.notes()) why += "\n  " + n;
    GTEST_SKIP() << "no readable RAPL counter on this machine:" << why;
  }
  auto busy = [&](int64_t ns) {
    const Reading a = m.read();
    const int64_t until = thread_cpu_ns() + ns;
    while (thread_cpu_ns() < until) {
    }
    return m.between(a, m.read()).total();
  };
  const double short_j = busy(100'000'000), long_j = busy(400'000'000);
  EXPECT_GT(short_j, 0);
  EXPECT_GT(long_j, short_j);
}

TEST(Report, SplitsWorkIdleAndOtherAndPricesThem) {
  MeterOptions o;
  o.measured = false;
  o.cpu_model = CpuPowerModel::named("Skylake");
  o.vcpus = 2;
  EnergyMeter m(o);
  Energy w;
  w.seconds = 10;
  w.cpu_seconds = 5;
  w.busy_cpu_seconds = 5;
  w.joules = {3.6e6 + 100, 0};
  w.idle_joules = {100, 0};
  CarbonOptions co;
  co.region = "fra";
  co.pue = 1.5;
  const EnergyReport r = make_report(m, w, CarbonModel(co));
  EXPECT_DOUBLE_EQ(r.work_joules, 3.6e6);
  EXPECT_DOUBLE_EQ(r.idle_joules, 100);
  EXPECT_EQ(r.region, "FRA");
  EXPECT_DOUBLE_EQ(r.work_grams, 1.0 * 44.18 * 1.5);  // 1 kWh in France
  EXPECT_EQ(si(0.00123, "J"), "1.23 mJ");
  EXPECT_EQ(si(4.56e-7, "J"), "456 nJ");
  EXPECT_EQ(si(1.5e12, "FLOPs"), "1.5 TFLOPs");
}
