// ThreadCollectiveGroup (the in-process stand-in for NCCL): all-gathers with uneven counts and
// pipeline messages on device buffers, ranks as threads each on its own device, and its failure
// paths: an aborting rank, a rank that never arrives (bounded wait) and mismatched counts all
// turn into errors on every rank, with no hang.
#include "backend/cuda/thread_collective.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "cuda_test_util.h"

namespace specinfer::cuda {
namespace {

using namespace std::chrono_literals;

// Runs body(stage, tp_rank, collective, stream) on one thread per rank, rank i on device i.
std::vector<Status> RunRanks(
    ThreadCollectiveGroup& group, int32_t stages, int32_t tp,
    const std::function<Status(int32_t, int32_t, DeviceCollective&, cudaStream_t)>& body) {
  std::vector<Status> results(static_cast<size_t>(stages * tp));
  std::vector<std::thread> threads;
  for (int32_t s = 0; s < stages; ++s)
    for (int32_t r = 0; r < tp; ++r)
      threads.emplace_back([&, s, r] {
        Status& out = results[static_cast<size_t>(s * tp + r)];
        if (cudaSetDevice(s * tp + r) != cudaSuccess) {
          out = InternalError("cudaSetDevice");
          return;
        }
        auto rank = group.Rank(s, r);
        if (!rank.ok()) {
          out = rank.status();
          return;
        }
        cudaStream_t stream = nullptr;
        cudaStreamCreate(&stream);
        out = body(s, r, **rank, stream);
        cudaStreamDestroy(stream);
      });
  for (std::thread& t : threads) t.join();
  return results;
}

bool EnoughDevices(int32_t ranks) { return DeviceCount() >= ranks; }

TEST(ThreadCollective, AllGatherUnevenAndPipelineMessages) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << DeviceCount();
  auto group = ThreadCollectiveGroup::Create(2, 2, 10s);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  const std::vector<size_t> counts = {3, 5};
  std::vector<std::vector<float>> gathered(4), received(4);
  const auto results = RunRanks(
      **group, 2, 2, [&](int32_t s, int32_t r, DeviceCollective& c, cudaStream_t stream) -> Status {
        const size_t me = static_cast<size_t>(s * 2 + r);
        std::vector<float> mine(counts[static_cast<size_t>(r)]);
        for (size_t i = 0; i < mine.size(); ++i) mine[i] = 100.0f * s + 10.0f * r + i;
        testing::DeviceArray<float> in(mine), out(8);
        for (int round = 0; round < 3; ++round)  // the barrier is reusable
          SI_RETURN_IF_ERROR(c.AllGather(in.get(), out.get(), counts, stream));
        SI_RETURN_IF_ERROR(c.Synchronize(stream));
        gathered[me] = out.Download();
        testing::DeviceArray<float> msg(4);
        if (s == 0) {
          // Two messages in a row: they arrive in order.
          testing::DeviceArray<float> a(std::vector<float>{1, 2, 3, 4 + 10.0f * r});
          testing::DeviceArray<float> b(std::vector<float>{5, 6, 7, 8 + 10.0f * r});
          SI_RETURN_IF_ERROR(c.SendToNextStage(a.get(), 4, stream));
          SI_RETURN_IF_ERROR(c.SendToNextStage(b.get(), 4, stream));
        } else {
          for (int i = 0; i < 2; ++i) {
            SI_RETURN_IF_ERROR(c.RecvFromPrevStage(msg.get(), 4, stream));
            SI_RETURN_IF_ERROR(c.Synchronize(stream));
            const std::vector<float> got = msg.Download();
            received[me].insert(received[me].end(), got.begin(), got.end());
          }
        }
        return c.Synchronize(stream);
      });
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
  for (int32_t s = 0; s < 2; ++s)
    for (int32_t r = 0; r < 2; ++r) {
      const float b = 100.0f * s;
      EXPECT_EQ(gathered[static_cast<size_t>(s * 2 + r)],
                (std::vector<float>{b, b + 1, b + 2, b + 10, b + 11, b + 12, b + 13, b + 14}))
          << "stage " << s << " rank " << r;
    }
  EXPECT_EQ(received[2], (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(received[3], (std::vector<float>{1, 2, 3, 14, 5, 6, 7, 18}));
}

TEST(ThreadCollective, AbortingRankFailsItsPeersAtOnce) {
  if (!EnoughDevices(2)) GTEST_SKIP() << "needs 2 GPUs, found " << DeviceCount();
  auto group = ThreadCollectiveGroup::Create(1, 2, 60s);  // far longer than the test may take
  ASSERT_TRUE(group.ok());
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = RunRanks(
      **group, 1, 2, [&](int32_t, int32_t r, DeviceCollective& c, cudaStream_t stream) -> Status {
        testing::DeviceArray<float> in(2), out(4);
        const std::vector<size_t> counts = {2, 2};
        if (r == 1) {
          std::this_thread::sleep_for(50ms);  // the peer is waiting by now
          c.Abort(InternalError("injected"));
          return InternalError("injected");
        }
        return c.AllGather(in.get(), out.get(), counts, stream);
      });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  EXPECT_EQ(results[0].code(), StatusCode::kAborted) << results[0].ToString();
  EXPECT_NE(results[0].message().find("injected"), std::string::npos) << results[0].ToString();
}

TEST(ThreadCollective, MissingPeerTimesOutAndFailsTheGroup) {
  if (!EnoughDevices(2)) GTEST_SKIP() << "needs 2 GPUs, found " << DeviceCount();
  auto group = ThreadCollectiveGroup::Create(2, 1, 300ms);
  ASSERT_TRUE(group.ok());
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = RunRanks(
      **group, 2, 1, [&](int32_t s, int32_t, DeviceCollective& c, cudaStream_t stream) -> Status {
        testing::DeviceArray<float> buf(4);
        if (s == 0) return Status::Ok();  // the sender never sends
        Status first = c.RecvFromPrevStage(buf.get(), 4, stream);
        if (first.code() != StatusCode::kDeadlineExceeded) return InternalError(first.ToString());
        // The group stays failed: the next call fails at once.
        return c.RecvFromPrevStage(buf.get(), 4, stream);
      });
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 10s);
  EXPECT_EQ(results[1].code(), StatusCode::kDeadlineExceeded) << results[1].ToString();
}

TEST(ThreadCollective, MismatchedCountsAreAnError) {
  if (!EnoughDevices(2)) GTEST_SKIP() << "needs 2 GPUs, found " << DeviceCount();
  auto group = ThreadCollectiveGroup::Create(1, 2, 10s);
  ASSERT_TRUE(group.ok());
  const auto results = RunRanks(
      **group, 1, 2, [&](int32_t, int32_t r, DeviceCollective& c, cudaStream_t stream) -> Status {
        testing::DeviceArray<float> in(3), out(6);
        // Rank 1 believes rank 0 sends 3 floats; rank 0 sends 2.
        const std::vector<size_t> counts =
            r == 0 ? std::vector<size_t>{2, 2} : std::vector<size_t>{3, 2};
        return c.AllGather(in.get(), out.get(), counts, stream);
      });
  EXPECT_FALSE(results[0].ok());
  EXPECT_FALSE(results[1].ok());
  EXPECT_TRUE(results[0].code() == StatusCode::kInternal ||
              results[1].code() == StatusCode::kInternal)
      << results[0].ToString() << " / " << results[1].ToString();
}

TEST(ThreadCollective, RanksMeetByName) {
  if (!EnoughDevices(2)) GTEST_SKIP() << "needs 2 GPUs, found " << DeviceCount();
  std::vector<Status> results(2);
  std::vector<std::vector<float>> out(2);
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      auto c = ThreadCollectiveGroup::JoinNamed("e5/test-group", CollectiveLayout{0, 1, r, 2}, 10s);
      if (!c.ok()) {
        results[static_cast<size_t>(r)] = c.status();
        return;
      }
      testing::DeviceArray<float> in(std::vector<float>{1.0f + r}), all(2);
      const std::vector<size_t> counts = {1, 1};
      results[static_cast<size_t>(r)] = (*c)->AllGather(in.get(), all.get(), counts, nullptr);
      out[static_cast<size_t>(r)] = all.Download();
      // Both still hold their handles here: a third rank of the same place is refused.
      if (r == 0) {
        auto again =
            ThreadCollectiveGroup::JoinNamed("e5/test-group", CollectiveLayout{0, 1, 0, 2}, 10s);
        if (again.status().code() != StatusCode::kInvalidArgument)
          results[0] = InternalError("a taken place was handed out twice");
        auto shape =
            ThreadCollectiveGroup::JoinNamed("e5/test-group", CollectiveLayout{0, 2, 0, 1}, 10s);
        if (shape.status().code() != StatusCode::kInvalidArgument)
          results[0] = InternalError("a group of another shape was joined");
      }
    });
  for (std::thread& t : threads) t.join();
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out[0], (std::vector<float>{1, 2}));
  EXPECT_EQ(out[1], (std::vector<float>{1, 2}));
  // Nobody holds it now: the name starts a fresh group.
  EXPECT_TRUE(
      ThreadCollectiveGroup::JoinNamed("e5/test-group", CollectiveLayout{0, 1, 0, 2}, 1s).ok());
}

// Captures one graph of (all-gather, send or receive) on `stream`: the operations are recorded,
// not run (nothing arrives while the graph is made).
StatusOr<cudaGraphExec_t> CaptureStep(DeviceCollective& c, int32_t s, cudaStream_t stream,
                                      const float* in, float* gathered, float* msg,
                                      std::span<const size_t> counts) {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
    return InternalError("begin capture");
  Status issued = c.AllGather(in, gathered, counts, stream);
  if (issued.ok())
    issued = s == 0 ? c.SendToNextStage(gathered, 8, stream) : c.RecvFromPrevStage(msg, 8, stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  SI_RETURN_IF_ERROR(issued);
  if (ended != cudaSuccess) return InternalError("end capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) return InternalError("instantiate");
  return exec;
}

// CUDA graphs: operations issued on a capturing stream are recorded and run at every launch of
// the graph, on what the buffers hold then (here: an all-gather of uneven shares and a pipeline
// message from stage 0's gathered values to stage 1, launched three times with new inputs); a
// rank that aborts while its peers run their graphs fails them, and Synchronize says so, with no
// hang. Where device memory is not host-addressable (a GPU's), the collective is not capturable.
TEST(ThreadCollective, OperationsRecordedIntoGraphsRunAtEveryLaunch) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << DeviceCount();
  for (bool abort_third : {false, true}) {
    auto group = ThreadCollectiveGroup::Create(2, 2, 60s);
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    const std::vector<size_t> counts = {3, 5};
    std::vector<std::vector<float>> gathered(4), received(4);
    const auto t0 = std::chrono::steady_clock::now();
    const auto results = RunRanks(
        **group, 2, 2,
        [&](int32_t s, int32_t r, DeviceCollective& c, cudaStream_t stream) -> Status {
          if (!c.capturable()) return UnimplementedError("not capturable here");
          const size_t me = static_cast<size_t>(s * 2 + r);
          testing::DeviceArray<float> in(counts[static_cast<size_t>(r)]), out(8), msg(8);
          SI_ASSIGN_OR_RETURN(cudaGraphExec_t exec,
                              CaptureStep(c, s, stream, in.get(), out.get(), msg.get(), counts));
          Status status;
          for (int round = 0; round < 3 && status.ok(); ++round) {
            if (abort_third && round == 2 && me == 3) {
              std::this_thread::sleep_for(50ms);  // the peers are in their graphs by now
              c.Abort(InternalError("injected"));
              status = InternalError("injected");
              break;
            }
            std::vector<float> mine(counts[static_cast<size_t>(r)]);
            for (size_t i = 0; i < mine.size(); ++i)
              mine[i] = 1000.0f * round + 100.0f * s + 10.0f * r + static_cast<float>(i);
            // Into the buffer the graph was recorded with (Upload would allocate another).
            if (cudaMemcpy(in.get(), mine.data(), mine.size() * sizeof(float),
                           cudaMemcpyHostToDevice) != cudaSuccess ||
                cudaGraphLaunch(exec, stream) != cudaSuccess)
              status = InternalError("upload or launch");
            if (status.ok()) status = c.Synchronize(stream);
            if (status.ok()) {
              const std::vector<float> g = out.Download(), m = msg.Download();
              gathered[me].insert(gathered[me].end(), g.begin(), g.end());
              if (s == 1) received[me].insert(received[me].end(), m.begin(), m.end());
            }
          }
          cudaGraphExecDestroy(exec);
          return status;
        });
    if (results[0].code() == StatusCode::kUnimplemented)
      GTEST_SKIP() << "device memory is not host-addressable here: the in-process collective is "
                      "not capturable (NCCL's is)";
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
    const size_t rounds = abort_third ? 2 : 3;
    for (int32_t s = 0; s < 2; ++s)
      for (int32_t r = 0; r < 2; ++r) {
        const size_t me = static_cast<size_t>(s * 2 + r);
        std::vector<float> want, want_msg;
        for (size_t round = 0; round < rounds; ++round) {
          const float b = 1000.0f * round + 100.0f * s;
          const std::vector<float> g = {b, b + 1, b + 2, b + 10, b + 11, b + 12, b + 13, b + 14};
          want.insert(want.end(), g.begin(), g.end());
          const float b0 = 1000.0f * round;  // stage 0 of the same tp rank sent its gather
          const std::vector<float> m = {b0,      b0 + 1,  b0 + 2,  b0 + 10,
                                        b0 + 11, b0 + 12, b0 + 13, b0 + 14};
          want_msg.insert(want_msg.end(), m.begin(), m.end());
        }
        if (abort_third) {
          // Rank 2 waits for rank 3 in its graph's all-gather: aborted. Stage 0 does not wait for
          // stage 1 (sends are buffered): its third round may finish before the abort.
          if (me == 2) {
            EXPECT_EQ(results[me].code(), StatusCode::kAborted) << results[me].ToString();
            EXPECT_NE(results[me].message().find("injected"), std::string::npos);
          } else if (me < 2) {
            EXPECT_TRUE(results[me].ok() || results[me].code() == StatusCode::kAborted)
                << results[me].ToString();
          }
          // What completed before the abort is right.
          EXPECT_GE(gathered[me].size(), 16u) << "rank " << me;
          gathered[me].resize(std::min<size_t>(gathered[me].size(), 16));
          if (s == 1) received[me].resize(std::min<size_t>(received[me].size(), 16));
        } else {
          EXPECT_TRUE(results[me].ok()) << "rank " << me << ": " << results[me].ToString();
        }
        EXPECT_EQ(gathered[me], want) << "stage " << s << " rank " << r;
        if (s == 1) {
          EXPECT_EQ(received[me], want_msg) << "stage " << s << " rank " << r;
        }
      }
  }
}

TEST(ThreadCollective, RefusesBadLayouts) {
  EXPECT_FALSE(ThreadCollectiveGroup::Create(0, 2, 1s).ok());
  EXPECT_FALSE(ThreadCollectiveGroup::Create(1, 2, 0ms).ok());
  auto group = ThreadCollectiveGroup::Create(1, 2, 1s);
  ASSERT_TRUE(group.ok());
  EXPECT_FALSE((*group)->Rank(1, 0).ok());
  EXPECT_FALSE((*group)->Rank(0, 2).ok());
  EXPECT_TRUE((*group)->Rank(0, 1).ok());
}

}  // namespace
}  // namespace specinfer::cuda
