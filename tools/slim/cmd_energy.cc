// `slim energy status|estimate|regions`: what this machine can measure (and why not), what
// Cloud Carbon Footprint's model estimates for a given CPU time, and the grid table.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "energy_cli.h"
#include "slim/core/error.h"

namespace slim::cli {
namespace {

struct StatusArgs {
  EnergyArgs energy;
  bool gpus = false;
  double idle = 1.0;
};

void status(const StatusArgs& a) {
  energy::MeterOptions o = meter_options(a.energy);
  o.gpus = a.gpus;
  energy::EnergyMeter meter(o);
  const energy::CarbonModel carbon(a.energy.carbon);
  meter.measure_idle(a.idle);
  std::printf("energy: %s\n", energy::basis_name(meter.basis()));
  for (const auto& c : meter.channels())
    std::printf("  %-10s %-9s idle %-9s %s\n", c.name.c_str(), energy::basis_name(c.basis),
                energy::si(c.idle_watts, "W").c_str(), c.source.c_str());
  for (const auto& n : meter.notes()) std::printf("not measured: %s\n", n.c_str());
  std::printf("carbon: %s\n", carbon.describe().c_str());
}

struct EstimateArgs {
  EnergyArgs energy;
  double seconds = 0, cpu_seconds = 0, memory_gb = 0;
  int vcpus = 0;
  std::string json;
};

void estimate(const EstimateArgs& a) {
  const energy::CpuPowerModel model = a.energy.cpu_model.empty()
                                          ? energy::CpuPowerModel::detect()
                                          : energy::CpuPowerModel::named(a.energy.cpu_model);
  const int vcpus = a.vcpus > 0 ? a.vcpus : energy::available_vcpus();
  if (a.cpu_seconds > a.seconds * vcpus)
    throw Error(ErrorCode::invalid_argument,
                "--cpu-seconds exceeds --seconds x vCPUs (" + std::to_string(vcpus) + ")");
  const energy::CarbonModel carbon(a.energy.carbon);
  const energy::Estimate e =
      energy::estimate_energy(model, a.seconds, vcpus, a.cpu_seconds, a.memory_gb);
  const double compute_kwh = (e.idle_joules + e.cpu_joules) / 3.6e6,
               memory_kwh = e.memory_joules / 3.6e6;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double compute_g = carbon.grams(e.idle_joules + e.cpu_joules, now, now);
  const double memory_g = carbon.grams(e.memory_joules, now, now);
  std::printf("cpu model: %s\n", model.describe().c_str());
  std::printf("usage:     %g s on %d vCPUs, %g CPU s (%.4g%% busy), %g GB of memory\n", a.seconds,
              vcpus, a.cpu_seconds,
              a.seconds > 0 ? 100.0 * a.cpu_seconds / (a.seconds * vcpus) : 0.0, a.memory_gb);
  std::printf("energy:    estimated %s: idle %s + CPU %s + memory %s (%.6g kWh)\n",
              energy::si(e.total(), "J").c_str(), energy::si(e.idle_joules, "J").c_str(),
              energy::si(e.cpu_joules, "J").c_str(), energy::si(e.memory_joules, "J").c_str(),
              compute_kwh + memory_kwh);
  std::printf("carbon:    %s; %s\n", energy::si(compute_g + memory_g, "gCO2e").c_str(),
              carbon.describe().c_str());
  if (a.json.empty()) return;
  std::ofstream f(a.json);
  if (!f) throw Error(ErrorCode::invalid_argument, "--json: cannot write '" + a.json + "'");
  const nlohmann::json j = {
      {"basis", "estimated"},         {"cpu_model", model.microarchitecture},
      {"min_watts", model.min_watts}, {"max_watts", model.max_watts},
      {"seconds", a.seconds},         {"vcpus", vcpus},
      {"cpu_seconds", a.cpu_seconds}, {"memory_gb", a.memory_gb},
      {"idle_j", e.idle_joules},      {"cpu_j", e.cpu_joules},
      {"memory_j", e.memory_joules},  {"total_j", e.total()},
      {"compute_kwh", compute_kwh},   {"memory_kwh", memory_kwh},
      {"region", carbon.region()},    {"g_per_kwh", carbon.g_per_kwh(now, now)},
      {"pue", carbon.pue()},          {"compute_gco2e", compute_g},
      {"memory_gco2e", memory_g},     {"gco2e", compute_g + memory_g}};
  f << j.dump() << "\n";
}

}  // namespace

SLIM_COMMAND(60, [](CLI::App& app) {
  auto* cmd =
      app.add_subcommand("energy",
                         "Energy meters and carbon: what this machine measures, CCF estimates, "
                         "grid intensities");
  cmd->require_subcommand(1);

  auto s = std::make_shared<StatusArgs>();
  auto* st =
      cmd->add_subcommand("status",
                          "The meter this machine gets (measured or estimated, and why) and its "
                          "idle power, and the carbon setting");
  add_carbon_options(st, &s->energy);
  st->add_flag("--gpus", s->gpus, "Also NVIDIA GPUs through NVML");
  st->add_option("--idle", s->idle, "Seconds of sleep to measure idle power (measured channels)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  st->callback([s] { status(*s); });

  auto e = std::make_shared<EstimateArgs>();
  auto* es = cmd->add_subcommand("estimate",
                                 "Cloud Carbon Footprint's energy and carbon for a given CPU time, "
                                 "wall time and memory");
  es->add_option("--seconds", e->seconds, "Wall time")->required()->check(CLI::NonNegativeNumber);
  es->add_option("--cpu-seconds", e->cpu_seconds, "CPU time of the work")
      ->required()
      ->check(CLI::NonNegativeNumber);
  es->add_option("--vcpus", e->vcpus, "vCPUs of the machine (default: those this process may use)")
      ->check(CLI::PositiveNumber);
  es->add_option("--memory-gb", e->memory_gb, "Memory held (GB of 1e9 bytes)")
      ->check(CLI::NonNegativeNumber);
  es->add_option("--json", e->json, "Also write the numbers as JSON to this file");
  add_carbon_options(es, &e->energy);
  es->callback([e] { estimate(*e); });

  auto* rg =
      cmd->add_subcommand("regions", "The bundled grid carbon intensities (gCO2e/kWh) by region");
  rg->callback([] {
    std::printf("# %s\n", energy::grid_source());
    for (const auto& r : energy::grid_regions()) {
      char value[32];
      *std::to_chars(value, value + sizeof value - 1, r.g_per_kwh).ptr =
          '\0';  // shortest exact form
      std::printf("%-8s %s\n", r.code.c_str(), value);
    }
  });
});

}  // namespace slim::cli
