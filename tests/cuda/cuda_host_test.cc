// Host-side parts of the CUDA backend that need no GPU, run by `cuda_tests --host-only` (ctest
// cuda_host_tests, labelled cpu): the tree-attention plan's work partition and the errors a
// machine without a device gets.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <tuple>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_runner.h"
#include "backend/cuda/tree_attention_plan.h"
#include "engine/engine.h"
#include "linear.cuh"
#include "test_util.h"

namespace specinfer {
namespace {

using kernels::TreeAttentionRequest;

std::vector<TreeAttentionRequest> RandomRequests(std::mt19937& rng, int32_t count) {
  std::vector<TreeAttentionRequest> reqs;
  int32_t token = 0;
  for (int32_t i = 0; i < count; ++i) {
    TreeAttentionRequest r;
    r.token_begin = token;
    r.token_count = std::uniform_int_distribution<int32_t>(1, 70)(rng);
    r.kv_prefix = std::uniform_int_distribution<int32_t>(0, 5000)(rng);
    r.masked_kv = std::uniform_int_distribution<int32_t>(0, 3)(rng) == 0 ? 7 : 0;
    token += r.token_count;
    reqs.push_back(r);
  }
  return reqs;
}

// Every (request, tile of plan.rows_per_item rows, chunk) is one work item, exactly once; partial
// rows of split requests are disjoint and inside the capacity; tokens map to their requests.
void ExpectPlanCovers(const std::vector<TreeAttentionRequest>& reqs,
                      const cuda::TreeAttentionPlan& plan, int32_t qo_heads, int32_t group,
                      int64_t capacity) {
  std::set<std::tuple<int32_t, int32_t, int32_t>> seen;
  for (const auto& w : plan.work) {
    ASSERT_GE(w.request, 0);
    ASSERT_LT(w.request, static_cast<int32_t>(reqs.size()));
    const auto& r = reqs[static_cast<size_t>(w.request)];
    EXPECT_EQ(w.row_begin % plan.rows_per_item, 0);
    EXPECT_LT(w.row_begin, r.token_count * group);
    EXPECT_LT(w.chunk, r.num_chunks);
    EXPECT_TRUE(seen.insert({w.request, w.row_begin, w.chunk}).second) << "duplicate work item";
  }
  int64_t expected_items = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = reqs[i];
    EXPECT_EQ(r.kv_len, r.kv_prefix + r.masked_kv + r.token_count);
    EXPECT_GE(static_cast<int64_t>(r.num_chunks) * plan.kv_chunk, r.kv_len);
    EXPECT_LT(static_cast<int64_t>(r.num_chunks - 1) * plan.kv_chunk, std::max(r.kv_len, 1));
    expected_items += static_cast<int64_t>(r.num_chunks) *
                      ((r.token_count * group + plan.rows_per_item - 1) / plan.rows_per_item);
    if (r.num_chunks > 1)
      ranges.push_back({r.partial_begin, r.partial_begin + static_cast<int64_t>(r.num_chunks) *
                                                               r.token_count * qo_heads});
    for (int32_t t = r.token_begin; t < r.token_begin + r.token_count; ++t)
      EXPECT_EQ(plan.token_request[static_cast<size_t>(t)], static_cast<int32_t>(i));
  }
  EXPECT_EQ(static_cast<int64_t>(plan.work.size()), expected_items);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
  if (!ranges.empty()) {
    EXPECT_LE(ranges.back().second, capacity);
  }
  EXPECT_EQ(plan.any_split, !ranges.empty());
  EXPECT_EQ(plan.kv_chunk % kernels::kTreeAttnTileKv, 0);
}

TEST(CudaHostPlan, CoversEveryRowTileAndChunkOnce) {
  std::mt19937 rng(3);
  for (int32_t count : {1, 2, 5, 32}) {
    for (int64_t capacity : {int64_t{0}, int64_t{1} << 12, int64_t{1} << 24}) {
      for (int32_t fixed : {0, 512}) {
        std::vector<TreeAttentionRequest> reqs = RandomRequests(rng, count);
        cuda::TreeAttentionPlanOptions o;
        o.qo_heads = 32;
        o.kv_heads = 8;
        o.head_dim = 128;
        o.partial_capacity_rows = capacity;
        o.fixed_chunk = fixed;
        // The CUDA-core kernel's 16 rows per item, or the tensor-core kernel's 64.
        o.rows_per_item = kernels::TreeAttentionRowsPerItem(
            count % 2 ? kernels::AttnType::kF32 : kernels::AttnType::kF16, o.head_dim);
        auto plan = cuda::PlanTreeAttention(reqs, o);
        if (fixed > 0 && !plan.ok()) {
          // A fixed chunk that needs more partial rows than the workspace holds is an error.
          EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
          continue;
        }
        ASSERT_TRUE(plan.ok()) << plan.status().ToString();
        if (fixed > 0) {
          EXPECT_EQ(plan->kv_chunk, fixed);
        }
        EXPECT_EQ(plan->rows_per_item, o.rows_per_item);
        if (capacity == 0 && fixed == 0) {
          EXPECT_FALSE(plan->any_split);
        }
        ExpectPlanCovers(reqs, *plan, 32, 4, capacity);
      }
    }
  }
}

// A long context with one decoding token is split to fill the GPU; a big batch is not.
TEST(CudaHostPlan, SplitsOnlyWhenTheGpuWouldIdle) {
  cuda::TreeAttentionPlanOptions o;
  o.qo_heads = 32;
  o.kv_heads = 32;
  o.head_dim = 128;
  o.partial_capacity_rows = 1 << 20;
  std::vector<TreeAttentionRequest> one(1);
  one[0].token_count = 1;
  one[0].kv_prefix = 8191;
  auto p1 = cuda::PlanTreeAttention(one, o);
  ASSERT_TRUE(p1.ok());
  EXPECT_TRUE(p1->any_split);
  // One wave of blocks that fills most of the GPU (not a few more than fit, which would take a
  // second wave for themselves).
  const int64_t blocks = static_cast<int64_t>(p1->work.size()) * o.kv_heads;
  EXPECT_LE(blocks, o.target_blocks);
  EXPECT_GT(blocks, o.target_blocks * 3 / 4);
  ExpectPlanCovers(one, *p1, 32, 1, o.partial_capacity_rows);

  std::vector<TreeAttentionRequest> many(32);
  for (int32_t i = 0; i < 32; ++i) {
    many[i].token_begin = i * 128;
    many[i].token_count = 128;
    many[i].kv_prefix = 8192;
  }
  auto p2 = cuda::PlanTreeAttention(many, o);
  ASSERT_TRUE(p2.ok());
  EXPECT_FALSE(p2->any_split);
}

TEST(CudaHostPlan, RejectsBadGeometry) {
  std::vector<TreeAttentionRequest> reqs(2);
  reqs[0].token_count = 3;
  reqs[1].token_begin = 4;  // not contiguous
  reqs[1].token_count = 1;
  cuda::TreeAttentionPlanOptions o;
  o.qo_heads = 8;
  o.kv_heads = 8;
  o.head_dim = 64;
  EXPECT_EQ(cuda::PlanTreeAttention(reqs, o).status().code(), StatusCode::kInvalidArgument);
  reqs[1].token_begin = 3;
  o.kv_heads = 3;  // 8 query heads do not group over 3
  EXPECT_EQ(cuda::PlanTreeAttention(reqs, o).status().code(), StatusCode::kInvalidArgument);
  o.kv_heads = 8;
  o.rows_per_item = 32;  // neither kernel's
  EXPECT_EQ(cuda::PlanTreeAttention(reqs, o).status().code(), StatusCode::kInvalidArgument);
}

// Launchers check their shapes before touching the device.
TEST(CudaHostLaunch, BadShapesAreRefusedWithoutLaunching) {
  EXPECT_EQ(kernels::LaunchLinear(kernels::ElemType::kF32, nullptr, 0, 8, nullptr, 1, nullptr, 0,
                                  nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::LaunchLinear(kernels::ElemType::kQ4_0, nullptr, 4, 48, nullptr, 1, nullptr, 0,
                                  nullptr),
            cudaErrorInvalidValue);  // 48 is not a multiple of the 32-element block
  // A plan cut for the other tree-attention kernel's rows per item.
  kernels::TreeAttentionParams tp;
  tp.num_tokens = 1;
  tp.qo_heads = tp.kv_heads = 8;
  tp.head_dim = 128;
  tp.block_size = 16;
  tp.kv_chunk = kernels::kTreeAttnTileKv;
  tp.rows_per_item = kernels::kTreeAttnRowsPerBlock;
  EXPECT_EQ(kernels::LaunchTreeAttention(tp, kernels::AttnType::kF16, true, nullptr),
            cudaErrorInvalidValue);
}

// --backend cuda: a clear error where there is no device (the runner is created otherwise).
TEST(CudaHostEngine, CudaBackendWithoutDeviceIsAnError) {
  cuda::RegisterCudaBackend();
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  o.backend = "cuda";
  auto e = Engine::Create(o);
  if (cuda::DeviceCount() == 0) {
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(e.status().ToString().find("no CUDA device"), std::string::npos)
        << e.status().ToString();
  } else {
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ((*e)->runner().name(), "cuda:0");
  }
}

}  // namespace
}  // namespace specinfer
