#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "slim/core/error.h"
#include "slim/core/thread_pool.h"

using namespace slim;

namespace {

// Each chunk waits until every chunk has started (so each runs on its own thread), then
// burns CPU until its thread has used `ns` of CPU time.
void run_on_every_thread(ThreadPool& pool, int64_t ns) {
  std::atomic<int> started{0};
  const int n = pool.num_threads();
  pool.parallel_for(n, [&](int64_t, int64_t) {
    started.fetch_add(1);
    while (started.load() < n) {
    }
    const int64_t until = thread_cpu_ns() + ns;
    while (thread_cpu_ns() < until) {
    }
  });
}

}  // namespace

TEST(CpuTimeAccount, ChargesTheCallerAndThePoolWorkersOfItsJobs) {
  ThreadPool pool(3);
  CpuTimeAccount account;
  int64_t caller_ns = 0;
  const auto w0 = std::chrono::steady_clock::now();
  {
    CpuTimeScope scope(account);
    const int64_t t0 = thread_cpu_ns();
    run_on_every_thread(pool, 20'000'000);
    caller_ns = thread_cpu_ns() - t0;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  // Two workers each ran a chunk of at least 20 ms of CPU time on top of the caller's own;
  // a worker is charged the steady-clock time of its chunks, at most the whole span.
  EXPECT_GE(account.seconds(), (double(caller_ns) + 2 * 20e6) * 1e-9);
  EXPECT_LE(account.seconds(), double(caller_ns) * 1e-9 + 2 * wall);
}

TEST(CpuTimeAccount, PoolWorkIsNotChargedWithoutAnOpenScope) {
  ThreadPool pool(2);
  CpuTimeAccount account;
  { CpuTimeScope scope(account); }
  const double before = account.seconds();
  run_on_every_thread(pool, 5'000'000);
  EXPECT_EQ(account.seconds(), before);
}

TEST(CpuTimeAccount, OneScopePerThread) {
  CpuTimeAccount a, b;
  CpuTimeScope scope(a);
  try {
    CpuTimeScope inner(b);
    FAIL() << "a nested scope opened";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::internal);
    EXPECT_STREQ(e.what(), "CpuTimeScope: a scope is already open on this thread");
  }
}
