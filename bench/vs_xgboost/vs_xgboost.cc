// slim forest vs XGBoost's own C API, same models, same rows, same run.
// XGBoost side: XGBoosterPredictFromDense (in-place dense prediction, no DMatrix per
// call), nthread set per configuration. slim side: CompiledForest::predict over a pool of
// the same size, and predict_row for single rows.
//
// usage: vs_xgboost MODEL.json [MODEL.json ...]
#include <xgboost/c_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <ctime>
#include <string>
#include <vector>

#include "slim/core/thread_pool.h"
#include "slim/forest/compiled_forest.h"
#include "slim/forest/slimf.h"

using clock_type = std::chrono::steady_clock;
using namespace slim::forest;

#define XGB_CHECK(call)                                                     \
  do {                                                                      \
    if ((call) != 0) {                                                      \
      std::fprintf(stderr, "xgboost: %s: %s\n", #call, XGBGetLastError()); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

static double seconds_since(clock_type::time_point a) {
  return std::chrono::duration<double>(clock_type::now() - a).count();
}

static double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Rows per second of repeated runs of fn(), each run timed over >= 20 ms: the median by
// wall clock, and the median per CPU-second of the whole process. On a shared machine the
// wall clock includes time other processes held the cores; CPU time does not, and with
// one thread it is the fairer number (with two it sums both threads).
struct Rate {
  double wall, cpu;
};
template <typename Fn>
static Rate rows_per_second(int64_t rows, Fn&& fn, double budget_s = 0.6) {
  std::vector<double> wall, cpu;
  const auto end = clock_type::now() + std::chrono::duration<double>(budget_s);
  while (clock_type::now() < end || wall.size() < 7) {
    const auto a = clock_type::now();
    const double c = cpu_seconds();
    int reps = 0;
    do {
      fn();
      ++reps;
    } while (seconds_since(a) < 0.02);
    wall.push_back(double(rows) * reps / seconds_since(a));
    cpu.push_back(double(rows) * reps / std::max(1e-9, cpu_seconds() - c));
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

struct Latency {
  double p50, p99;
};
template <typename Fn>
static Latency latency_us(int64_t calls, Fn&& fn) {
  std::vector<double> lat(static_cast<size_t>(calls));
  for (int64_t i = 0; i < calls; ++i) {
    const auto a = clock_type::now();
    fn(i);
    lat[size_t(i)] = std::chrono::duration<double, std::micro>(clock_type::now() - a).count();
  }
  std::sort(lat.begin(), lat.end());
  return {lat[lat.size() / 2], lat[lat.size() * 99 / 100]};
}

static std::string array_interface(const float* data, int64_t rows, int64_t cols) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "{\"data\": [%llu, true], \"shape\": [%lld, %lld], \"typestr\": \"<f4\", \"version\": 3}",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(data)),
                static_cast<long long>(rows), static_cast<long long>(cols));
  return buf;
}

static void bench_model(const std::string& path, bool ranked) {
  BoosterHandle booster;
  XGB_CHECK(XGBoosterCreate(nullptr, 0, &booster));
  XGB_CHECK(XGBoosterLoadModel(booster, path.c_str()));
  bst_ulong nf = 0;
  XGB_CHECK(XGBoosterGetNumFeature(booster, &nf));
  const int64_t F = int64_t(nf);

  CompiledForest cf = compile_forest(load_forest_source(path), ranked);
  const std::string slimf_path = path + (ranked ? ".ranked.slimf" : ".slimf");
  save_slimf(cf, slimf_path, SlimfEncoding::plain);
  std::vector<double> loads;
  for (int i = 0; i < 50; ++i) {
    const auto a = clock_type::now();
    CompiledForest back = load_slimf(slimf_path);
    loads.push_back(seconds_since(a) * 1e3);
  }
  std::sort(loads.begin(), loads.end());

  const int64_t kRows = 10000;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(size_t(kRows * F));
  for (auto& v : x) v = normal(rng);

  // Agreement check on all rows: XGBoost's transformed outputs vs slim's.
  const char* config = "{\"type\": 0, \"training\": false, \"iteration_begin\": 0, \"iteration_end\": 0, "
                       "\"strict_shape\": false, \"missing\": NaN, \"cache_id\": 0}";
  XGB_CHECK(XGBoosterSetParam(booster, "nthread", "1"));
  std::vector<float> slim_out(size_t(kRows) * cf.num_groups());
  cf.predict(x.data(), kRows, slim_out.data());
  {
    const bst_ulong* shape;
    bst_ulong dim;
    const float* res;
    const std::string ai = array_interface(x.data(), kRows, F);
    XGB_CHECK(XGBoosterPredictFromDense(booster, ai.c_str(), config, nullptr, &shape, &dim, &res));
    int64_t same = 0;
    for (int64_t i = 0; i < kRows; ++i) same += std::memcmp(&res[i], &slim_out[size_t(i)], 4) == 0;
    std::printf("\nmodel %s, %s layout (%d bytes per node): %u trees, %u nodes, max depth %u, %lld features\n",
                path.c_str(), ranked ? "ranked (lossless)" : "plain", cf.node_bytes(), cf.num_trees(),
                cf.num_nodes(), cf.max_depth(), static_cast<long long>(F));
    std::printf("  identical outputs: %lld / %lld rows\n", static_cast<long long>(same), static_cast<long long>(kRows));
    std::printf("  .slimf (plain encoding, %.1f KiB) load: median %.3f ms, min %.3f ms over %zu loads\n",
                double(cf.payload_size()) / 1024, loads[loads.size() / 2], loads[0], loads.size());
  }

  std::printf("  %-6s %-7s | %14s %14s %7s | %14s %14s %7s\n", "batch", "threads", "xgb rows/s", "slim rows/s",
              "ratio", "xgb rows/cpu-s", "slim rows/cpu-s", "ratio");
  for (int threads : {1, 2}) {
    XGB_CHECK(XGBoosterSetParam(booster, "nthread", std::to_string(threads).c_str()));
    slim::ThreadPool pool(threads);
    for (int64_t batch : {int64_t(1), int64_t(64), int64_t(10000)}) {
      const std::string ai = array_interface(x.data(), batch, F);
      std::vector<float> out(size_t(batch) * cf.num_groups());
      const Rate xgb = rows_per_second(batch, [&] {
        const bst_ulong* shape;
        bst_ulong dim;
        const float* res;
        XGBoosterPredictFromDense(booster, ai.c_str(), config, nullptr, &shape, &dim, &res);
      });
      const Rate sl = rows_per_second(batch, [&] {
        if (batch == 1) cf.predict_row(x.data(), out.data());
        else cf.predict(x.data(), batch, out.data(), false, &pool);
      });
      std::printf("  %-6lld %-7d | %14.0f %14.0f %6.1fx | %14.0f %14.0f %6.1fx\n", static_cast<long long>(batch),
                  threads, xgb.wall, sl.wall, sl.wall / xgb.wall, xgb.cpu, sl.cpu, sl.cpu / xgb.cpu);
    }
  }
  XGB_CHECK(XGBoosterSetParam(booster, "nthread", "1"));
  const int64_t calls = 20000;
  std::vector<std::string> ais;
  for (int64_t i = 0; i < 1000; ++i) ais.push_back(array_interface(x.data() + i * F, 1, F));
  const Latency lx = latency_us(calls, [&](int64_t i) {
    const bst_ulong* shape;
    bst_ulong dim;
    const float* res;
    XGBoosterPredictFromDense(booster, ais[size_t(i % 1000)].c_str(), config, nullptr, &shape, &dim, &res);
  });
  float o[64];
  const Latency ls = latency_us(calls, [&](int64_t i) { cf.predict_row(x.data() + (i % 1000) * F, o); });
  std::printf("  single row (1 thread, %lld calls): xgboost p50 %.2f us p99 %.2f us | slim p50 %.2f us p99 %.2f us"
              " | p50 ratio %.1fx\n",
              static_cast<long long>(calls), lx.p50, lx.p99, ls.p50, ls.p99, lx.p50 / ls.p50);
  XGBoosterFree(booster);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.json [MODEL.json ...]\n", argv[0]);
    return 2;
  }
  std::printf("slim simd level: %s\n", simd_level_name(detected_simd_level()));
  try {
    for (int i = 1; i < argc; ++i)
      for (bool ranked : {false, true}) bench_model(argv[i], ranked);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
