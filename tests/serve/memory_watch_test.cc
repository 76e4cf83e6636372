// Memory sources (the kernel's file formats, a fake machine tree, this machine) and the
// variant controller's policy, with time passed in.
#include "slim/serve/memory_watch.h"

#include <gtest/gtest.h>

#include <fstream>

#include "slim/core/error.h"

namespace slim::serve {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The message of the slim::Error that fn throws, "" when it throws none.
template <class Fn>
std::string error_of(Fn fn, ErrorCode code = ErrorCode::invalid_model) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  return "";
}

fs::path test_dir(const std::string& name) {
  const char* env = std::getenv("SLIM_TEST_TMP");
  const auto dir = fs::path(env ? env : fs::temp_directory_path() / "slim_test") / "serve" /
                   "memory_watch" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

const char* kCalmPressure =
    "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";

TEST(MemoryParsers, ByteCounts) {
  EXPECT_EQ(parse_byte_count("536870912\n", "memory.max", true), 536870912);
  EXPECT_EQ(parse_byte_count("max\n", "memory.max", true), -1);
  EXPECT_EQ(parse_byte_count("1234", "memory.current", false), 1234);
  EXPECT_EQ(error_of([] { parse_byte_count("max\n", "memory.current", false); }),
            "memory.current line 1: expected a byte count, got 'max'");
  EXPECT_EQ(error_of([] { parse_byte_count("", "memory.max", true); }),
            "memory.max line 1: expected a byte count or 'max', got ''");
  EXPECT_EQ(error_of([] { parse_byte_count("-5\n", "memory.max", true); }),
            "memory.max line 1: expected a byte count or 'max', got '-5'");
  EXPECT_EQ(error_of([] { parse_byte_count("12 kB\n", "memory.max", true); }),
            "memory.max line 1: expected a byte count or 'max', got '12 kB'");
  EXPECT_EQ(error_of([] { parse_byte_count("99999999999999999999\n", "memory.max", true); }),
            "memory.max line 1: expected a byte count or 'max', got '99999999999999999999'");
  EXPECT_EQ(error_of([] { parse_byte_count("1\n2\n", "memory.current", false); }),
            "memory.current line 2: unexpected line '2'");
  EXPECT_EQ(error_of([] { parse_byte_count(std::string("\x01\xff", 2), "memory.max", true); }),
            "memory.max line 1: expected a byte count or 'max', got '?"
            "?'");
}

TEST(MemoryParsers, Counters) {
  // cgroup v2 memory.events and cgroup v1 memory.oom_control as the kernel writes them.
  const auto events = parse_counters("low 0\nhigh 3\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n",
                                     "memory.events");
  EXPECT_EQ(events, (std::map<std::string, int64_t>{{"low", 0},
                                                    {"high", 3},
                                                    {"max", 12},
                                                    {"oom", 2},
                                                    {"oom_kill", 1},
                                                    {"oom_group_kill", 0}}));
  EXPECT_EQ(parse_counters("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n", "memory.oom_control")
                .at("oom_kill"),
            4);
  // An unsigned 64-bit counter beyond int64 saturates.
  EXPECT_EQ(parse_counters("nr_x 18446744073709551615\n", "vmstat").at("nr_x"), INT64_MAX);
  EXPECT_EQ(error_of([] { parse_counters("oom 0\noom_kill\n", "memory.events"); }),
            "memory.events line 2: expected 'name value', got 'oom_kill'");
  EXPECT_EQ(error_of([] { parse_counters("oom 0\n\noom_kill 1\n", "memory.events"); }),
            "memory.events line 2: expected 'name value', got ''");
  EXPECT_EQ(error_of([] { parse_counters("oom -1\n", "memory.events"); }),
            "memory.events line 1: expected 'name value', got 'oom -1'");
  EXPECT_EQ(error_of([] { parse_counters("oom 1\noom 2\n", "memory.events"); }),
            "memory.events line 2: 'oom' appears twice");
}

TEST(MemoryParsers, Meminfo) {
  const auto m = parse_meminfo(
      "MemTotal:       24731184 kB\n"
      "MemFree:        17167452 kB\n"
      "MemAvailable:   23203552 kB\n"
      "Active(anon):     123456 kB\n"
      "HugePages_Total:       0\n"
      "Hugepagesize:       2048 kB\n",
      "/proc/meminfo");
  EXPECT_EQ(m.at("MemTotal"), 24731184LL * 1024);
  EXPECT_EQ(m.at("MemAvailable"), 23203552LL * 1024);
  EXPECT_EQ(m.at("Active(anon)"), 123456LL * 1024);
  EXPECT_EQ(m.at("HugePages_Total"), 0);
  EXPECT_EQ(error_of([] { parse_meminfo("MemTotal:  1 kB\nMemFree 2 kB\n", "/proc/meminfo"); }),
            "/proc/meminfo line 2: expected 'Name: value [kB]', got 'MemFree 2 kB'");
  EXPECT_EQ(error_of([] { parse_meminfo("MemTotal:  1 MB\n", "/proc/meminfo"); }),
            "/proc/meminfo line 1: expected 'Name: value [kB]', got 'MemTotal:  1 MB'");
  EXPECT_EQ(
      error_of([] { parse_meminfo("MemTotal: 9223372036854775807 kB\n", "/proc/meminfo"); }),
      "/proc/meminfo line 1: expected 'Name: value [kB]', got 'MemTotal: 9223372036854775807 kB'");
  EXPECT_EQ(error_of([] { parse_meminfo("MemTotal: 1 kB\nMemTotal: 2 kB\n", "/proc/meminfo"); }),
            "/proc/meminfo line 2: 'MemTotal' appears twice");
}

TEST(MemoryParsers, Pressure) {
  const Pressure calm = parse_pressure(kCalmPressure, "memory.pressure");
  EXPECT_EQ(calm.some.avg10, 0);
  EXPECT_EQ(calm.full.total, 0);
  const Pressure p = parse_pressure(
      "some avg10=12.53 avg60=4.40 avg300=0.95 total=81234567\n"
      "full avg10=3.10 avg60=1.00 avg300=0.20 total=2345678\n",
      "/proc/pressure/memory");
  EXPECT_DOUBLE_EQ(p.some.avg10, 12.53);
  EXPECT_DOUBLE_EQ(p.some.avg60, 4.40);
  EXPECT_DOUBLE_EQ(p.some.avg300, 0.95);
  EXPECT_EQ(p.some.total, 81234567);
  EXPECT_DOUBLE_EQ(p.full.avg10, 3.10);
  EXPECT_EQ(p.full.total, 2345678);

  EXPECT_EQ(error_of([] {
              parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", "memory.pressure");
            }),
            "memory.pressure line 2: expected 'full avg10=N avg60=N avg300=N total=N', got ''");
  EXPECT_EQ(error_of([] {
              parse_pressure("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", "memory.pressure");
            }),
            "memory.pressure line 1: expected 'some avg10=N avg60=N avg300=N total=N', got 'full "
            "avg10=0.00 "
            "avg60=0.00 avg300=0.00 total=0'");
  EXPECT_EQ(error_of([] {
              parse_pressure(
                  "some avg60=0.00 avg10=0.00 avg300=0.00 total=0\nfull avg10=0 avg60=0 avg300=0 "
                  "total=0\n",
                  "memory.pressure");
            }),
            "memory.pressure line 1: expected 'some avg10=N avg60=N avg300=N total=N', got 'some "
            "avg60=0.00 "
            "avg10=0.00 avg300=0.00 total=0'");
  EXPECT_EQ(
      error_of([] {
        parse_pressure(
            "some avg10=nan avg60=0 avg300=0 total=0\nfull avg10=0 avg60=0 avg300=0 total=0\n",
            "memory.pressure");
      }),
      "memory.pressure line 1: expected 'some avg10=N avg60=N avg300=N total=N', got 'some "
      "avg10=nan "
      "avg60=0 avg300=0 total=0'");
  EXPECT_EQ(
      error_of([] {
        parse_pressure(
            "some avg10=0 avg60=0 avg300=0 total=0\nfull avg10=0 avg60=0 avg300=0 total=1.5\n",
            "memory.pressure");
      }),
      "memory.pressure line 2: expected 'full avg10=N avg60=N avg300=N total=N', got 'full avg10=0 "
      "avg60=0 avg300=0 total=1.5'");
  EXPECT_EQ(
      error_of([] { parse_pressure(std::string(kCalmPressure) + "more\n", "memory.pressure"); }),
      "memory.pressure line 3: unexpected line 'more'");
}

TEST(MemorySources, FileSourceReadsWhatTheTestWrites) {
  const fs::path dir = test_dir("files");
  write(dir / "memory.max", "1073741824\n");
  write(dir / "memory.current", "805306368\n");
  auto source = file_memory_source(dir);
  MemoryReading r = source->read();
  EXPECT_EQ(r.source, "files " + dir.string());
  EXPECT_EQ(r.limit_bytes, 1 << 30);
  EXPECT_EQ(r.used_bytes, 768 << 20);
  EXPECT_EQ(r.available_bytes, 256 << 20);
  EXPECT_DOUBLE_EQ(r.headroom(), 0.25);
  EXPECT_EQ(r.pressure_some_avg10, 0);
  EXPECT_EQ(r.oom_kills, 0);
  EXPECT_EQ(describe(r),
            "files " + dir.string() +
                ": limit 1024.0 MiB, used 768.0 MiB, available 256.0 MiB (25.0%), psi some 0.00 "
                "full 0.00, oom kills 0");

  // Inactive page cache does not count as used; pressure and OOM kills come from their files.
  write(dir / "memory.max", "536870912\n");
  write(dir / "memory.stat",
        "anon 300000000\nfile 200000000\ninactive_file 100663296\nactive_file 0\n");
  write(dir / "memory.events", "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n");
  write(dir / "memory.pressure",
        "some avg10=11.50 avg60=3.00 avg300=1.00 total=900\nfull avg10=2.25 avg60=1.00 avg300=0.50 "
        "total=300\n");
  r = source->read();
  EXPECT_EQ(r.limit_bytes, 512 << 20);
  EXPECT_EQ(r.used_bytes,
            672 << 20);  // usage above the limit (it was just lowered): nothing available
  EXPECT_EQ(r.available_bytes, 0);
  write(dir / "memory.current", "402653184\n");
  r = source->read();
  EXPECT_EQ(r.used_bytes, 288 << 20);
  EXPECT_EQ(r.available_bytes, 224 << 20);
  EXPECT_EQ(r.pressure_some_avg10, 11.5);
  EXPECT_EQ(r.pressure_full_avg10, 2.25);
  EXPECT_EQ(r.oom_kills, 1);

  write(dir / "memory.max", "max\n");
  r = source->read();
  EXPECT_EQ(r.limit_bytes, -1);
  EXPECT_EQ(r.available_bytes, -1);
  EXPECT_EQ(r.headroom(), 1.0);
  EXPECT_EQ(describe(r), "files " + dir.string() +
                             ": limit unlimited, used 288.0 MiB, psi some 11.50 full 2.25, "
                             "oom kills 1");

  write(dir / "memory.events", "oom_kill one\n");
  EXPECT_EQ(
      error_of([&] { source->read(); }),
      (dir / "memory.events").string() + " line 1: expected 'name value', got 'oom_kill one'");
  fs::remove(dir / "memory.current");
  EXPECT_EQ(error_of([&] { source->read(); }, ErrorCode::not_found),
            "memory source: cannot read " + (dir / "memory.current").string());
  fs::remove(dir / "memory.max");
  EXPECT_EQ(error_of([&] { source->read(); }, ErrorCode::not_found),
            "memory source: cannot read " + (dir / "memory.max").string());
}

// A fake machine: /proc files and cgroup mounts under `root`.
void write_proc(const fs::path& root, const std::string& cgroup, const std::string& mountinfo) {
  write(root / "proc/self/cgroup", cgroup);
  write(root / "proc/self/mountinfo", mountinfo);
  write(root / "proc/meminfo",
        "MemTotal:        8388608 kB\nMemFree:         1048576 kB\nMemAvailable:    6291456 kB\n");
  write(root / "proc/pressure/memory",
        "some avg10=0.50 avg60=0.00 avg300=0.00 total=10\nfull avg10=0.25 avg60=0.00 avg300=0.00 "
        "total=5\n");
  write(root / "proc/vmstat", "nr_free_pages 262144\noom_kill 9\n");
}

const char* kV2Mounts =
    "24 1 0:22 / /proc rw,nosuid - proc proc rw\n"
    "25 1 0:23 / /mnt/my\\040disk rw - tmpfs  rw\n"  // a mount without a source name
    "31 23 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate\n";

TEST(MemorySources, SystemSourcePicksTheTightestCgroupV2Limit) {
  const fs::path root = test_dir("v2");
  write_proc(root, "0::/app.slice/slim.service\n", kV2Mounts);
  const fs::path slice = root / "sys/fs/cgroup/app.slice", own = slice / "slim.service";
  write(slice / "memory.max", "3221225472\n");  // 3 GiB, 2.5 GiB used: 512 MiB left
  write(slice / "memory.current", "2684354560\n");
  write(own / "memory.max",
        "2147483648\n");  // 2 GiB, 1 GiB used (+ 256 MiB inactive cache): 1 GiB left
  write(own / "memory.current", "1342177280\n");
  write(own / "memory.stat", "anon 1073741824\ninactive_file 268435456\n");
  write(own / "memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\noom_group_kill 0\n");
  write(own / "memory.pressure",
        "some avg10=4.00 avg60=0 avg300=0 total=1\nfull avg10=1.00 avg60=0 avg300=0 total=1\n");
  auto source = system_memory_source(root);
  MemoryReading r = source->read();
  EXPECT_EQ(r.source, "cgroup2 " + slice.string());
  EXPECT_EQ(r.limit_bytes, 3LL << 30);
  EXPECT_EQ(r.available_bytes, 512 << 20);
  EXPECT_EQ(r.pressure_some_avg10, 4.0);  // the process's own cgroup's pressure and OOM kills
  EXPECT_EQ(r.oom_kills, 2);

  // The limits are read anew each time: the slice lifted, the service's own counts.
  write(slice / "memory.max", "max\n");
  r = source->read();
  EXPECT_EQ(r.source, "cgroup2 " + own.string());
  EXPECT_EQ(r.limit_bytes, 2LL << 30);
  EXPECT_EQ(r.used_bytes, 1LL << 30);
  EXPECT_EQ(r.available_bytes, 1LL << 30);

  // No limit below the machine's memory: meminfo.
  write(own / "memory.max", "17179869184\n");
  r = source->read();
  EXPECT_EQ(r.source, "meminfo");
  EXPECT_EQ(r.limit_bytes, 8LL << 30);
  EXPECT_EQ(r.available_bytes, 6LL << 30);
  EXPECT_EQ(r.used_bytes, 2LL << 30);
  EXPECT_DOUBLE_EQ(r.headroom(), 0.75);

  write(own / "memory.max", "2G\n");
  EXPECT_EQ(error_of([&] { source->read(); }),
            (own / "memory.max").string() + " line 1: expected a byte count or 'max', got '2G'");
}

TEST(MemorySources, SystemSourceInAContainerSeesItsPartOfTheHierarchy) {
  // Without a cgroup namespace the mount shows the container's part from /docker/abc.
  const fs::path root = test_dir("container");
  write_proc(root, "0::/docker/abc\n",
             "31 23 0:27 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n");
  write(root / "sys/fs/cgroup/memory.max", "1073741824\n");
  write(root / "sys/fs/cgroup/memory.current", "536870912\n");
  const MemoryReading r = system_memory_source(root)->read();
  EXPECT_EQ(r.source, "cgroup2 " + (root / "sys/fs/cgroup").string());
  EXPECT_EQ(r.available_bytes, 512 << 20);
  EXPECT_EQ(r.pressure_some_avg10, 0.5);  // no memory.pressure there: the machine's
  EXPECT_EQ(r.oom_kills, 9);              // no memory.events: the machine's count
}

TEST(MemorySources, SystemSourceReadsCgroupV1WhereTheMemoryControllerIsThere) {
  // A hybrid machine: cgroup2 mounted without controllers, memory on cgroup v1.
  const fs::path root = test_dir("v1");
  write_proc(root, "4:memory:/jobs/42\n1:cpu,cpuacct:/\n0::/\n",
             "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
             "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
  fs::create_directories(root / "sys/fs/cgroup/unified");
  const fs::path mem = root / "sys/fs/cgroup/memory", job = mem / "jobs/42";
  write(mem / "memory.limit_in_bytes", "9223372036854771712\n");  // v1's "unlimited"
  write(mem / "memory.usage_in_bytes", "4294967296\n");
  write(mem / "jobs/memory.limit_in_bytes", "9223372036854771712\n");
  write(mem / "jobs/memory.usage_in_bytes", "1073741824\n");
  write(job / "memory.limit_in_bytes", "268435456\n");
  write(job / "memory.usage_in_bytes", "201326592\n");
  write(job / "memory.stat", "cache 0\ninactive_file 0\ntotal_inactive_file 33554432\n");
  write(job / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
  auto source = system_memory_source(root);
  MemoryReading r = source->read();
  EXPECT_EQ(r.source, "cgroup1 " + job.string());
  EXPECT_EQ(r.limit_bytes, 256 << 20);
  EXPECT_EQ(r.used_bytes, 160 << 20);
  EXPECT_EQ(r.available_bytes, 96 << 20);
  EXPECT_EQ(r.pressure_some_avg10, 0.5);  // v1 keeps no pressure per cgroup
  EXPECT_EQ(r.oom_kills, 3);

  write(job / "memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(source->read().source, "meminfo");
}

TEST(MemorySources, SystemSourceErrorsNameTheFile) {
  const fs::path root = test_dir("broken");
  write_proc(root, "0::/\n", "31 23 0:27 / /sys/fs/cgroup rw - cgroup2\n");
  EXPECT_EQ(error_of([&] { system_memory_source(root); }),
            (root / "proc/self/mountinfo").string() +
                " line 1: expected a mount line, got '31 23 0:27 / /sys/fs/cgroup rw - cgroup2'");
  write_proc(root, "0:/\n", kV2Mounts);
  EXPECT_EQ(
      error_of([&] { system_memory_source(root); }),
      (root / "proc/self/cgroup").string() + " line 1: expected 'ID:CONTROLLERS:PATH', got '0:/'");
  write_proc(root, "0::/\n", kV2Mounts);
  write(root / "proc/meminfo", "MemTotal: 1024 kB\n");
  EXPECT_EQ(error_of([&] { system_memory_source(root)->read(); }),
            (root / "proc/meminfo").string() + ": no MemAvailable line");
  fs::remove(root / "proc/meminfo");
  EXPECT_EQ(error_of([&] { system_memory_source(root)->read(); }, ErrorCode::not_found),
            "memory source: cannot read " + (root / "proc/meminfo").string());
}

TEST(MemorySources, ThisMachine) {
  const MemoryReading r = system_memory_source()->read();
  std::cout << describe(r) << "\n";
  EXPECT_TRUE(r.source == "meminfo" || r.source.rfind("cgroup2 /", 0) == 0 ||
              r.source.rfind("cgroup1 /", 0) == 0)
      << r.source;
  EXPECT_GT(r.limit_bytes, 0);
  EXPECT_GE(r.available_bytes, 0);
  EXPECT_LE(r.available_bytes, r.limit_bytes);
  EXPECT_GE(r.pressure_some_avg10, 0);
  EXPECT_GE(r.oom_kills, 0);
}

MemoryReading reading(int64_t limit, int64_t available, double psi = 0) {
  MemoryReading r;
  r.source = "test";
  r.limit_bytes = limit;
  r.available_bytes = available;
  r.used_bytes = limit - available;
  r.pressure_some_avg10 = psi;
  return r;
}

const VariantController::Clock::time_point t0{};

std::string str(const std::optional<VariantSwitch>& s) {
  return s ? s->model + " " + std::to_string(s->from) + "->" + std::to_string(s->to) + ": " +
                 s->reason
           : "none";
}

TEST(VariantController, ShrinkingLimitStepsDownOneModelAtATime) {
  // Two models whose resident sizes are all the server uses; the limit shrinks by 40
  // bytes a second and each switch is applied at once. The model whose step frees the
  // most goes first unless it is within its dwell (30 s).
  VariantController c;
  const std::vector<int64_t> llm = {1000, 500, 100}, digits = {400, 100};
  c.set_model("llm", llm, 0);
  c.set_model("digits", digits, 0);
  std::vector<std::string> log;
  for (int s = 0; s <= 44; ++s) {
    const int64_t limit = 2000 - 40 * s, used = llm[c.current("llm")] + digits[c.current("digits")];
    const auto now = t0 + std::chrono::seconds(s);
    if (const auto sw = c.decide(reading(limit, std::max<int64_t>(0, limit - used)), now)) {
      log.push_back(std::to_string(s) + "s " + str(sw));
      c.applied(sw->model, sw->to, now);
    }
  }
  EXPECT_EQ(log,
            (std::vector<std::string>{
                "9s llm 0->1: headroom 14.6% below 15.0%; the smaller variant frees 500 bytes",
                // llm's next step would free more, but it switched 15 s ago
                "24s digits 0->1: headroom 13.5% below 15.0%; the smaller variant frees 300 bytes",
                // short again from 33 s on; llm waits out its dwell
                "39s llm 1->2: headroom 0.0% below 15.0%; the smaller variant frees 400 bytes",
            }));
}

TEST(VariantController, NoFlappingBetweenTheThresholds) {
  VariantController c;
  c.set_model("m", {400, 200}, 1);
  // Headroom swinging between 16% and 34% for ten minutes: nothing to do.
  for (int s = 0; s < 600; ++s)
    EXPECT_EQ(str(c.decide(reading(1000, s % 2 ? 160 : 340), t0 + std::chrono::seconds(s))), "none")
        << s;
  // Swinging across both thresholds every 3 s: a switch at most once per dwell (30 s), at
  // the first second after it when memory is on the other side (up at 0 s, down at 33 s...).
  std::vector<int> at;
  for (int s = 0; s < 120; ++s) {
    const auto now = t0 + std::chrono::seconds(s);
    const int64_t available = ((s / 3) % 2 ? 100 : 900) - (c.current("m") == 0 ? 200 : 0);
    if (const auto sw = c.decide(reading(1000, std::max<int64_t>(0, available)), now)) {
      at.push_back(s);
      c.applied(sw->model, sw->to, now);
    }
  }
  EXPECT_EQ(at, (std::vector<int>{0, 33, 66, 99}));
}

TEST(VariantController, StepsUpOnlyWhenHeadroomStaysAboveHigh) {
  VariantController c;
  c.set_model("m", {400, 200}, 0);
  c.applied("m", 1, t0);
  const auto later = t0 + 60s;
  EXPECT_EQ(str(c.decide(reading(1000, 500), later)),
            "none");  // 50%, but 30% with the 200 bytes back
  EXPECT_EQ(str(c.decide(reading(1000, 550), later)), "none");     // 35% after: not above
  EXPECT_EQ(str(c.decide(reading(1000, 560), t0 + 29s)), "none");  // within its dwell
  EXPECT_EQ(str(c.decide(reading(1000, 560, 1.5), later)),
            "none");  // the kernel still stalls on memory
  EXPECT_EQ(str(c.decide(reading(1000, 560, 1.0), later)),
            "m 1->0: headroom 56.0% above 35.0%, 36.0% with the larger variant's 200 more bytes");
  // Without a limit (a file source reading "max") only pressure holds a model down.
  MemoryReading unlimited = reading(-1, -1);
  EXPECT_EQ(str(c.decide(unlimited, later)),
            "m 1->0: headroom 100.0% above 35.0%, 100.0% with the larger variant's 200 more bytes");
  // The cheapest step up goes first.
  c.set_model("big", {1000, 100}, 1);
  EXPECT_EQ(c.decide(reading(1000, 900), later)->model, "m");
  EXPECT_EQ(c.decide(reading(1000, 900), later)->to, 0u);
}

TEST(VariantController, LargestSavingFirstThenByNameAfterTheSettleTime) {
  VariantController c;
  c.set_model("c", {250, 50}, 0);
  c.set_model("b", {300, 100}, 0);
  c.set_model("a", {500, 300, 50}, 0);
  c.set_model("small", {60, 50}, 0);
  const MemoryReading short_ = reading(1000, 100);
  EXPECT_EQ(str(c.decide(short_, t0)),
            "a 0->1: headroom 10.0% below 15.0%; the smaller variant frees 200 bytes");
  c.applied("a", 1, t0);
  EXPECT_EQ(str(c.decide(short_, t0 + 4s)),
            "none");  // settling: the next reading shows what a's switch freed
  EXPECT_EQ(c.decide(short_, t0 + 5s)->model,
            "b");  // a (250) waits its dwell; b and c free 200, b first
  c.applied("b", 1, t0 + 5s);
  EXPECT_EQ(c.decide(short_, t0 + 10s)->model, "c");
  c.applied("c", 1, t0 + 10s);
  EXPECT_EQ(c.decide(short_, t0 + 15s)->model, "small");
  c.applied("small", 1, t0 + 15s);
  EXPECT_EQ(str(c.decide(short_, t0 + 20s)), "none");
  EXPECT_EQ(str(c.decide(short_, t0 + 30s)),
            "a 1->2: headroom 10.0% below 15.0%; the smaller variant frees 250 bytes");
  c.applied("a", 2, t0 + 30s);
  EXPECT_EQ(str(c.decide(short_, t0 + 100s)), "none");  // every model at its smallest
}

TEST(VariantController, PressureAloneStepsDown) {
  VariantController c;
  c.set_model("m", {400, 200}, 0);
  EXPECT_EQ(str(c.decide(reading(1000, 800, 10.0), t0)), "none");  // at the threshold: not above
  EXPECT_EQ(str(c.decide(reading(1000, 800, 12.5), t0)),
            "m 0->1: memory pressure 12.50 above 10.00 (PSI some avg10); the smaller variant frees "
            "200 bytes");
}

TEST(VariantController, RefusesBadInput) {
  VariantController c;
  EXPECT_EQ(
      error_of(
          [&] {
            c.set_model("m", {400, 400}, 0);
          },
          ErrorCode::invalid_argument),
      "variants of model 'm': variant 1 (400 bytes) is not smaller than variant 0 (400 bytes)");
  EXPECT_EQ(error_of(
                [&] {
                  c.set_model("m", {400, 0}, 0);
                },
                ErrorCode::invalid_argument),
            "variants of model 'm': variant 1 has size 0");
  EXPECT_EQ(error_of([&] { c.set_model("m", {}, 0); }, ErrorCode::invalid_argument),
            "variants of model 'm': none given");
  EXPECT_EQ(error_of(
                [&] {
                  c.set_model("m", {400, 200}, 2);
                },
                ErrorCode::invalid_argument),
            "variants of model 'm': current variant 2 of 2");
  EXPECT_EQ(error_of([&] { c.applied("x", 0, t0); }, ErrorCode::not_found),
            "variant controller: no model 'x'");
  c.set_model("m", {400, 200}, 0);
  EXPECT_EQ(error_of([&] { c.applied("m", 2, t0); }, ErrorCode::invalid_argument),
            "variant controller: model 'm' has no variant 2");
  c.remove_model("m");
  EXPECT_EQ(error_of([&] { c.current("m"); }, ErrorCode::not_found),
            "variant controller: no model 'm'");
  EXPECT_EQ(
      error_of([] { VariantController(VariantPolicy{.low_headroom = 0.4, .high_headroom = 0.3}); },
               ErrorCode::invalid_argument),
      "variant policy: needs 0 <= low headroom < high headroom <= 1");
}

TEST(VariantController, FirstLoadPicksTheLargestVariantThatFits) {
  const VariantController c;  // low headroom 15%
  const std::vector<int64_t> v = {500, 200, 100};
  EXPECT_EQ(c.initial(v, reading(1000, 900)), 0u);  // 40% left after 500
  EXPECT_EQ(c.initial(v, reading(1000, 650)), 0u);  // exactly 15% left
  EXPECT_EQ(c.initial(v, reading(1000, 649)), 1u);  // 14.9%: the next one
  EXPECT_EQ(c.initial(v, reading(1000, 350)), 1u);  // 15% left after 200
  EXPECT_EQ(c.initial(v, reading(1000, 200)), 2u);  // nothing fits: the smallest
  EXPECT_EQ(c.initial(v, reading(-1, 0)), 0u);      // no limit
}

}  // namespace
}  // namespace slim::serve
