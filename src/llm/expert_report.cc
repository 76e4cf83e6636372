#include "slim/llm/expert_report.h"

#include <vector>

namespace slim::llm {

nlohmann::json expert_usage_json(const ExpertUsage& u, const WorkEnergy* energy) {
  nlohmann::json routed = nlohmann::json::array();
  for (int l = 0; l < u.n_layer; ++l) {
    nlohmann::json row = nlohmann::json::array();
    for (int e = 0; e < u.n_expert; ++e) row.push_back(u.count(l, e));
    routed.push_back(row);
  }
  std::vector<double> expert_flops(size_t(u.n_expert), 0.0);
  for (int e = 0; e < u.n_expert; ++e)
    for (int l = 0; l < u.n_layer; ++l) expert_flops[size_t(e)] += u.expert_flops(l, e);
  nlohmann::json j = {{"evaluated_tokens", u.tokens}, {"routed", routed},
                      {"expert_flops", expert_flops}, {"shared_flops", u.shared_flops()},
                      {"other_flops", u.other_flops}, {"total_flops", u.total_flops()}};
  if (energy && u.total_flops() > 0) {
    nlohmann::json ej = nlohmann::json::array(), eg = nlohmann::json::array();
    for (double f : expert_flops) {
      ej.push_back(flops_share(u, f, energy->joules));
      eg.push_back(flops_share(u, f, energy->grams));
    }
    j["energy_basis"] = energy->basis;
    j["expert_j"] = ej;
    j["expert_gco2e"] = eg;
    j["shared_j"] = flops_share(u, u.shared_flops(), energy->joules);
    j["shared_gco2e"] = flops_share(u, u.shared_flops(), energy->grams);
    j["other_j"] = flops_share(u, u.other_flops, energy->joules);
    j["other_gco2e"] = flops_share(u, u.other_flops, energy->grams);
  }
  return j;
}

}  // namespace slim::llm
