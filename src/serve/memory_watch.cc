#include "slim/serve/memory_watch.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "slim/core/error.h"

namespace slim::serve {
namespace fs = std::filesystem;
namespace {

// A line as an error message shows it: at most 60 bytes, unprintable bytes as '?'.
std::string quoted(std::string_view line) {
  std::string s(line.substr(0, 60));
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return "'" + s + (line.size() > 60 ? "...'" : "'");
}

[[noreturn]] void malformed(const std::string& file, size_t line, const std::string& what) {
  throw Error(ErrorCode::invalid_model, file + " line " + std::to_string(line) + ": " + what);
}

// The lines of a file; a final newline ends the last line rather than starting an empty one.
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
  }
  return lines;
}

std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t i = 0;
  while (i < line.size()) {
    if (line[i] == ' ' || line[i] == '\t') {
      ++i;
      continue;
    }
    const size_t end = std::min(line.find_first_of(" \t", i), line.size());
    fields.push_back(line.substr(i, end - i));
    i = end;
  }
  return fields;
}

// An unsigned decimal. The kernel prints counters as unsigned 64-bit values, so a value
// beyond int64 saturates rather than failing a file over a counter nobody reads.
std::optional<int64_t> unsigned_value(std::string_view s) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return static_cast<int64_t>(std::min<uint64_t>(v, std::numeric_limits<int64_t>::max()));
}

std::optional<double> percent_value(std::string_view s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v) || v < 0)
    return std::nullopt;
  return v;
}

// The text of a file, or nothing when it does not exist or cannot be read (a kernel
// without PSI refuses reads of the pressure files).
std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) return std::nullopt;
  return s.str();
}

std::string read_required(const fs::path& path) {
  auto text = read_text(path);
  if (!text) throw Error(ErrorCode::not_found, "memory source: cannot read " + path.string());
  return *text;
}

int64_t counter_or_zero(const std::map<std::string, int64_t>& counters, const std::string& name) {
  const auto it = counters.find(name);
  return it == counters.end() ? 0 : it->second;
}

// A cgroup's usage less its inactive page cache (reclaimable without stalling), as
// Kubernetes counts a container's working set.
int64_t working_set(int64_t usage, const fs::path& stat_file, const std::string& inactive_key) {
  const auto stat = read_text(stat_file);
  const int64_t inactive =
      stat ? counter_or_zero(parse_counters(*stat, stat_file.string()), inactive_key) : 0;
  return std::max<int64_t>(0, usage - inactive);
}

Pressure pressure_or_zero(const fs::path& file) {
  const auto text = read_text(file);
  return text ? parse_pressure(*text, file.string()) : Pressure{};
}

// A reading of one cgroup v2 level; nothing when it has no limit.
std::optional<MemoryReading> read_cgroup2(const fs::path& dir, const std::string& source) {
  const auto max_text = read_text(dir / "memory.max");
  if (!max_text) return std::nullopt;
  MemoryReading r;
  r.source = source;
  r.limit_bytes = parse_byte_count(*max_text, (dir / "memory.max").string(), true);
  const int64_t usage = parse_byte_count(read_required(dir / "memory.current"),
                                         (dir / "memory.current").string(), false);
  r.used_bytes = working_set(usage, dir / "memory.stat", "inactive_file");
  r.available_bytes = r.limit_bytes < 0 ? -1 : std::max<int64_t>(0, r.limit_bytes - r.used_bytes);
  return r;
}

std::optional<MemoryReading> read_cgroup1(const fs::path& dir) {
  const auto limit_text = read_text(dir / "memory.limit_in_bytes");
  if (!limit_text) return std::nullopt;
  MemoryReading r;
  r.source = "cgroup1 " + dir.string();
  r.limit_bytes = parse_byte_count(*limit_text, (dir / "memory.limit_in_bytes").string(), false);
  const int64_t usage = parse_byte_count(read_required(dir / "memory.usage_in_bytes"),
                                         (dir / "memory.usage_in_bytes").string(), false);
  r.used_bytes = working_set(usage, dir / "memory.stat", "total_inactive_file");
  r.available_bytes = std::max<int64_t>(0, r.limit_bytes - r.used_bytes);
  return r;
}

class FileSource : public MemorySource {
 public:
  explicit FileSource(fs::path dir) : dir_(std::move(dir)) {}

  MemoryReading read() const override {
    auto read = read_cgroup2(dir_, "files " + dir_.string());
    if (!read)
      throw Error(ErrorCode::not_found,
                  "memory source: cannot read " + (dir_ / "memory.max").string());
    MemoryReading r = std::move(*read);
    const Pressure p = pressure_or_zero(dir_ / "memory.pressure");
    r.pressure_some_avg10 = p.some.avg10;
    r.pressure_full_avg10 = p.full.avg10;
    if (const auto events = read_text(dir_ / "memory.events"))
      r.oom_kills =
          counter_or_zero(parse_counters(*events, (dir_ / "memory.events").string()), "oom_kill");
    return r;
  }

 private:
  fs::path dir_;
};

// The folders of the process's cgroup and its ancestors, from the mount's root down to the
// process's own, under the mount whose type is `fstype` (and, for cgroup v1, whose options
// name `controller`); empty when there is none.
std::vector<fs::path> find_cgroup(const fs::path& root, const std::string& fstype,
                                  const std::string& controller) {
  const fs::path cgroup_file = root / "proc/self/cgroup",
                 mountinfo_file = root / "proc/self/mountinfo";
  const auto cgroup_text = read_text(cgroup_file), mountinfo_text = read_text(mountinfo_file);
  if (!cgroup_text || !mountinfo_text) return {};

  // /proc/self/cgroup: "ID:CONTROLLERS:PATH"; v2 is "0::PATH".
  std::optional<std::string> path;
  const auto lines = lines_of(*cgroup_text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t a = lines[i].find(':'),
                 b = a == std::string_view::npos ? a : lines[i].find(':', a + 1);
    if (b == std::string_view::npos)
      malformed(cgroup_file.string(), i + 1,
                "expected 'ID:CONTROLLERS:PATH', got " + quoted(lines[i]));
    const std::string controllers(lines[i].substr(a + 1, b - a - 1));
    const bool match =
        controller.empty()
            ? lines[i].substr(0, a) == "0" && controllers.empty()
            : ("," + controllers + ",").find("," + controller + ",") != std::string::npos;
    if (match) path = std::string(lines[i].substr(b + 1));
  }
  if (!path) return {};

  // mountinfo: "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE
  // SUPEROPTIONS", single spaces apart (an empty SOURCE is an empty field), spaces and backslashes
  // in paths written as octal escapes.
  const auto unescape = [](std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\\' && i + 3 < s.size()) {
        int v = 0;
        if (std::from_chars(s.data() + i + 1, s.data() + i + 4, v, 8).ptr == s.data() + i + 4) {
          out += static_cast<char>(v);
          i += 3;
          continue;
        }
      }
      out += s[i];
    }
    return out;
  };
  const auto mounts = lines_of(*mountinfo_text);
  for (size_t i = 0; i < mounts.size(); ++i) {
    std::vector<std::string_view> f;
    for (size_t at = 0, end = 0; end != std::string_view::npos; at = end + 1) {
      end = mounts[i].find(' ', at);
      f.push_back(mounts[i].substr(at, end == std::string_view::npos ? end : end - at));
    }
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 10 || dash - f.begin() < 6 || f.end() - dash != 4)
      malformed(mountinfo_file.string(), i + 1, "expected a mount line, got " + quoted(mounts[i]));
    if (dash[1] != fstype) continue;
    if (!controller.empty() &&
        ("," + std::string(dash[3]) + ",").find("," + controller + ",") == std::string::npos)
      continue;
    // The cgroup path is relative to the root of the hierarchy; the mount shows the
    // hierarchy from its own root (a container sees only its part).
    const std::string mount_root = unescape(f[3]);
    std::string rel = *path;
    if (mount_root != "/") {
      if (rel != mount_root && rel.rfind(mount_root + "/", 0) != 0) continue;
      rel = rel.substr(mount_root.size());
    }
    std::vector<fs::path> levels;
    fs::path dir = root / fs::path(unescape(f[4])).relative_path();
    levels.push_back(dir);
    for (const auto& part : fs::path(rel).relative_path()) {
      if (part.empty()) continue;
      dir /= part;
      levels.push_back(dir);
    }
    if (fs::is_directory(dir)) return levels;
  }
  return {};
}

class SystemSource : public MemorySource {
 public:
  explicit SystemSource(const fs::path& root)
      : root_(root),
        v2_(find_cgroup(root, "cgroup2", "")),
        v1_(find_cgroup(root, "cgroup", "memory")) {}

  MemoryReading read() const override {
    const fs::path meminfo_file = root_ / "proc/meminfo";
    const auto meminfo = parse_meminfo(read_required(meminfo_file), meminfo_file.string());
    for (const char* key : {"MemTotal", "MemAvailable"})
      if (!meminfo.count(key))
        throw Error(ErrorCode::invalid_model, meminfo_file.string() + ": no " + key + " line");
    MemoryReading best;
    best.source = "meminfo";
    best.limit_bytes = meminfo.at("MemTotal");
    best.available_bytes = std::min(meminfo.at("MemAvailable"), best.limit_bytes);
    best.used_bytes = best.limit_bytes - best.available_bytes;

    // The tightest limit is the one with the fewest bytes left.
    const auto consider = [&](const std::optional<MemoryReading>& r) {
      if (r && r->limit_bytes >= 0 && r->available_bytes < best.available_bytes) best = *r;
    };
    for (const auto& dir : v2_) consider(read_cgroup2(dir, "cgroup2 " + dir.string()));
    for (const auto& dir : v1_) consider(read_cgroup1(dir));

    // Pressure and OOM kills of the process's own cgroup where the kernel keeps them.
    const fs::path own2 = v2_.empty() ? fs::path() : v2_.back();
    const Pressure p = pressure_or_zero(!own2.empty() && fs::exists(own2 / "memory.pressure")
                                            ? own2 / "memory.pressure"
                                            : root_ / "proc/pressure/memory");
    best.pressure_some_avg10 = p.some.avg10;
    best.pressure_full_avg10 = p.full.avg10;
    for (const fs::path& file :
         {own2.empty() ? fs::path() : own2 / "memory.events",
          v1_.empty() ? fs::path() : v1_.back() / "memory.oom_control", root_ / "proc/vmstat"}) {
      const auto text = file.empty() ? std::nullopt : read_text(file);
      if (text) {
        best.oom_kills = counter_or_zero(parse_counters(*text, file.string()), "oom_kill");
        break;
      }
    }
    return best;
  }

 private:
  fs::path root_;
  std::vector<fs::path> v2_, v1_;
};

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

int64_t parse_byte_count(std::string_view text, const std::string& file, bool max_allowed) {
  const auto lines = lines_of(text);
  if (lines.size() > 1) malformed(file, 2, "unexpected line " + quoted(lines[1]));
  const std::string_view value = lines.empty() ? std::string_view() : lines[0];
  if (max_allowed && value == "max") return -1;
  const auto v = unsigned_value(value);
  if (!v || *v == std::numeric_limits<int64_t>::max())
    malformed(
        file, 1,
        std::string(max_allowed ? "expected a byte count or 'max'" : "expected a byte count") +
            ", got " + quoted(value));
  return *v;
}

std::map<std::string, int64_t> parse_counters(std::string_view text, const std::string& file) {
  std::map<std::string, int64_t> counters;
  const auto lines = lines_of(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto f = fields_of(lines[i]);
    const auto v = f.size() == 2 ? unsigned_value(f[1]) : std::nullopt;
    if (!v) malformed(file, i + 1, "expected 'name value', got " + quoted(lines[i]));
    if (!counters.emplace(std::string(f[0]), *v).second)
      malformed(file, i + 1, "'" + std::string(f[0]) + "' appears twice");
  }
  return counters;
}

std::map<std::string, int64_t> parse_meminfo(std::string_view text, const std::string& file) {
  std::map<std::string, int64_t> values;
  const auto lines = lines_of(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto f = fields_of(lines[i]);
    std::optional<int64_t> v;
    if ((f.size() == 2 || (f.size() == 3 && f[2] == "kB")) && f[0].size() > 1 && f[0].back() == ':')
      v = unsigned_value(f[1]);
    if (v && f.size() == 3)
      v = *v <= std::numeric_limits<int64_t>::max() / 1024 ? std::optional(*v * 1024)
                                                           : std::nullopt;
    if (!v) malformed(file, i + 1, "expected 'Name: value [kB]', got " + quoted(lines[i]));
    const std::string name(f[0].substr(0, f[0].size() - 1));
    if (!values.emplace(name, *v).second) malformed(file, i + 1, "'" + name + "' appears twice");
  }
  return values;
}

Pressure parse_pressure(std::string_view text, const std::string& file) {
  Pressure p;
  const auto lines = lines_of(text);
  if (lines.size() > 2) malformed(file, 3, "unexpected line " + quoted(lines[2]));
  for (size_t i = 0; i < 2; ++i) {
    const std::string_view line = i < lines.size() ? lines[i] : std::string_view();
    const char* kind = i == 0 ? "some" : "full";
    const auto f = fields_of(line);
    PressureLine& out = i == 0 ? p.some : p.full;
    bool ok = f.size() == 5 && f[0] == kind;
    const char* keys[] = {"avg10=", "avg60=", "avg300=", "total="};
    double* avgs[] = {&out.avg10, &out.avg60, &out.avg300};
    for (size_t k = 0; ok && k < 4; ++k) {
      ok = f[k + 1].substr(0, std::string_view(keys[k]).size()) == keys[k];
      const std::string_view value = ok ? f[k + 1].substr(std::string_view(keys[k]).size()) : "";
      if (k < 3) {
        const auto v = percent_value(value);
        ok = ok && v;
        if (ok) *avgs[k] = *v;
      } else {
        const auto v = unsigned_value(value);
        ok = ok && v;
        if (ok) out.total = *v;
      }
    }
    if (!ok)
      malformed(file, i + 1,
                std::string("expected '") + kind + " avg10=N avg60=N avg300=N total=N', got " +
                    quoted(line));
  }
  return p;
}

double MemoryReading::headroom() const {
  return limit_bytes <= 0 ? 1.0
                          : static_cast<double>(available_bytes) / static_cast<double>(limit_bytes);
}

std::string describe(const MemoryReading& r) {
  char tail[160];
  std::snprintf(tail, sizeof tail, ", psi some %.2f full %.2f, oom kills %lld",
                r.pressure_some_avg10, r.pressure_full_avg10, static_cast<long long>(r.oom_kills));
  if (r.limit_bytes < 0) return r.source + ": limit unlimited, used " + mib(r.used_bytes) + tail;
  char pct[32];
  std::snprintf(pct, sizeof pct, " (%.1f%%)", 100 * r.headroom());
  return r.source + ": limit " + mib(r.limit_bytes) + ", used " + mib(r.used_bytes) +
         ", available " + mib(r.available_bytes) + pct + tail;
}

std::unique_ptr<MemorySource> system_memory_source(const fs::path& root) {
  return std::make_unique<SystemSource>(root);
}

std::unique_ptr<MemorySource> file_memory_source(const fs::path& dir) {
  return std::make_unique<FileSource>(dir);
}

VariantController::VariantController(VariantPolicy policy) : policy_(policy) {
  check(0 <= policy_.low_headroom && policy_.low_headroom < policy_.high_headroom &&
            policy_.high_headroom <= 1,
        ErrorCode::invalid_argument,
        "variant policy: needs 0 <= low headroom < high headroom <= 1");
  check(0 <= policy_.pressure_up && policy_.pressure_up <= policy_.pressure_down,
        ErrorCode::invalid_argument, "variant policy: needs 0 <= pressure_up <= pressure_down");
}

void VariantController::set_model(const std::string& model, std::vector<int64_t> variant_bytes,
                                  size_t current) {
  const std::string what = "variants of model '" + model + "'";
  check(!variant_bytes.empty(), ErrorCode::invalid_argument, what + ": none given");
  check(current < variant_bytes.size(), ErrorCode::invalid_argument,
        what + ": current variant " + std::to_string(current) + " of " +
            std::to_string(variant_bytes.size()));
  for (size_t i = 0; i < variant_bytes.size(); ++i) {
    check(
        variant_bytes[i] > 0, ErrorCode::invalid_argument,
        what + ": variant " + std::to_string(i) + " has size " + std::to_string(variant_bytes[i]));
    check(i == 0 || variant_bytes[i] < variant_bytes[i - 1], ErrorCode::invalid_argument,
          what + ": variant " + std::to_string(i) + " (" + std::to_string(variant_bytes[i]) +
              " bytes) is not smaller than variant " + std::to_string(i - 1) + " (" +
              std::to_string(variant_bytes[i - 1]) + " bytes)");
  }
  std::lock_guard lock(mu_);
  Model& m = models_[model];
  m.bytes = std::move(variant_bytes);
  m.current = current;
}

void VariantController::remove_model(const std::string& model) {
  std::lock_guard lock(mu_);
  models_.erase(model);
}

const VariantController::Model& VariantController::find(const std::string& model) const {
  const auto it = models_.find(model);
  if (it == models_.end())
    throw Error(ErrorCode::not_found, "variant controller: no model '" + model + "'");
  return it->second;
}

VariantController::Model& VariantController::find(const std::string& model) {
  return const_cast<Model&>(std::as_const(*this).find(model));
}

size_t VariantController::current(const std::string& model) const {
  std::lock_guard lock(mu_);
  return find(model).current;
}

size_t VariantController::initial(const std::vector<int64_t>& variant_bytes, const MemoryReading& reading) const {
  for (size_t i = 0; i < variant_bytes.size(); ++i)
    if (reading.limit_bytes <= 0 ||
        double(reading.available_bytes - variant_bytes[i]) / double(reading.limit_bytes) >= policy_.low_headroom)
      return i;
  return variant_bytes.empty() ? 0 : variant_bytes.size() - 1;
}

std::optional<VariantSwitch> VariantController::decide(const MemoryReading& reading,
                                                       Clock::time_point now) const {
  std::lock_guard lock(mu_);
  if (last_switch_ && now - *last_switch_ < policy_.settle) return std::nullopt;
  const auto dwelt = [&](const Model& m) {
    return !m.last_switch || now - *m.last_switch >= policy_.min_dwell;
  };
  const double headroom = reading.headroom(), psi = reading.pressure_some_avg10;
  char why[160];
  std::optional<VariantSwitch> best;
  int64_t best_bytes = 0;

  if (headroom < policy_.low_headroom || psi > policy_.pressure_down) {
    for (const auto& [name, m] : models_) {  // by name, so the first of equal savings wins
      if (m.current + 1 >= m.bytes.size() || !dwelt(m)) continue;
      const int64_t saves = m.bytes[m.current] - m.bytes[m.current + 1];
      if (!best || saves > best_bytes) {
        best = VariantSwitch{name, m.current, m.current + 1, ""};
        best_bytes = saves;
      }
    }
    if (!best) return std::nullopt;
    if (headroom < policy_.low_headroom)
      std::snprintf(why, sizeof why, "headroom %.1f%% below %.1f%%", 100 * headroom,
                    100 * policy_.low_headroom);
    else
      std::snprintf(why, sizeof why, "memory pressure %.2f above %.2f (PSI some avg10)", psi,
                    policy_.pressure_down);
    best->reason =
        std::string(why) + "; the smaller variant frees " + std::to_string(best_bytes) + " bytes";
    return best;
  }

  if (headroom > policy_.high_headroom && psi <= policy_.pressure_up) {
    double best_after = 0;
    for (const auto& [name, m] : models_) {
      if (m.current == 0 || !dwelt(m)) continue;
      const int64_t costs = m.bytes[m.current - 1] - m.bytes[m.current];
      const double after =
          reading.limit_bytes <= 0
              ? 1.0
              : static_cast<double>(reading.available_bytes - costs) / reading.limit_bytes;
      if (after > policy_.high_headroom && (!best || costs < best_bytes)) {
        best = VariantSwitch{name, m.current, m.current - 1, ""};
        best_bytes = costs;
        best_after = after;
      }
    }
    if (!best) return std::nullopt;
    std::snprintf(why, sizeof why,
                  "headroom %.1f%% above %.1f%%, %.1f%% with the larger variant's ", 100 * headroom,
                  100 * policy_.high_headroom, 100 * best_after);
    best->reason = std::string(why) + std::to_string(best_bytes) + " more bytes";
    return best;
  }
  return std::nullopt;
}

void VariantController::applied(const std::string& model, size_t variant, Clock::time_point now) {
  std::lock_guard lock(mu_);
  Model& m = find(model);
  check(variant < m.bytes.size(), ErrorCode::invalid_argument,
        "variant controller: model '" + model + "' has no variant " + std::to_string(variant));
  m.current = variant;
  m.last_switch = now;
  last_switch_ = now;
}

}  // namespace slim::serve
