// Memory watching for memory-aware model variants: a MemorySource says how much memory the
// server may use, how much it uses and how much the kernel stalls on memory (PSI), and a
// VariantController turns those readings into one variant switch at a time, with
// hysteresis and a minimum dwell per model so that it cannot flap.
//
// Sources: the system source reads /proc/meminfo and every cgroup limit above the process
// (cgroup v2's memory.max/memory.current/memory.stat/memory.events/memory.pressure, or
// cgroup v1's memory controller where the machine mounts only that one) and reports the
// tightest of them each time, so a limit set or lowered while the server runs counts at
// once. The file source reads the cgroup v2 files from a folder the caller names (tests,
// and users whose limit lives elsewhere).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace slim::serve {

struct MemoryReading {
  std::string source;  // where it came from: "cgroup2 DIR", "cgroup1 DIR", "meminfo", "files DIR"
  int64_t limit_bytes = -1;  // the cap (a cgroup limit, or MemTotal); -1: unlimited
  int64_t used_bytes = 0;    // working set: usage less inactive page cache
  int64_t available_bytes = 0;
  double pressure_some_avg10 = 0;  // PSI, percent of time some / all tasks stalled on memory
  double pressure_full_avg10 = 0;  // (0 where the kernel has no PSI)
  int64_t oom_kills = 0;           // OOM kills in the process's cgroup (machine-wide outside one)

  // available / limit, 1 when unlimited.
  double headroom() const;
};

// One line for logs: "cgroup2 /sys/fs/cgroup/x: limit 512.0 MiB, used 300.0 MiB, available
// 212.0 MiB (41.4%), psi some 0.00 full 0.00, oom kills 0".
std::string describe(const MemoryReading& r);

class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // Throws Error: not_found when a file the source needs is gone, invalid_model (naming
  // the file and line) when one is malformed.
  virtual MemoryReading read() const = 0;
};

// The machine's source. `root` prefixes every path (/proc/self/cgroup, /proc/self/mountinfo,
// /proc/meminfo, the cgroup mounts), so tests can build a fake tree.
std::unique_ptr<MemorySource> system_memory_source(const std::filesystem::path& root = "/");
// The cgroup v2 files in `dir`: memory.max and memory.current are required, memory.stat,
// memory.events and memory.pressure optional. Read anew on every read().
std::unique_ptr<MemorySource> file_memory_source(const std::filesystem::path& dir);

// Strict parsers of the kernel's formats; `file` names the file in error messages
// ("FILE line N: ..."), which are Error(invalid_model).
// memory.max, memory.current, memory.limit_in_bytes: one byte count; "max" (-1) only when
// max_allowed.
int64_t parse_byte_count(std::string_view text, const std::string& file, bool max_allowed);
// "name value" lines: memory.events, memory.stat, memory.oom_control, /proc/vmstat.
std::map<std::string, int64_t> parse_counters(std::string_view text, const std::string& file);
// /proc/meminfo: "Name:   value kB" lines, returned in bytes ("kB" is KiB; no unit: a count).
std::map<std::string, int64_t> parse_meminfo(std::string_view text, const std::string& file);
struct PressureLine {
  double avg10 = 0, avg60 = 0, avg300 = 0;
  int64_t total = 0;  // microseconds stalled
};
struct Pressure {
  PressureLine some, full;
};
// memory.pressure, /proc/pressure/memory: a "some" and a "full" line.
Pressure parse_pressure(std::string_view text, const std::string& file);

struct VariantPolicy {
  double low_headroom = 0.15;          // below: step a model down
  double high_headroom = 0.35;         // above (also after the step up): step a model up
  double pressure_down = 10.0;         // PSI some avg10 above: step a model down
  double pressure_up = 1.0;            // steps up only while PSI some avg10 is at most this
  std::chrono::seconds min_dwell{30};  // a model keeps a variant at least this long
  // No switch of any model for this long after one, so the next reading shows its effect
  // (the old variant drains and frees its memory) before another model is stepped down.
  std::chrono::seconds settle{5};
};

struct VariantSwitch {
  std::string model;
  size_t from = 0, to = 0;
  std::string reason;
};

// Decides which variant of each model to serve. Thread-safe; decide() and applied() are
// meant for one watcher thread, set_model()/remove_model() for the loaders.
class VariantController {
 public:
  using Clock = std::chrono::steady_clock;

  explicit VariantController(VariantPolicy policy = {});

  // A model's variants in preference order with their resident sizes (strictly decreasing,
  // positive), and the one it serves. Replacing a model keeps its dwell clock.
  void set_model(const std::string& model, std::vector<int64_t> variant_bytes, size_t current);
  void remove_model(const std::string& model);
  size_t current(const std::string& model) const;

  // The variant to load a model with first (no dwell, no settle): the most preferred one
  // whose bytes leave the headroom at or above low after loading, else the smallest.
  size_t initial(const std::vector<int64_t>& variant_bytes, const MemoryReading& reading) const;

  // The switch to make now, if any: one model one variant down when headroom is below
  // low or pressure above pressure_down (the model whose step frees the most bytes, ties
  // by name), one model one variant up when headroom is above high and stays above high
  // after adding the step's bytes, PSI is calm (the step that costs the fewest bytes, ties
  // by name); none in between. Models within their dwell, and everything within settle of
  // the last switch, wait.
  std::optional<VariantSwitch> decide(const MemoryReading& reading, Clock::time_point now) const;
  // The caller swapped `model` to `variant` at `now` (after a failed swap, pass the old
  // variant: the model then waits its dwell before it is tried again).
  void applied(const std::string& model, size_t variant, Clock::time_point now);

 private:
  struct Model {
    std::vector<int64_t> bytes;
    size_t current = 0;
    std::optional<Clock::time_point> last_switch;
  };
  const Model& find(const std::string& model) const;
  Model& find(const std::string& model);

  VariantPolicy policy_;
  mutable std::mutex mu_;
  std::map<std::string, Model> models_;
  std::optional<Clock::time_point> last_switch_;
};

}  // namespace slim::serve
