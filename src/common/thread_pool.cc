#include "common/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SI_CPU_RELAX() _mm_pause()
#else
#define SI_CPU_RELAX() ((void)0)
#endif

namespace specinfer {

namespace {
thread_local bool tls_in_pool_job = false;
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  int workers = std::max(0, num_threads - 1);
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  for (;;) {
    int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= n_) break;
    (*fn_)(begin, std::min(n_, begin + grain_));
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                             int64_t grain) {
  if (n <= 0) return;
  int threads = num_threads();
  if (grain <= 0) grain = std::max<int64_t>(1, n / (4 * threads));
  if (threads == 1 || tls_in_pool_job || n <= grain) {
    for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
    return;
  }
  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  tls_in_pool_job = true;
  RunChunks();
  tls_in_pool_job = false;
  // Wait for every worker to check in. Yield after a short spin: on a loaded machine the worker
  // may be waiting for this very core.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 1000) {
      SI_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  tls_in_pool_job = true;
  // Generation 0 is "no job yet". Reading generation_ here instead would lose a job posted
  // before this thread got to run.
  uint64_t seen = 0;
  for (;;) {
    // Spin a little: in a decode loop the next job usually arrives within microseconds.
    uint64_t gen = seen;
    for (int i = 0; i < kSpinIterations; ++i) {
      gen = generation_.load(std::memory_order_acquire);
      if (gen != seen) break;
      if (i % 1024 == 1023) {
        std::this_thread::yield();
      } else {
        SI_CPU_RELAX();
      }
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = gen;
    RunChunks();
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace specinfer
