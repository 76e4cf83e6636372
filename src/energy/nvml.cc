// NVIDIA GPUs through NVML, loaded with dlopen at run time: slim has no link-time dependency
// on the driver, and machines without it only get a note.
#include <dlfcn.h>

#include <cstdio>
#include <type_traits>

#include "energy/sources.h"

namespace slim::energy {

namespace {

// The few NVML entry points used (nvml.h's C ABI: return codes, opaque device handles).
using nvmlReturn = int;
using nvmlDevice = struct nvmlDevice_st*;
constexpr nvmlReturn kNvmlSuccess = 0;

struct NvmlApi {
  nvmlReturn (*init)();
  nvmlReturn (*shutdown)();
  const char* (*error_string)(nvmlReturn);
  nvmlReturn (*count)(unsigned*);
  nvmlReturn (*handle)(unsigned, nvmlDevice*);
  nvmlReturn (*name)(nvmlDevice, char*, unsigned);
  nvmlReturn (*energy_mj)(nvmlDevice, unsigned long long*);  // since driver load (Volta and later)
  nvmlReturn (*power_mw)(nvmlDevice, unsigned*);
};

class Nvml : public EnergyMeter::Source {
 public:
  struct Gpu {
    nvmlDevice device;
    bool counter;  // total energy counter; else power x time between reads
    unsigned long long first_mj = 0;
    double last_seconds = 0, last_watts = 0, joules = 0;
  };
  void* lib = nullptr;
  NvmlApi api{};
  std::vector<Gpu> gpus;

  ~Nvml() override {
    if (!lib) return;
    api.shutdown();
    dlclose(lib);
  }

  void read(double seconds, double, double* out) override {
    for (size_t i = 0; i < gpus.size(); ++i) {
      Gpu& g = gpus[i];
      if (g.counter) {
        unsigned long long mj = 0;
        if (api.energy_mj(g.device, &mj) == kNvmlSuccess) g.joules = double(mj - g.first_mj) * 1e-3;
      } else {
        unsigned mw = 0;
        if (api.power_mw(g.device, &mw) == kNvmlSuccess) {
          const double w = mw * 1e-3;
          g.joules += 0.5 * (g.last_watts + w) * (seconds - g.last_seconds);  // trapezoid
          g.last_watts = w;
          g.last_seconds = seconds;
        }
      }
      out[i] = g.joules;
    }
  }
};

}  // namespace

SourcePtr open_nvml(const MeterOptions& o, std::vector<std::string>& notes) {
  const std::string what = "NVML: not available (";
  void* lib = dlopen(o.nvml_library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    notes.push_back(what + (err ? err : o.nvml_library + ": cannot load") + ")");
    return nullptr;
  }
  auto src = std::make_unique<Nvml>();
  NvmlApi& a = src->api;
  const char* missing = nullptr;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && !missing) missing = name;
  };
  sym(a.init, "nvmlInit_v2");
  sym(a.shutdown, "nvmlShutdown");
  sym(a.error_string, "nvmlErrorString");
  sym(a.count, "nvmlDeviceGetCount_v2");
  sym(a.handle, "nvmlDeviceGetHandleByIndex_v2");
  sym(a.name, "nvmlDeviceGetName");
  sym(a.energy_mj, "nvmlDeviceGetTotalEnergyConsumption");
  sym(a.power_mw, "nvmlDeviceGetPowerUsage");
  if (missing) {
    notes.push_back(what + o.nvml_library + " has no " + missing + ")");
    dlclose(lib);
    return nullptr;
  }
  if (const nvmlReturn r = a.init(); r != kNvmlSuccess) {
    notes.push_back(what + "nvmlInit: " + a.error_string(r) + ")");
    dlclose(lib);
    return nullptr;
  }
  src->lib = lib;  // from here the destructor shuts NVML down
  unsigned n = 0;
  a.count(&n);
  const double now = steady_seconds();
  for (unsigned i = 0; i < n; ++i) {
    Nvml::Gpu g{};
    char name[96] = "unknown GPU";
    unsigned mw = 0;
    if (a.handle(i, &g.device) != kNvmlSuccess) continue;
    a.name(g.device, name, sizeof name);
    g.counter = a.energy_mj(g.device, &g.first_mj) == kNvmlSuccess;
    if (!g.counter && a.power_mw(g.device, &mw) != kNvmlSuccess) {
      notes.push_back("NVML: gpu-" + std::to_string(i) + " (" + name +
                      ") reports neither energy nor power");
      continue;
    }
    g.last_seconds = now;
    g.last_watts = mw * 1e-3;
    src->gpus.push_back(g);
    src->channels.push_back(
        {"gpu-" + std::to_string(i),
         std::string("NVML ") + (g.counter ? "energy counter: " : "power x time: ") + name,
         Basis::measured, 0});
  }
  if (src->gpus.empty()) {
    notes.push_back("NVML: no GPU to read");
    return nullptr;
  }
  return src;
}

}  // namespace slim::energy
