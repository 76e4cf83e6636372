// The one thread pool that kernels share. parallel_for splits a range into chunks run
// by the workers and the calling thread; nested calls run inline so a kernel called
// from inside a parallel region never deadlocks or oversubscribes the machine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace slim {

// CPU time of one piece of work (a request, a benchmark run), summed over the threads that
// ran it: the thread that opened a CpuTimeScope on it (its thread CPU clock), and the pool
// workers while they run chunks of that thread's parallel_for calls (the steady clock over
// the chunks: a worker runs them without blocking, so that is its CPU time unless the OS
// takes the core away meanwhile, and it costs no system call, where a thread CPU clock
// read costs about a microsecond on a VM, twice per job per worker). Energy attribution
// splits a window's energy by these. Threads outside the pool (oneDNN's OpenMP team) are
// not seen.
class CpuTimeAccount {
 public:
  double seconds() const { return double(ns_.load(std::memory_order_relaxed)) * 1e-9; }
  void add_ns(int64_t ns) { ns_.fetch_add(ns, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> ns_{0};
};

// Charges the calling thread's CPU time from construction to destruction, and the pool
// work it hands out meanwhile, to `account`. Off (no cost to the pool) unless a scope is
// open; one scope per thread at a time (a nested one is an internal error).
class CpuTimeScope {
 public:
  explicit CpuTimeScope(CpuTimeAccount& account);
  ~CpuTimeScope();
  CpuTimeScope(const CpuTimeScope&) = delete;
  CpuTimeScope& operator=(const CpuTimeScope&) = delete;

 private:
  CpuTimeAccount& account_;
  int64_t start_ns_;
};

// CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID), in nanoseconds.
int64_t thread_cpu_ns();

class ThreadPool {
 public:
  // num_threads counts the calling thread: a pool of 1 runs everything inline. With
  // spin_us > 0 an idle worker polls for the next job that long before it sleeps, and the
  // caller polls for the last chunk before it sleeps: for callers that issue many short
  // parallel_for calls back to back (a language model's decode step), where waking
  // sleeping threads would cost more than the work.
  explicit ThreadPool(int num_threads, int spin_us = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain` items. Returns when
  // every chunk is done; rethrows the first exception a chunk threw.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                    int64_t grain = 1);

 private:
  void worker_loop();
  // Runs the posted job's unclaimed chunks until none is left (lock holds mu_ on entry
  // and on return); the one that finishes the last chunk wakes the waiting caller. A
  // worker charges its CPU time to the job's account (the caller's own is in its scope).
  void run_chunks(std::unique_lock<std::mutex>& lock, bool worker);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  CpuTimeAccount* job_account_ = nullptr;  // the caller's open CpuTimeScope, if any
  int64_t job_n_ = 0, job_chunk_ = 0, next_chunk_ = 0, num_chunks_ = 0, chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  // Copies of generation_ (bumped on stop too) and chunks_done_ that spinning threads
  // poll without the lock.
  std::atomic<uint64_t> posted_{0};
  std::atomic<int64_t> done_{0};
  int spin_us_ = 0;
  std::exception_ptr error_;
  std::mutex run_mu_;  // one parallel_for at a time per pool
};

// Hands out the items [0, n) to `slots` slots (one per thread of a parallel_for over
// slots) with balance and without a lock: each slot starts with a contiguous share and
// claims its items one at a time from the front (one atomic add on its own cache line);
// a slot whose share is used up takes the back half of the largest share left with two
// or more items (a last item is not worth the two cache-line transfers). A thread
// that starts late or runs slower (on a shared VM one vCPU can lose half its speed for a
// while) thus hands its work to the others. Every item is claimed exactly once; which
// slot claims it varies from run to run. Reusable: reset() before each parallel_for.
class WorkSplit {
 public:
  explicit WorkSplit(int slots);
  void reset(int64_t n);  // n < 2^31 (else throws); not concurrently with next()
  // The next item for `slot`: returns false when no slot has any left.
  bool next(int slot, int64_t* item);

 private:
  struct alignas(64) Share {
    std::atomic<uint64_t> v{0};  // low 32 bits: next item, high 32 bits: end of the share
  };
  int slots_;
  std::unique_ptr<Share[]> share_;
};

// The process-wide pool. Its size is set by set_num_threads() (default: hardware threads).
ThreadPool& default_thread_pool();
void set_num_threads(int n);  // n <= 0 means the number of hardware threads
int num_threads();

}  // namespace slim
