// How slim estimates energy where no counter can be read (most VMs and containers): the
// Cloud Carbon Footprint model. A vCPU draws min + utilization x (max - min) watts, with
// SPECpower-derived coefficients per microarchitecture (bundled from CCF's npm packages),
// and memory draws a fixed number of watts per GB.
#pragma once

#include <string>
#include <vector>

namespace slim::energy {

struct CpuPowerModel {
  std::string microarchitecture;  // CCF's name ("Cascade Lake"), or "CCF average" without a row
  double min_watts = 0, max_watts = 0;  // per vCPU: idle and fully busy
  std::string cpu;                      // what the model stands for: the probed CPU, or "given"
  std::string source;                   // the npm packages the coefficients come from

  // By CCF's name, case-insensitive ("CCF average" too); not_found lists the names.
  static CpuPowerModel named(const std::string& microarchitecture);
  // This machine's CPU (cpuid family and model from /proc/cpuinfo, or the Arm part); a CPU
  // CCF has no coefficients for gets the average, and `cpu` says so.
  static CpuPowerModel detect();
  std::string describe() const;  // "Cascade Lake 0.64-3.97 W per vCPU (...)"
};

// CCF's names of the microarchitectures with coefficients, sorted.
std::vector<std::string> cpu_model_names();

// The microarchitecture of an x86 CPU by vendor ("GenuineIntel", "AuthenticAMD") and cpuid
// family, model and stepping, or of an Arm CPU by implementer and part ("0x41", "0xd0c");
// "" when unknown. A name CCF has no row for is returned too ("Emerald Rapids").
std::string x86_microarchitecture(const std::string& vendor, int family, int model, int stepping);
std::string arm_microarchitecture(int implementer, int part);

// Memory power: CCF's kWh per GB-hour as watts per GB (1 GB = 1e9 bytes).
double memory_watts_per_gb();

// CCF's estimate of `seconds` of wall time on `vcpus` vCPUs during which the work used
// `cpu_seconds` of CPU time and held `memory_gb`. CCF's average watts per vCPU,
// min + utilization x (max - min) with utilization = cpu_seconds / (vcpus x seconds),
// split into what the vCPUs draw idle and what the work adds:
struct Estimate {
  double idle_joules = 0;    // vcpus x min x seconds
  double cpu_joules = 0;     // (max - min) x cpu_seconds
  double memory_joules = 0;  // memory_watts_per_gb() x memory_gb x seconds
  double total() const { return idle_joules + cpu_joules + memory_joules; }
};
Estimate estimate_energy(const CpuPowerModel& model, double seconds, double vcpus,
                         double cpu_seconds, double memory_gb);

// vCPUs this process may run on (its affinity mask): the "instance" of CCF's model.
int available_vcpus();

}  // namespace slim::energy
