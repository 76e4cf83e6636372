// slim forest vs XGBoost's own C API, same models, same rows, same run.
// XGBoost side: XGBoosterPredictFromDense (in-place dense prediction, no DMatrix per
// call), nthread set per configuration. slim side: CompiledForest::predict over a pool of
// the same size, and predict_row for single rows.
//
// usage: vs_xgboost [--isa scalar|avx2|avx512] [--large-batch-only] MODEL.json [MODEL.json ...]
// --isa lowers slim's kernel set (as SLIM_ISA does); XGBoost's predictor has no
// AVX-512 or AVX2 path of its own (scalar C++ tree walks over OpenMP threads), so it runs
// the same code whatever the flag. --large-batch-only times only batch 10,000.
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

#include "slim/core/cpu_features.h"
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

// Rows per second of XGBoost and slim, measured in alternating rounds: each round times
// XGBoost's fn over >= 20 ms, then slim's. The ratio is the median of the rounds' own
// ratios, so a change in the machine's speed during the run (the development machine is
// a shared VM whose speed drifts by up to 2x within a minute) hits both sides of a ratio
// alike. Rates are medians by wall clock and per CPU-second of the whole process; with
// one thread the CPU number excludes time other processes held the cores, with two it
// sums both threads (and XGBoost's OpenMP workers spin while waiting).
struct Rates {
  double xgb_wall, slim_wall, ratio_wall, xgb_cpu, slim_cpu, ratio_cpu;
};
template <typename Fx, typename Fs>
static Rates rows_per_second(int64_t rows, Fx&& fx, Fs&& fs, double budget_s = 1.2) {
  auto one = [&](auto& fn, double& wall, double& cpu) {
    const auto a = clock_type::now();
    const double c = cpu_seconds();
    int reps = 0;
    do {
      fn();
      ++reps;
    } while (seconds_since(a) < 0.02);
    wall = double(rows) * reps / seconds_since(a);
    cpu = double(rows) * reps / std::max(1e-9, cpu_seconds() - c);
  };
  std::vector<double> xw, xc, sw, sc, rw, rc;
  const auto end = clock_type::now() + std::chrono::duration<double>(budget_s);
  while (clock_type::now() < end || xw.size() < 9) {
    double a, b, c, d;
    one(fx, a, b);
    one(fs, c, d);
    xw.push_back(a), xc.push_back(b), sw.push_back(c), sc.push_back(d);
    rw.push_back(c / a), rc.push_back(d / b);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(xw), median(sw), median(rw), median(xc), median(sc), median(rc)};
}

struct Latency {
  double p50, p99;
};
// Single-row latencies of both engines, in alternating blocks of 500 calls (for the same
// reason as above).
template <typename Fx, typename Fs>
static std::pair<Latency, Latency> latency_us(int64_t calls, Fx&& fx, Fs&& fs) {
  std::vector<double> lx, ls;
  auto block = [](auto& fn, int64_t i0, int64_t n, std::vector<double>& lat) {
    for (int64_t i = i0; i < i0 + n; ++i) {
      const auto a = clock_type::now();
      fn(i);
      lat.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - a).count());
    }
  };
  for (int64_t i = 0; i < calls; i += 500) {
    block(fx, i, std::min<int64_t>(500, calls - i), lx);
    block(fs, i, std::min<int64_t>(500, calls - i), ls);
  }
  auto pct = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return Latency{v[v.size() / 2], v[v.size() * 99 / 100]};
  };
  return {pct(lx), pct(ls)};
}

static std::string array_interface(const float* data, int64_t rows, int64_t cols) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "{\"data\": [%llu, true], \"shape\": [%lld, %lld], \"typestr\": \"<f4\", \"version\": 3}",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(data)),
                static_cast<long long>(rows), static_cast<long long>(cols));
  return buf;
}

static bool g_large_batch_only = false;

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
      if (g_large_batch_only && batch != 10000) continue;
      const std::string ai = array_interface(x.data(), batch, F);
      std::vector<float> out(size_t(batch) * cf.num_groups());
      const Rates r = rows_per_second(
          batch,
          [&] {
            const bst_ulong* shape;
            bst_ulong dim;
            const float* res;
            XGBoosterPredictFromDense(booster, ai.c_str(), config, nullptr, &shape, &dim, &res);
          },
          [&] {
            if (batch == 1) cf.predict_row(x.data(), out.data());
            else cf.predict(x.data(), batch, out.data(), false, &pool);
          });
      std::printf("  %-6lld %-7d | %14.0f %14.0f %6.1fx | %14.0f %14.0f %6.1fx\n", static_cast<long long>(batch),
                  threads, r.xgb_wall, r.slim_wall, r.ratio_wall, r.xgb_cpu, r.slim_cpu, r.ratio_cpu);
    }
  }
  if (g_large_batch_only) {
    XGBoosterFree(booster);
    return;
  }
  XGB_CHECK(XGBoosterSetParam(booster, "nthread", "1"));
  const int64_t calls = 20000;
  std::vector<std::string> ais;
  for (int64_t i = 0; i < 1000; ++i) ais.push_back(array_interface(x.data() + i * F, 1, F));
  float o[64];
  const auto [lx, ls] = latency_us(
      calls,
      [&](int64_t i) {
        const bst_ulong* shape;
        bst_ulong dim;
        const float* res;
        XGBoosterPredictFromDense(booster, ais[size_t(i % 1000)].c_str(), config, nullptr, &shape, &dim, &res);
      },
      [&](int64_t i) { cf.predict_row(x.data() + (i % 1000) * F, o); });
  std::printf("  single row (1 thread, %lld calls): xgboost p50 %.2f us p99 %.2f us | slim p50 %.2f us p99 %.2f us"
              " | p50 ratio %.1fx\n",
              static_cast<long long>(calls), lx.p50, lx.p99, ls.p50, ls.p99, lx.p50 / ls.p50);
  XGBoosterFree(booster);
}

int main(int argc, char** argv) {
  std::vector<std::string> models;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--isa" && i + 1 < argc) slim::set_isa_limit(argv[++i]);
      else if (a == "--large-batch-only") g_large_batch_only = true;
      else models.push_back(a);
    }
    if (models.empty()) {
      std::fprintf(stderr, "usage: %s [--isa %s] [--large-batch-only] MODEL.json [MODEL.json ...]\n", argv[0],
                   slim::isa_names().c_str());
      return 2;
    }
    std::printf("slim ISA: %s (walk: %s; CPU: %s)\n", slim::isa_name(slim::active_isa()),
                simd_level_name(detected_simd_level()), slim::isa_name(slim::hardware_isa()));
    std::printf("XGBoost: its own predictor (scalar C++ tree walks, OpenMP threads); it has no AVX2 or AVX-512"
                " path, so it runs the same code whatever slim's ISA\n");
    for (const auto& m : models)
      for (bool ranked : {false, true}) bench_model(m, ranked);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
