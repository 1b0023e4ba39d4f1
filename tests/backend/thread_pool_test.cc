// The CPU backend's thread pool (common/thread_pool.h): every index of a loop is visited exactly
// once whatever the sizes, grains and thread counts; nested loops run inline; thousands of loops
// in a row, each seeing what the last one wrote; pools with more threads than the machine has
// cores, and several pools side by side, neither lose work nor hang.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace specinfer {
namespace {

// Runs one loop of `n` on `pool` and checks that each index was covered once, by ranges no
// longer than `grain` (when given).
void ExpectEachIndexOnce(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<bool> too_long{false};
  pool.ParallelFor(
      n,
      [&](int64_t b, int64_t e) {
        if (grain > 0 && e - b > grain) too_long = true;
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      },
      grain);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n;
  EXPECT_FALSE(too_long) << "a range longer than the grain " << grain;
}

TEST(ThreadPool, EveryIndexOnceForEverySizeGrainAndThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 100003}) {
      for (int64_t grain : {0, 1, 3, 64, 200000}) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, n " << n << ", grain " << grain);
        ExpectEachIndexOnce(pool, n, grain);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// Decode steps issue thousands of small loops back to back, each reading what the one before
// wrote: a loop must be finished, by every thread that joined it, when ParallelFor returns.
TEST(ThreadPool, BackToBackLoopsSeeEachOthersWrites) {
  ThreadPool pool(4);
  std::vector<int64_t> a(256, 0), b(256, 0);
  for (int round = 0; round < 5000; ++round) {
    std::vector<int64_t>& from = (round % 2 == 0) ? a : b;
    std::vector<int64_t>& to = (round % 2 == 0) ? b : a;
    pool.ParallelFor(
        256,
        [&](int64_t s, int64_t e) {
          for (int64_t i = s; i < e; ++i) to[i] = from[i] + 1;
        },
        8);
  }
  for (int64_t v : a) ASSERT_EQ(v, 5000);
}

TEST(ThreadPool, NestedLoopsRunInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(
      16,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const std::thread::id outer = std::this_thread::get_id();
          pool.ParallelFor(
              10,
              [&](int64_t nb, int64_t ne) {
                EXPECT_EQ(std::this_thread::get_id(), outer) << "a nested loop left its thread";
                sum.fetch_add(ne - nb);
              },
              1);
        }
      },
      1);
  EXPECT_EQ(sum.load(), 160);
}

// More runnable threads than cores, as under `ctest -j` or beside other processes: the pools'
// loops all complete (the caller does not wait for workers that have not joined) and no work is
// lost. Four pools of 8 threads on this machine's cores, each on its own caller thread.
TEST(ThreadPool, OversubscribedPoolsSideBySideFinishEveryLoop) {
  constexpr int kPools = 4, kLoops = 2000;
  std::vector<int64_t> totals(kPools, 0);
  std::vector<std::thread> callers;
  for (int p = 0; p < kPools; ++p) {
    callers.emplace_back([&totals, p] {
      ThreadPool pool(8);
      for (int l = 0; l < kLoops; ++l) {
        std::atomic<int64_t> covered{0};
        pool.ParallelFor(
            100 + l % 37, [&](int64_t b, int64_t e) { covered.fetch_add(e - b); }, 4);
        totals[p] += covered.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  int64_t want = 0;
  for (int l = 0; l < kLoops; ++l) want += 100 + l % 37;
  for (int p = 0; p < kPools; ++p) EXPECT_EQ(totals[p], want) << "pool " << p;
}

TEST(ThreadPool, DestroyedRightAfterCreationOrAfterALoop) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool idle(4);
  }
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(4);
    ExpectEachIndexOnce(pool, 100, 1);
  }
}

}  // namespace
}  // namespace specinfer
