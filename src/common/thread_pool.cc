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

// ThreadPool::loop_'s fields.
constexpr int kSeqShift = 17;
constexpr uint64_t kClosed = uint64_t{1} << 16;
constexpr uint64_t kInsideMask = kClosed - 1;
constexpr int kMaxWorkers = static_cast<int>(kInsideMask);
uint64_t Seq(uint64_t loop) { return loop >> kSeqShift; }
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = std::clamp(num_threads - 1, 0, kMaxWorkers);
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    loop_.store(((Seq(loop_.load()) + 1) << kSeqShift) | kClosed, std::memory_order_release);
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
  // No worker is inside a loop here (the last one waited for them), so the job is ours to set.
  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    loop_.store((Seq(loop_.load(std::memory_order_relaxed)) + 1) << kSeqShift,
                std::memory_order_release);
  }
  cv_.notify_all();
  tls_in_pool_job = true;
  RunChunks();
  tls_in_pool_job = false;
  // Every chunk is claimed: close the loop, then wait for the workers inside to finish theirs.
  // Yield after a short spin: on a loaded machine such a worker may be waiting for this core.
  uint64_t loop = loop_.fetch_or(kClosed, std::memory_order_acq_rel);
  for (int spins = 0; (loop & kInsideMask) != 0; ++spins) {
    if (spins < 1000) {
      SI_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
    loop = loop_.load(std::memory_order_acquire);
  }
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  tls_in_pool_job = true;
  // Sequence 0 is "no loop yet". Reading loop_ here instead would lose a loop opened before this
  // thread got to run.
  uint64_t seen = 0;
  for (;;) {
    // Spin a little: in a decode loop the next job usually arrives within microseconds.
    uint64_t loop = loop_.load(std::memory_order_acquire);
    for (int i = 0; i < kSpinIterations && Seq(loop) == seen; ++i) {
      if (i % 1024 == 1023) {
        std::this_thread::yield();
      } else {
        SI_CPU_RELAX();
      }
      loop = loop_.load(std::memory_order_acquire);
    }
    if (Seq(loop) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      // stop_ too: the destructor's closed loop may be the one a failed join last saw.
      cv_.wait(lock, [&] {
        return stop_.load(std::memory_order_acquire) ||
               Seq(loop_.load(std::memory_order_acquire)) != seen;
      });
      loop = loop_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // Join the newest loop while it is open; one closed already was done without this worker.
    seen = Seq(loop);
    while ((loop & kClosed) == 0) {
      if (loop_.compare_exchange_weak(loop, loop + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
        RunChunks();
        loop_.fetch_sub(1, std::memory_order_release);
        break;
      }
      seen = Seq(loop);  // the CAS reloaded `loop`: maybe a newer loop
    }
  }
}

}  // namespace specinfer
