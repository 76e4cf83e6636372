// `slim report energy FILE`: the energy and carbon of served models from a /metrics scrape
// of `slim serve --energy` saved to a file, or of benchmark runs from the JSON that
// `slim bench|forest bench|generate|kv-bench --energy --json` write: a table, JSON and a
// PNG chart, grouped by model (version, priority, or per expert of a Mixture-of-Experts
// model), carbon priced again for another region
// when asked.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.h"
#include "plot.h"
#include "slim/core/error.h"
#include "slim/energy/carbon.h"
#include "slim/energy/report.h"

namespace slim::cli {
namespace {

struct ReportArgs {
  std::string input, by = "model", region, png, json;
};

// One line of the table: a group of series or one benchmark run.
struct Row {
  std::vector<std::string> keys;  // model, then the --by label (metrics) or the run (bench)
  std::string region, unit, source;
  double count = 0, joules = 0, grams = 0;
  double flops = 0;  // --by expert
};

struct Report {
  std::string kind;                  // "metrics" or "bench"
  std::vector<std::string> columns;  // names of Row::keys
  std::vector<Row> rows;
  // Metrics only: the process's idle energy and its energy above idle, with their carbon.
  std::optional<double> idle_j, process_j, idle_g, process_g;
  double pue = 1;
};

[[noreturn]] void fail(const std::string& msg) { throw Error(ErrorCode::invalid_argument, msg); }

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// One line of the Prometheus text exposition format, or nullopt when it is not one.
std::optional<Sample> parse_sample(const std::string& line) {
  Sample s;
  size_t i = 0;
  auto name_char = [](char c, bool first) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
           (!first && std::isdigit(static_cast<unsigned char>(c)));
  };
  while (i < line.size() && name_char(line[i], i == 0)) ++i;
  if (i == 0) return std::nullopt;
  s.name = line.substr(0, i);
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t eq = line.find('=', i);
      if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return std::nullopt;
      const std::string key = line.substr(i, eq - i);
      std::string value;
      for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\' && i + 1 < line.size()) {
          ++i;
          value += line[i] == 'n' ? '\n' : line[i];
        } else {
          value += line[i];
        }
      }
      if (i >= line.size()) return std::nullopt;
      s.labels[key] = value;
      ++i;  // the closing quote
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return std::nullopt;
    ++i;  // '}'
  }
  if (i >= line.size() || line[i] != ' ') return std::nullopt;
  const char* begin = line.c_str() + i + 1;
  char* end = nullptr;
  s.value = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return s;
}

// Prices the row's joules in `region` (the table's intensity, with the scrape's or run's PUE).
void regrid(Row& row, const std::string& region, double pue) {
  const energy::CarbonModel m({.region = region, .pue = pue});
  row.region = m.region();
  row.grams = m.grams(row.joules, 0, 0);
}

// Experts in the table's order: by number, then the shared expert, then the rest ("other").
bool expert_before(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  auto rank = [](const std::vector<std::string>& k) {
    const std::string& e = k.back();
    const bool number = !e.empty() && std::all_of(e.begin(), e.end(), [](char c) { return std::isdigit(uint8_t(c)); });
    return std::make_tuple(k.front(), number ? 0 : e == "shared" ? 1 : 2, number ? std::stoll(e) : 0LL);
  };
  return rank(a) < rank(b);
}

// --by expert on a scrape: the slim_llm_expert_* series per model and expert, summed over
// layers and versions.
Report experts_from_metrics(const std::vector<Sample>& samples, const ReportArgs& a, double pue) {
  Report r;
  r.kind = "metrics";
  r.columns = {"model", "expert"};
  std::map<std::vector<std::string>, Row> groups;
  bool energy = false;
  for (const Sample& s : samples) {
    const bool routed = s.name == "slim_llm_expert_routed_tokens_total", flops = s.name == "slim_llm_expert_flops_total",
               joules = s.name == "slim_llm_expert_joules_total", grams = s.name == "slim_llm_expert_carbon_grams_total";
    if (!(routed || flops || joules || grams)) continue;
    std::vector<std::string> keys;
    for (const std::string& c : r.columns) {
      auto it = s.labels.find(c);
      if (it == s.labels.end()) fail(a.input + ": a " + s.name + " series has no '" + c + "' label");
      keys.push_back(it->second);
    }
    Row& row = groups[keys];
    row.keys = keys;
    if (auto it = s.labels.find("source"); it != s.labels.end()) row.source = it->second;
    if (auto it = s.labels.find("region"); it != s.labels.end()) row.region = it->second;
    if (routed) row.unit = "token";
    energy |= joules;
    (routed ? row.count : flops ? row.flops : joules ? row.joules : row.grams) += s.value;
  }
  if (groups.empty())
    fail("--by expert: " + a.input +
         " has no slim_llm_expert_* series (`slim serve` writes them for Mixture-of-Experts language models)");
  if (!energy)
    fail("--by expert: " + a.input + " has no slim_llm_expert_joules_total series: the server ran without --energy");
  std::vector<std::vector<std::string>> order;
  for (auto& [k, row] : groups) order.push_back(k);
  std::sort(order.begin(), order.end(), expert_before);
  for (const auto& k : order) r.rows.push_back(groups[k]);
  if (!a.region.empty())
    for (Row& row : r.rows) regrid(row, a.region, pue);
  return r;
}

Report from_metrics(const std::vector<Sample>& samples, const ReportArgs& a) {
  Report r;
  r.kind = "metrics";
  for (const Sample& s : samples)
    if (s.name == "slim_carbon_pue") r.pue = s.value;
  if (a.by == "expert") return experts_from_metrics(samples, a, r.pue);
  r.columns = {"model"};
  if (a.by != "model") r.columns.push_back(a.by);
  std::map<std::vector<std::string>, Row> groups;
  for (const Sample& s : samples) {
    const bool joules = s.name == "slim_energy_joules_total", grams = s.name == "slim_carbon_grams_total",
               requests = s.name == "slim_energy_requests_total";
    if (!(joules || grams || requests)) continue;
    std::vector<std::string> keys;
    for (const std::string& c : r.columns) {
      auto it = s.labels.find(c);
      if (it == s.labels.end()) fail(a.input + ": a " + s.name + " series has no '" + c + "' label");
      keys.push_back(it->second);
    }
    Row& row = groups[keys];
    row.keys = keys;
    row.unit = "request";
    if (auto it = s.labels.find("source"); it != s.labels.end()) row.source = it->second;
    if (auto it = s.labels.find("region"); it != s.labels.end()) row.region = it->second;
    (joules ? row.joules : grams ? row.grams : row.count) += s.value;
  }
  if (groups.empty())
    fail(a.input + " has no slim_energy_joules_total series: save the /metrics of `slim serve --energy`");
  for (auto& [k, row] : groups) r.rows.push_back(row);
  for (const Sample& s : samples) {
    auto add = [&](std::optional<double>& to) { to = to.value_or(0) + s.value; };
    if (s.name == "slim_energy_idle_joules_total") add(r.idle_j);
    if (s.name == "slim_energy_process_joules_total") add(r.process_j);
    if (s.name == "slim_carbon_idle_grams_total") add(r.idle_g);
    if (s.name == "slim_carbon_process_grams_total") add(r.process_g);
  }
  if (!a.region.empty()) {
    for (Row& row : r.rows) regrid(row, a.region, r.pue);
    const energy::CarbonModel m({.region = a.region, .pue = r.pue});
    if (r.idle_j) r.idle_g = m.grams(*r.idle_j, 0, 0);
    if (r.process_j) r.process_g = m.grams(*r.process_j, 0, 0);
  }
  return r;
}

// Every energy report in a bench JSON (objects with "work_j" and "basis"), labelled by
// where it sits: "run" (slim bench), "batch 64" (forest bench), "prefill" (generate).
void walk(const nlohmann::json& j, const std::string& where, Report& r, const std::string& model,
          const ReportArgs& a) {
  if (!j.is_object()) return;
  if (j.contains("work_j") && j.contains("basis")) {
    Row row;
    row.keys = {model, where.empty() ? "run" : where.substr(1)};
    row.region = j.value("region", "");
    row.source = j.value("basis", "");
    row.joules = j["work_j"].get<double>();
    row.grams = j.value("work_gco2e", 0.0);
    for (const auto& [k, v] : j.items())
      if (k.rfind("j_per_", 0) == 0) row.unit = k.substr(6);
    row.count = row.unit.empty() ? 0 : j.value(row.unit + "s", 0.0);
    if (!a.region.empty()) regrid(row, a.region, j.value("pue", 1.0));
    r.rows.push_back(row);
  }
  for (const auto& [k, v] : j.items()) {
    if (v.is_object()) walk(v, k == "energy" ? where : where + " " + k, r, model, a);
    if (v.is_array())
      for (size_t i = 0; i < v.size(); ++i)
        walk(v[i], where + (v[i].is_object() && v[i].contains("batch") ? " batch " + v[i]["batch"].dump()
                                                                        : " " + k + "[" + std::to_string(i) + "]"),
             r, model, a);
  }
}

// Every "experts" object (slim generate --json, a slim serve OpenAI response's usage) with
// their energy ("expert_j"), added up; the first "region" and "pue" in the file price them.
void walk_experts(const nlohmann::json& j, std::vector<const nlohmann::json*>& found, const nlohmann::json*& region,
                  double& pue) {
  if (j.is_array())
    for (const auto& v : j) walk_experts(v, found, region, pue);
  if (!j.is_object()) return;
  for (const auto& [k, v] : j.items()) {
    if (k == "experts" && v.is_object() && v.contains("routed")) found.push_back(&v);
    if (k == "region" && v.is_string() && !region) region = &v;
    if (k == "pue" && v.is_number()) pue = v.get<double>();
    walk_experts(v, found, region, pue);
  }
}

Report experts_from_json(const nlohmann::json& j, const ReportArgs& a, const std::string& model) {
  std::vector<const nlohmann::json*> found;
  const nlohmann::json* region = nullptr;
  double pue = 1;
  walk_experts(j, found, region, pue);
  if (found.empty())
    fail("--by expert: " + a.input +
         " has no expert statistics: write it with `slim generate --energy --json` on a Mixture-of-Experts model");
  Report r;
  r.kind = "bench";
  r.columns = {"model", "expert"};
  std::vector<Row> experts, tail(2);
  tail[0].keys = {model, "shared"};
  tail[1].keys = {model, "other"};
  try {
    for (const nlohmann::json* e : found) {
      if (!e->contains("expert_j"))
        fail("--by expert: " + a.input + " has expert statistics without energy: write it with --energy");
      const auto& routed = e->at("routed");
      const size_t n = e->at("expert_flops").size();
      if (experts.empty()) {
        experts.resize(n);
        for (size_t x = 0; x < n; ++x) experts[x].keys = {model, std::to_string(x)};
      }
      if (experts.size() != n) fail("--by expert: " + a.input + " has expert statistics of different models");
      for (size_t x = 0; x < n; ++x) {
        Row& row = experts[x];
        row.unit = "token";
        for (const auto& layer : routed) row.count += layer.at(x).get<double>();
        row.flops += e->at("expert_flops").at(x).get<double>();
        row.joules += e->at("expert_j").at(x).get<double>();
        row.grams += e->at("expert_gco2e").at(x).get<double>();
      }
      const double tokens = e->at("evaluated_tokens").get<double>();
      for (Row* row : {&tail[0], &tail[1]}) {
        const std::string part = row == &tail[0] ? "shared" : "other";
        row->flops += e->at(part + "_flops").get<double>();
        row->joules += e->at(part + "_j").get<double>();
        row->grams += e->at(part + "_gco2e").get<double>();
      }
      if (e->at("shared_flops").get<double>() > 0) {
        tail[0].unit = "token";
        tail[0].count += tokens * double(routed.size());  // every token passes every layer's shared expert
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail("--by expert: " + a.input + ": malformed expert statistics: " + e.what());
  }
  if (tail[0].flops == 0) tail.erase(tail.begin());
  experts.insert(experts.end(), tail.begin(), tail.end());
  for (Row& row : experts) {
    row.source = found.front()->value("energy_basis", "");
    row.region = region ? region->get<std::string>() : "";
    if (!a.region.empty()) regrid(row, a.region, pue);
    r.rows.push_back(row);
  }
  return r;
}

Report from_bench(const nlohmann::json& j, const ReportArgs& a) {
  const std::string model = std::filesystem::path(j.value("model", a.input)).filename().string();
  if (a.by == "expert") return experts_from_json(j, a, model);
  if (a.by != "model")
    fail("--by " + a.by + " needs a /metrics scrape of `slim serve --energy`; " + a.input + " is a bench JSON");
  Report r;
  r.kind = "bench";
  r.columns = {"model", "run"};
  walk(j, "", r, model, a);
  if (r.rows.empty())
    fail(a.input + " has no energy results: write it with `slim bench|forest bench|generate|kv-bench --energy --json`");
  return r;
}

Report read_report(const ReportArgs& a) {
  std::ifstream f(a.input, std::ios::binary);
  if (!f) throw Error(ErrorCode::not_found, "cannot read " + a.input);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail(a.input + " is not valid JSON: " + e.what());
    }
    return from_bench(j, a);
  }
  std::vector<Sample> samples;
  std::istringstream lines(text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    auto s = parse_sample(line);
    if (!s)
      fail(a.input + " line " + std::to_string(n) +
           " is not Prometheus text: give a /metrics scrape of `slim serve --energy` or a bench JSON "
           "(`slim bench --energy --json`)");
    samples.push_back(std::move(*s));
  }
  return from_metrics(samples, a);
}

std::string count_text(const Row& r) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15g %s%s", r.count, r.unit.c_str(), r.count == 1 ? "" : "s");
  return r.unit.empty() ? "-" : buf;
}

std::string per(double value, double count, const std::string& unit) {
  return count > 0 ? energy::si(value / count, unit) : "-";
}

bool by_expert(const Report& r) { return r.columns.back() == "expert"; }

void print_table(const Report& r) {
  std::vector<std::string> head = r.columns;
  for (const char* h : {"region", "count", "energy", "per unit", "carbon", "per unit", "source"}) head.push_back(h);
  if (by_expert(r)) head.insert(head.begin() + long(r.columns.size()) + 2, "compute");
  std::vector<std::vector<std::string>> cells;
  for (const Row& row : r.rows) {
    std::vector<std::string> c = row.keys;
    c.insert(c.end(), {row.region, count_text(row), energy::si(row.joules, "J"), per(row.joules, row.count, "J"),
                       energy::si(row.grams, "gCO2e"), per(row.grams, row.count, "gCO2e"), row.source});
    if (by_expert(r)) c.insert(c.begin() + long(r.columns.size()) + 2, energy::si(row.flops, "FLOP"));
    cells.push_back(c);
  }
  std::vector<size_t> width(head.size());
  for (size_t i = 0; i < head.size(); ++i) {
    width[i] = head[i].size();
    for (const auto& c : cells) width[i] = std::max(width[i], c[i].size());
  }
  auto line = [&](const std::vector<std::string>& c) {
    std::string s;
    for (size_t i = 0; i < c.size(); ++i)
      s += (i ? "  " : "") + c[i] + std::string(i + 1 < c.size() ? width[i] - c[i].size() : 0, ' ');
    std::printf("%s\n", s.c_str());
  };
  line(head);
  for (const auto& c : cells) line(c);
  if (r.idle_j) std::printf("idle:                %s (%s), apart from the requests\n", energy::si(*r.idle_j, "J").c_str(),
                            energy::si(r.idle_g.value_or(0), "gCO2e").c_str());
  if (r.process_j) {
    double requests = 0;
    for (const Row& row : r.rows) requests += row.joules;
    std::printf("process above idle:  %s (%s), of which requests %.1f%%\n", energy::si(*r.process_j, "J").c_str(),
                energy::si(r.process_g.value_or(0), "gCO2e").c_str(),
                *r.process_j > 0 ? 100 * requests / *r.process_j : 0.0);
  }
}

nlohmann::json to_json(const Report& r, const ReportArgs& a) {
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& row : r.rows) {
    nlohmann::json j;
    for (size_t i = 0; i < r.columns.size(); ++i) j[r.columns[i]] = row.keys[i];
    j.update({{"region", row.region}, {"unit", row.unit}, {"count", row.count}, {"joules", row.joules},
              {"gco2e", row.grams}, {"source", row.source}});
    if (by_expert(r)) j["flops"] = row.flops;
    if (row.count > 0) {
      j["j_per_" + row.unit] = row.joules / row.count;
      j["gco2e_per_" + row.unit] = row.grams / row.count;
    }
    rows.push_back(j);
  }
  nlohmann::json out = {{"input", a.input}, {"kind", r.kind}, {"by", a.by}, {"rows", rows}};
  if (r.idle_j) out["idle_j"] = *r.idle_j, out["idle_gco2e"] = r.idle_g.value_or(0);
  if (r.process_j) out["process_j"] = *r.process_j, out["process_gco2e"] = r.process_g.value_or(0);
  return out;
}

void chart(const Report& r, const std::string& path) {
  plot::Chart c;
  const Row& first = r.rows.front();
  const bool per_unit = !by_expert(r) && std::all_of(r.rows.begin(), r.rows.end(),
                                    [&](const Row& x) { return x.count > 0 && x.unit == first.unit; });
  c.title = (by_expert(r) ? "Energy per expert" : "Energy " + std::string(per_unit ? "per " + first.unit : "")) + " (" +
            first.source +
            (first.region.empty() ? "" : ", " + first.region) + ")";
  c.y_label = per_unit ? "joules per " + first.unit : "joules";
  for (const Row& row : r.rows) {
    std::string label;
    for (const auto& k : row.keys) label += (label.empty() ? "" : " ") + k;
    c.categories.push_back(label);
    c.values.push_back(per_unit ? row.joules / row.count : row.joules);
  }
  plot::write_png(c, path);
}

void report_energy(const ReportArgs& a) {
  const Report r = read_report(a);
  print_table(r);
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    if (!f) fail("--json: cannot write '" + a.json + "'");
    f << to_json(r, a).dump(2) << "\n";
  }
  if (!a.png.empty()) chart(r, a.png);
}

}  // namespace

SLIM_COMMAND(61, [](CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "Reports from saved results: energy and carbon per model");
  cmd->require_subcommand(1);
  auto a = std::make_shared<ReportArgs>();
  auto* e = cmd->add_subcommand("energy",
                                "Energy and gCO2e per model (version, priority, expert) from a saved /metrics scrape "
                                "of `slim serve --energy`, or per run (per expert) from a JSON written with --energy "
                                "--json");
  e->add_option("input", a->input, "METRICS_DUMP (Prometheus text) or BENCH.json")->required();
  e->add_option("--by", a->by,
                "Group by model, version, priority (a metrics dump) or expert (a metrics dump of a Mixture-of-Experts "
                "model, or `slim generate --energy --json`: tokens routed, FLOPs, J and gCO2e per expert) "
                "(default model)")
      ->check(CLI::IsMember({"model", "version", "priority", "expert"}));
  e->add_option("--region", a->region,
                "Price the energy in this grid region instead (the bundled table's intensity; `slim energy regions`)");
  e->add_option("--png", a->png, "Also draw the energy per request (or run) as a bar chart in this PNG file");
  e->add_option("--json", a->json, "Also write the table as JSON to this file");
  e->callback([a] { report_energy(*a); });
});

}  // namespace slim::cli
