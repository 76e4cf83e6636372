#include "slim/core/thread_pool.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "slim/core/error.h"

namespace slim {

namespace {
thread_local bool t_in_parallel = false;
thread_local CpuTimeAccount* t_account = nullptr;

// Polls `done` (with a pause between polls) for up to `us` microseconds.
template <typename F>
void spin_until(F done, int us) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  for (int i = 1;; ++i) {
    if (done()) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= end) return;
  }
}
}  // namespace

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

CpuTimeScope::CpuTimeScope(CpuTimeAccount& account) : account_(account), start_ns_(thread_cpu_ns()) {
  if (t_account) throw Error(ErrorCode::internal, "CpuTimeScope: a scope is already open on this thread");
  t_account = &account;
}

CpuTimeScope::~CpuTimeScope() {
  t_account = nullptr;
  account_.add_ns(thread_cpu_ns() - start_ns_);
}

ThreadPool::ThreadPool(int num_threads, int spin_us) : spin_us_(std::max(0, spin_us)) {
  for (int i = 1; i < std::max(1, num_threads); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    posted_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!stop_ && !(generation_ != seen && next_chunk_ < num_chunks_)) {
      seen = generation_;  // nothing (left) to take: wait for the next job
      if (spin_us_ > 0) {
        lock.unlock();
        spin_until([&] { return posted_.load(std::memory_order_acquire) != seen; }, spin_us_);
        lock.lock();
      }
    }
    work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && next_chunk_ < num_chunks_); });
    if (stop_) return;
    seen = generation_;
    run_chunks(lock, true);
  }
}

void ThreadPool::run_chunks(std::unique_lock<std::mutex>& lock, bool worker) {
  // Read before the chunks: the caller clears it once the last chunk is done.
  CpuTimeAccount* const account = worker ? job_account_ : nullptr;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = account ? Clock::now() : Clock::time_point();
  while (next_chunk_ < num_chunks_) {
    const int64_t c = next_chunk_++;
    const auto* job = job_;
    const int64_t b = c * job_chunk_, e = std::min(job_n_, b + job_chunk_);
    lock.unlock();
    std::exception_ptr err;
    t_in_parallel = true;
    try {
      (*job)(b, e);
    } catch (...) {
      err = std::current_exception();
    }
    t_in_parallel = false;
    lock.lock();
    if (err && !error_) error_ = err;
    if (account && next_chunk_ >= num_chunks_)
      account->add_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    done_.store(++chunks_done_, std::memory_order_release);
    if (chunks_done_ == num_chunks_) done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = std::min<int64_t>(int64_t(num_threads()), (n + grain - 1) / grain);
  if (workers_.empty() || t_in_parallel || max_chunks <= 1) {
    fn(0, n);
    return;
  }
  // Another thread's job holds the workers (two models served side by side): run this one
  // on the calling thread instead of waiting for that job to end.
  std::unique_lock<std::mutex> run_lock(run_mu_, std::try_to_lock);
  if (!run_lock.owns_lock()) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + max_chunks - 1) / max_chunks;
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_account_ = t_account;
  job_n_ = n;
  job_chunk_ = chunk;
  num_chunks_ = (n + chunk - 1) / chunk;
  next_chunk_ = 0;
  chunks_done_ = 0;
  error_ = nullptr;
  done_.store(0, std::memory_order_relaxed);
  ++generation_;
  posted_.store(generation_, std::memory_order_release);
  work_cv_.notify_all();
  run_chunks(lock, false);  // the caller takes chunks too
  if (spin_us_ > 0 && chunks_done_ != num_chunks_) {
    const int64_t all = num_chunks_;
    lock.unlock();
    spin_until([&] { return done_.load(std::memory_order_acquire) == all; }, spin_us_);
    lock.lock();
  }
  done_cv_.wait(lock, [&] { return chunks_done_ == num_chunks_; });
  job_ = nullptr;
  job_account_ = nullptr;
  num_chunks_ = 0;
  std::exception_ptr err = error_;
  error_ = nullptr;
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

WorkSplit::WorkSplit(int slots) : slots_(std::max(1, slots)), share_(new Share[size_t(slots_)]) {}

namespace {
constexpr uint64_t pack_share(uint64_t next, uint64_t end) { return next | (end << 32); }
}  // namespace

void WorkSplit::reset(int64_t n) {
  if (n >= (int64_t(1) << 31)) throw Error(ErrorCode::internal, "WorkSplit: more than 2^31 items");
  const uint64_t m = uint64_t(std::max<int64_t>(0, n));
  for (int s = 0; s < slots_; ++s)
    share_[size_t(s)].v.store(pack_share(m * uint64_t(s) / uint64_t(slots_), m * uint64_t(s + 1) / uint64_t(slots_)),
                              std::memory_order_relaxed);
}

bool WorkSplit::next(int slot, int64_t* item) {
  std::atomic<uint64_t>& own = share_[size_t(slot)].v;
  // The owner only ever moves `next` up and thieves only move `end` down, so an add that
  // finds next < end has the item to itself. Once a share is used up its `next` may pass
  // `end`; nobody takes from it until its owner stores a new share.
  const uint64_t old = own.fetch_add(1, std::memory_order_acq_rel);
  if ((old & 0xffffffffu) < (old >> 32)) {
    *item = int64_t(old & 0xffffffffu);
    return true;
  }
  while (true) {
    int victim = -1;
    uint64_t seen = 0, most = 0;
    for (int s = 0; s < slots_; ++s) {
      if (s == slot) continue;
      const uint64_t v = share_[size_t(s)].v.load(std::memory_order_acquire);
      const uint64_t nx = v & 0xffffffffu, end = v >> 32;
      if (end > nx + 1 && end - nx > most) victim = s, seen = v, most = end - nx;
    }
    if (victim < 0) return false;
    const uint64_t nx = seen & 0xffffffffu, end = seen >> 32, cut = end - (most + 1) / 2;
    if (share_[size_t(victim)].v.compare_exchange_weak(seen, pack_share(nx, cut), std::memory_order_acq_rel)) {
      own.store(pack_share(cut + 1, end), std::memory_order_release);
      *item = int64_t(cut);
      return true;
    }
  }
}

namespace {
std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;
int g_requested = 0;

int resolve(int n) {
  if (n > 0) return n;
  return std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

ThreadPool& default_thread_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(resolve(g_requested));
  return *g_pool;
}

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_requested = n;
  if (g_pool && g_pool->num_threads() == resolve(n)) return;
  g_pool.reset();
}

int num_threads() { return default_thread_pool().num_threads(); }

}  // namespace slim
