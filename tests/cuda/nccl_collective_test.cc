// NcclCollective on real GPUs (ranks as threads, one GPU each, the unique ids exchanged through an
// in-memory RendezvousKv): all-gathers with uneven counts, pipeline messages, the sharded CUDA
// runner over NCCL against the whole-model runner bit for bit, and a group whose peer never
// joins ending in DEADLINE_EXCEEDED (needs one GPU). Builds without NCCL (the emulator's, or where
// libnccl is missing) report these tests skipped.
#include <gtest/gtest.h>

#include "backend/cuda/cuda_device.h"

#if defined(SPECINFER_WITH_NCCL)

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_runner.h"
#include "backend/cuda/nccl/nccl_collective.h"
#include "cuda_test_util.h"
#include "model/loader.h"
#include "test_util.h"

namespace specinfer::cuda {
namespace {

using namespace std::chrono_literals;

class MemoryKv final : public RendezvousKv {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    cv_.notify_all();
    return Status::Ok();
  }
  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) != 0; }))
      return Status(StatusCode::kDeadlineExceeded, "no key " + key);
    return values_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// Runs body on one thread per rank of a stages x tp group (rank i on GPU i), each with its
// NcclCollective (formed in parallel, as separate processes would).
std::vector<Status> RunNcclRanks(
    int32_t stages, int32_t tp,
    const std::function<Status(NcclCollective&, std::shared_ptr<DeviceCollective>, cudaStream_t)>&
        body) {
  MemoryKv kv;
  std::vector<Status> results(static_cast<size_t>(stages * tp));
  std::vector<std::thread> threads;
  for (int32_t s = 0; s < stages; ++s)
    for (int32_t r = 0; r < tp; ++r)
      threads.emplace_back([&, s, r] {
        const int device = s * tp + r;
        CollectiveLayout l{s, stages, r, tp};
        auto c = NcclCollective::Create(kv, l, /*epoch=*/1, device, 60s);
        Status& out = results[static_cast<size_t>(device)];
        if (!c.ok()) {
          out = c.status();
          return;
        }
        std::shared_ptr<NcclCollective> shared = std::move(c).value();
        cudaSetDevice(device);
        cudaStream_t stream = nullptr;
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        out = body(*shared, shared, stream);
        cudaStreamDestroy(stream);
      });
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(NcclCollective, AllGatherUnevenAndPipelineMessages) {
  if (DeviceCount() < 4) GTEST_SKIP() << "needs 4 GPUs, found " << DeviceCount();
  const std::vector<size_t> counts = {3, 5};
  std::vector<std::vector<float>> gathered(4), received(4);
  const auto results = RunNcclRanks(2, 2, [&](NcclCollective& c, auto, cudaStream_t stream) {
    const int32_t s = c.layout().stage, r = c.layout().tp_rank;
    const size_t me = static_cast<size_t>(s * 2 + r);
    std::vector<float> mine(counts[static_cast<size_t>(r)]);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = 100.0f * s + 10.0f * r + i;
    testing::DeviceArray<float> in(mine), out(8), msg(4);
    testing::DeviceArray<float> a(std::vector<float>{1, 2, 3, 4 + 10.0f * r});
    SI_RETURN_IF_ERROR(c.AllGather(in.get(), out.get(), counts, stream));
    if (s == 0) SI_RETURN_IF_ERROR(c.SendToNextStage(a.get(), 4, stream));
    if (s == 1) SI_RETURN_IF_ERROR(c.RecvFromPrevStage(msg.get(), 4, stream));
    SI_RETURN_IF_ERROR(c.Synchronize(stream));
    gathered[me] = out.Download();
    received[me] = msg.Download();
    return Status::Ok();
  });
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
  for (int32_t s = 0; s < 2; ++s) {
    const float b = 100.0f * s;
    for (int32_t r = 0; r < 2; ++r)
      EXPECT_EQ(gathered[static_cast<size_t>(s * 2 + r)],
                (std::vector<float>{b, b + 1, b + 2, b + 10, b + 11, b + 12, b + 13, b + 14}));
  }
  EXPECT_EQ(received[2], (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(received[3], (std::vector<float>{1, 2, 3, 14}));
}

// TP = 2 over NCCL: the last stage's columns are the whole-model runner's, bit for bit.
TEST(NcclCollective, ShardedRunnerMatchesWholeModel) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << DeviceCount();
  auto loaded = LoadModelAndTokenizer(testing::Stories260KModel(), testing::Stories260KTokenizer());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::shared_ptr<const Model> model = std::move(loaded->model);
  const int32_t vocab = model->config().vocab_size, n = 12;
  std::vector<int32_t> tokens(n), pos(n);
  for (int32_t i = 0; i < n; ++i) tokens[i] = 1 + (i * 37) % (vocab - 1), pos[i] = i;
  auto run = [&](ModelRunner& r, int32_t cols) -> StatusOr<std::vector<float>> {
    KvCacheManager kv(8, 16);
    const SeqId s = kv.AddSequence();
    SI_RETURN_IF_ERROR(kv.Reserve(s, n));
    ForwardBatch b;
    b.AddSequence(s, tokens, pos, 0, nullptr);
    b.logit_rows = {0, n - 1};
    std::vector<float> logits(2 * static_cast<size_t>(cols));
    SI_RETURN_IF_ERROR(r.Forward(b, kv, logits));
    return logits;
  };
  CudaRunnerOptions o;
  o.num_kv_blocks = 8;
  auto whole = CudaModelRunner::Create(model, o);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto want = run(**whole, vocab);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  std::vector<std::vector<float>> cols(2);
  std::vector<ShardRange> shares(2);
  const auto results = RunNcclRanks(
      1, 2,
      [&](NcclCollective& c, std::shared_ptr<DeviceCollective> shared, cudaStream_t) -> Status {
        CudaRunnerOptions so = o;
        so.device = c.layout().tp_rank;
        so.layout = c.layout();
        so.collective = shared;
        SI_ASSIGN_OR_RETURN(auto runner, CudaModelRunner::Create(model, so));
        shares[static_cast<size_t>(so.device)] = runner->vocab();
        SI_ASSIGN_OR_RETURN(cols[static_cast<size_t>(so.device)],
                            run(*runner, static_cast<int32_t>(runner->vocab().count)));
        return Status::Ok();
      });
  for (const Status& s : results) ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<float> got(want->size());
  for (size_t r = 0; r < 2; ++r)
    for (size_t row = 0; row < 2; ++row)
      std::copy_n(&cols[r][row * shares[r].count], shares[r].count,
                  &got[row * vocab + shares[r].begin]);
  EXPECT_ALL_CLOSE(got, *want, 0.0, 0.0, "TP 2 over NCCL vs one GPU");
}

TEST(NcclCollective, MissingPeerTimesOut) {
  if (DeviceCount() < 1) GTEST_SKIP() << "needs a GPU";
  MemoryKv kv;
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 0 of a TP group of 2 whose rank 1 never comes.
  auto c = NcclCollective::Create(kv, CollectiveLayout{0, 1, 0, 2}, 7, 0, 2s);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded) << c.status().ToString();
  EXPECT_LT(elapsed, 30s);
  // Rank 1 of another group, whose id never appears.
  auto d = NcclCollective::Create(kv, CollectiveLayout{0, 1, 1, 2}, 8, 0, 500ms);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kDeadlineExceeded) << d.status().ToString();
}

}  // namespace
}  // namespace specinfer::cuda

#else

TEST(NcclCollective, NotBuilt) {
  GTEST_SKIP() << "built without NCCL (the emulator's tests use the in-process collective)";
}

#endif
