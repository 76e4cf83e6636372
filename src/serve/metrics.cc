#include "slim/serve/metrics.h"

#include <cmath>
#include <charconv>

#include "slim/core/error.h"

namespace slim::serve {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

void Histogram::snapshot(std::vector<uint64_t>* cumulative, double* sum, uint64_t* count) const {
  cumulative->assign(bounds_.size() + 1, 0);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    (*cumulative)[i] = total;
  }
  *sum = sum_.load(std::memory_order_relaxed);
  *count = total;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i) b.push_back(start * std::pow(factor, i));
  return b;
}

namespace {

// Label values escape backslash, double quote and newline; help text backslash and newline.
std::string escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"' && quote) out += "\\\"";
    else out += c;
  }
  return out;
}

std::string label_text(const Labels& labels, const std::string& extra = "") {
  std::string out;
  for (const auto& [k, v] : labels) {
    out += out.empty() ? "" : ",";
    out += k + "=\"" + escape(v, true) + "\"";
  }
  if (!extra.empty()) out += (out.empty() ? "" : ",") + extra;
  return out.empty() ? "" : "{" + out + "}";
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // the shortest form that reads back exactly
  return std::string(buf, r.ptr);
}

}  // namespace

Metrics::Series& Metrics::series(const std::string& name, const std::string& help, Kind kind,
                                 const Labels& labels) {
  std::lock_guard lock(mu_);
  auto [fit, fresh] = families_.try_emplace(name);
  Family& f = fit->second;
  if (fresh) {
    f.kind = kind;
    f.help = help;
  }
  check(f.kind == kind, ErrorCode::internal, "metric " + name + " registered with two types");
  auto [sit, added] = f.series.try_emplace(label_text(labels));
  if (added) sit->second.labels = labels;
  return sit->second;
}

Counter& Metrics::counter(const std::string& name, const std::string& help, const Labels& labels) {
  Series& s = series(name, help, Kind::counter, labels);
  std::lock_guard lock(mu_);
  if (!s.c) s.c = std::make_unique<Counter>();
  return *s.c;
}

Gauge& Metrics::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  Series& s = series(name, help, Kind::gauge, labels);
  std::lock_guard lock(mu_);
  if (!s.g) s.g = std::make_unique<Gauge>();
  return *s.g;
}

Histogram& Metrics::histogram(const std::string& name, const std::string& help,
                              const std::vector<double>& bounds, const Labels& labels) {
  Series& s = series(name, help, Kind::histogram, labels);
  std::lock_guard lock(mu_);
  if (!s.h) s.h = std::make_unique<Histogram>(bounds);
  return *s.h;
}

void Metrics::remove_series(const Labels& match) {
  std::lock_guard lock(mu_);
  for (auto& [name, f] : families_) {
    std::erase_if(f.series, [&](const auto& kv) {
      for (const auto& m : match) {
        bool found = false;
        for (const auto& l : kv.second.labels) found = found || l == m;
        if (!found) return false;
      }
      return true;
    });
  }
}

void Metrics::add_collector(std::function<void(Metrics&)> collect) {
  std::lock_guard lock(mu_);
  collectors_.push_back(std::move(collect));
}

std::string Metrics::render() {
  std::vector<std::function<void(Metrics&)>> collectors;
  {
    std::lock_guard lock(mu_);
    collectors = collectors_;
  }
  for (auto& c : collectors) c(*this);
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    if (f.series.empty()) continue;
    const char* type = f.kind == Kind::counter ? "counter" : f.kind == Kind::gauge ? "gauge" : "histogram";
    out += "# HELP " + name + " " + escape(f.help, false) + "\n# TYPE " + name + " " + type + "\n";
    for (const auto& [key, s] : f.series) {
      if (s.c) out += name + key + " " + number(s.c->value()) + "\n";
      if (s.g) out += name + key + " " + number(s.g->value()) + "\n";
      if (s.h) {
        std::vector<uint64_t> cum;
        double sum;
        uint64_t count;
        s.h->snapshot(&cum, &sum, &count);
        for (size_t i = 0; i < cum.size(); ++i) {
          const std::string le = "le=\"" + (i < s.h->bounds().size() ? number(s.h->bounds()[i]) : "+Inf") + "\"";
          out += name + "_bucket" + label_text(s.labels, le) + " " + std::to_string(cum[i]) + "\n";
        }
        out += name + "_sum" + key + " " + number(sum) + "\n";
        out += name + "_count" + key + " " + std::to_string(count) + "\n";
      }
    }
  }
  return out;
}

}  // namespace slim::serve
