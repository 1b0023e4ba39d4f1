// A fixed pool of worker threads for data-parallel loops on the CPU backend.
//
// ParallelFor splits [0, n) into chunks that the calling thread and the workers claim from a
// shared counter; it returns when every chunk is done. Decode steps issue thousands of small
// loops per second, so workers spin briefly before sleeping on a condition variable.
//
// The caller never waits for a worker that has not joined the loop: a worker joins only while
// the loop is open, and the caller closes it once every chunk is claimed, then waits for the
// workers inside to finish theirs. On a busy machine (more runnable threads than cores) a
// worker that is not running costs nothing: the caller runs its chunks. (Waiting for every
// worker to check in, as a barrier, made each loop wait out scheduler time slices there: two
// 2-thread processes on 2 cores ran 4x slower than one after the other.)
//
// Thread safety: ParallelFor may be called from one thread at a time per pool (the engine's
// step loop). Nested calls from inside a loop body run inline on the calling worker.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specinfer {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: 1 means no workers, everything runs inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), each at most `grain` long
  // (grain 0 picks n / (4 * threads)).
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 0);

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  // The loop in flight: bits 17.. its sequence number (0 before the first), bit 16 set once
  // it is closed to workers, bits 0-15 the workers inside it. A worker joins by incrementing
  // the count while the sequence is the one it saw and the loop is open.
  std::atomic<uint64_t> loop_{0};

  // The loop's job (written by the caller before it opens the loop; read by those inside).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace specinfer
