#include "slim/energy/power_model.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

#include "energy/tables.h"
#include "slim/core/error.h"

namespace slim::energy {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

CpuPowerModel from_row(const tables::CpuRow& r) {
  return {r.microarchitecture, r.min_watts, r.max_watts, "",
          std::string("Cloud Carbon Footprint, ") + r.source};
}

const tables::CpuRow* find_row(const std::string& name) {
  for (size_t i = 0; i < tables::kNumCpuRows; ++i)
    if (lower(tables::kCpuRows[i].microarchitecture) == lower(name)) return &tables::kCpuRows[i];
  return lower(name) == lower(tables::kCpuAverage.microarchitecture) ? &tables::kCpuAverage
                                                                     : nullptr;
}

// "key : value" lines of /proc/cpuinfo's first processor.
std::map<std::string, std::string> cpuinfo() {
  std::map<std::string, std::string> out;
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) {
      if (!out.empty()) break;
      continue;
    }
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(" \t"));
      s.erase(s.find_last_not_of(" \t") + 1);
      return s;
    };
    out.emplace(trim(line.substr(0, colon)), trim(line.substr(colon + 1)));
  }
  return out;
}

int to_int(const std::string& s) {
  try {
    return int(std::stol(s, nullptr, 0));  // decimal, or 0x... (Arm's implementer and part)
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

std::string x86_microarchitecture(const std::string& vendor, int family, int model, int stepping) {
  if (vendor == "GenuineIntel" && family == 6) {
    switch (model) {
      case 0x2A:
      case 0x2D:
        return "Sandy Bridge";
      case 0x3A:
      case 0x3E:
        return "Ivy Bridge";
      case 0x3C:
      case 0x3F:
      case 0x45:
      case 0x46:
        return "Haswell";
      case 0x3D:
      case 0x47:
      case 0x4F:
      case 0x56:
        return "Broadwell";
      case 0x4E:
      case 0x5E:
        return "Skylake";
      case 0x55:
        return stepping <= 4 ? "Skylake" : "Cascade Lake";  // 5-7 Cascade, 10-11 Cooper Lake
      case 0x8E:
      case 0x9E:
        return stepping <= 9 ? "Skylake" : "Coffee Lake";  // Kaby Lake is Skylake's core
      case 0xA5:
      case 0xA6:
        return "Coffee Lake";  // Comet Lake
      case 0x6A:
      case 0x6C:
      case 0x7D:
      case 0x7E:
        return "Ice Lake";
      case 0x8F:
        return "Sapphire Rapids";
      case 0xCF:
        return "Emerald Rapids";
      case 0xAD:
      case 0xAE:
        return "Granite Rapids";
      default:
        return "";
    }
  }
  if (vendor == "AuthenticAMD") {
    if (family == 0x17)
      return model < 0x30 ? "AMD EPYC 1st Gen" : "AMD EPYC 2nd Gen";  // Zen/Zen+, Zen 2
    if (family == 0x19)  // Zen 4: 0x10-0x1f, 0x60-0xaf; the rest Zen 3
      return (model >= 0x10 && model <= 0x1F) || (model >= 0x60 && model <= 0xAF)
                 ? "EPYC 4th Gen"
                 : "AMD EPYC 3rd Gen";
    if (family == 0x1A) return "EPYC 5th Gen";
  }
  return "";
}

std::string arm_microarchitecture(int implementer, int part) {
  if (implementer != 0x41) return "";
  switch (part) {
    case 0xD0C:
      return "AWS Graviton2";  // Neoverse N1
    case 0xD40:
      return "AWS Graviton3";  // Neoverse V1
    case 0xD4F:
      return "AWS Graviton4";  // Neoverse V2
    default:
      return "";
  }
}

CpuPowerModel CpuPowerModel::named(const std::string& microarchitecture) {
  const tables::CpuRow* row = find_row(microarchitecture);
  if (!row) {
    std::string names;
    for (const auto& n : cpu_model_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error(ErrorCode::not_found, "no CPU power coefficients for '" + microarchitecture +
                                          "'; known: " + names + ", " +
                                          tables::kCpuAverage.microarchitecture);
  }
  CpuPowerModel m = from_row(*row);
  m.cpu = "given";
  return m;
}

CpuPowerModel CpuPowerModel::detect() {
  const auto info = cpuinfo();
  auto get = [&](const char* k) {
    auto it = info.find(k);
    return it == info.end() ? std::string() : it->second;
  };
  std::string arch, cpu;
  if (info.count("vendor_id")) {
    char id[96];
    std::snprintf(id, sizeof id, "%s family %d model %d", get("vendor_id").c_str(),
                  to_int(get("cpu family")), to_int(get("model")));
    arch = x86_microarchitecture(get("vendor_id"), to_int(get("cpu family")), to_int(get("model")),
                                 to_int(get("stepping")));
    cpu = id;
  } else if (info.count("CPU implementer")) {
    arch = arm_microarchitecture(to_int(get("CPU implementer")), to_int(get("CPU part")));
    cpu = "Arm implementer " + get("CPU implementer") + " part " + get("CPU part");
  } else {
    cpu = "unknown CPU";
  }
  const tables::CpuRow* row = arch.empty() ? nullptr : find_row(arch);
  CpuPowerModel m = from_row(row ? *row : tables::kCpuAverage);
  m.cpu = cpu + (arch.empty() ? "" : " (" + arch + ")") +
          (row ? "" : ": no CCF coefficients, the CCF average");
  return m;
}

std::string CpuPowerModel::describe() const {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %g-%g W per vCPU", min_watts, max_watts);
  return microarchitecture + buf + " (" + source +
         (cpu.empty() || cpu == "given" ? "" : "; " + cpu) + ")";
}

std::vector<std::string> cpu_model_names() {
  std::vector<std::string> out;
  for (size_t i = 0; i < tables::kNumCpuRows; ++i)
    out.push_back(tables::kCpuRows[i].microarchitecture);
  std::sort(out.begin(), out.end());
  return out;
}

double memory_watts_per_gb() {
  return tables::kMemoryKwhPerGbHour * 1000.0;
}

Estimate estimate_energy(const CpuPowerModel& m, double seconds, double vcpus, double cpu_seconds,
                         double memory_gb) {
  Estimate e;
  e.idle_joules = vcpus * m.min_watts * seconds;
  e.cpu_joules = (m.max_watts - m.min_watts) * cpu_seconds;
  e.memory_joules = memory_watts_per_gb() * memory_gb * seconds;
  return e;
}

int available_vcpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace slim::energy
