// A Mixture-of-Experts model's expert work (ExpertUsage) as JSON, the one form that
// `slim generate --json` and `slim serve`'s OpenAI usage write and `slim report energy
// --by expert` reads; with the work's energy, each part gets its share by FLOPs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "slim/llm/model.h"

namespace slim::llm {

// Energy and carbon of the work an ExpertUsage counts, and how it was obtained
// ("measured" or "estimated").
struct WorkEnergy {
  double joules = 0, grams = 0;
  std::string basis;
};

// `of` x flops / the usage's total FLOPs: the part of the work's energy that `flops` get
// (an attribution that assumes a FLOP costs the same in every part of the model).
inline double flops_share(const ExpertUsage& u, double flops, double of) {
  const double total = u.total_flops();
  return total > 0 ? of * flops / total : 0.0;
}

// {"evaluated_tokens", "routed" [layer][expert], "expert_flops" [expert], "shared_flops",
// "other_flops", "total_flops"}; with `energy` also "energy_basis", "expert_j",
// "expert_gco2e" [expert], "shared_j", "shared_gco2e", "other_j", "other_gco2e".
nlohmann::json expert_usage_json(const ExpertUsage& u, const WorkEnergy* energy = nullptr);

}  // namespace slim::llm
