#include <gtest/gtest.h>
#include <time.h>

#include <atomic>

#include "slim/core/error.h"
#include "slim/core/thread_pool.h"

using namespace slim;

namespace {

int64_t process_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

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
  const int64_t process0 = process_cpu_ns();
  int64_t caller_ns = 0;
  {
    CpuTimeScope scope(account);
    const int64_t t0 = thread_cpu_ns();
    run_on_every_thread(pool, 20'000'000);
    caller_ns = thread_cpu_ns() - t0;
  }
  const int64_t process_ns = process_cpu_ns() - process0;
  // Two workers each ran a chunk of at least 20 ms of CPU time on top of the caller's own.
  EXPECT_GE(account.seconds(), (double(caller_ns) + 2 * 20e6) * 1e-9);
  EXPECT_LE(account.seconds(), double(process_ns) * 1e-9);
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
