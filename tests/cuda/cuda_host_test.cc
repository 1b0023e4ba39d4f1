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
    if (i % 2 == 1) r.mask_begin = 0;  // a tree (the plan reads no mask words)
    token += r.token_count;
    reqs.push_back(r);
  }
  return reqs;
}

// The rows of (request, chunk) are cut into work items of plan.rows_per_item rows, or of a
// spread item's 16 (a tree's chunks from the one holding its window's first tile on, only on the
// tensor-core kernel with fewer than 4 rows per token), each row exactly once; partial rows of
// split requests are disjoint and inside the capacity; tokens map to their requests.
void ExpectPlanCovers(const std::vector<TreeAttentionRequest>& reqs,
                      const cuda::TreeAttentionPlan& plan, int32_t qo_heads, int32_t group,
                      int64_t capacity) {
  std::map<std::pair<int32_t, int32_t>, std::vector<const kernels::TreeAttentionWorkItem*>> items;
  int32_t spread_items = 0;
  for (const auto& w : plan.work) {
    ASSERT_GE(w.request, 0);
    ASSERT_LT(w.request, static_cast<int32_t>(reqs.size()));
    const auto& r = reqs[static_cast<size_t>(w.request)];
    EXPECT_LT(w.chunk, r.num_chunks);
    items[{w.request, w.chunk}].push_back(&w);
    if (w.spread) {
      ++spread_items;
      EXPECT_EQ(plan.rows_per_item, kernels::kTreeAttnMmaRowsPerBlock);
      EXPECT_LT(group, 4);
      EXPECT_GE(r.mask_begin, 0) << "a causal request spread";
      EXPECT_GE((w.chunk + 1) * plan.kv_chunk, r.kv_prefix / 32 * 32 + 1)
          << "a chunk without window tiles spread";
    }
  }
  EXPECT_EQ(spread_items, plan.spread_items);
  for (auto& [key, list] : items) {
    std::sort(list.begin(), list.end(),
              [](auto* a, auto* b) { return a->row_begin < b->row_begin; });
    const int32_t rows = reqs[static_cast<size_t>(key.first)].token_count * group;
    int32_t next = 0;
    for (const auto* w : list) {
      EXPECT_EQ(w->spread, list.front()->spread) << "one chunk cut two ways";
      EXPECT_EQ(w->row_begin, next) << "rows skipped or covered twice";
      next = w->row_begin + (w->spread ? kernels::kTreeAttnSpreadRows : plan.rows_per_item);
    }
    EXPECT_GE(next, rows);
    EXPECT_LT(list.back()->row_begin, rows);
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = reqs[i];
    EXPECT_EQ(r.kv_len, r.kv_prefix + r.masked_kv + r.token_count);
    EXPECT_GE(static_cast<int64_t>(r.num_chunks) * plan.kv_chunk, r.kv_len);
    EXPECT_LT(static_cast<int64_t>(r.num_chunks - 1) * plan.kv_chunk, std::max(r.kv_len, 1));
    for (int32_t c = 0; c < r.num_chunks; ++c)
      EXPECT_TRUE(items.count({static_cast<int32_t>(i), c})) << "chunk without work";
    if (r.num_chunks > 1)
      ranges.push_back({r.partial_begin, r.partial_begin + static_cast<int64_t>(r.num_chunks) *
                                                               r.token_count * qo_heads});
    for (int32_t t = r.token_begin; t < r.token_begin + r.token_count; ++t)
      EXPECT_EQ(plan.token_request[static_cast<size_t>(t)], static_cast<int32_t>(i));
  }
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
        o.kv_heads = fixed ? 8 : 32;  // 4 query heads per KV head, or 1 (trees spread)
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
        ExpectPlanCovers(reqs, *plan, 32, o.qo_heads / o.kv_heads, capacity);
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

// One request's 64-token tree over a 2048-token context, 32 heads without GQA (Llama-2-7B), in
// the runner's fixed chunks of 512: the chunk holding the window is cut into spread items (its
// 64 tokens a quarter per warp), which still fit the GPU once; a batch of 32 such trees, a GQA
// group of 4, a causal chunk or the option off keep 64-row items.
TEST(CudaHostPlan, SpreadsTreeWindowsWhileTheLaunchFitsOnce) {
  auto plan_for = [](int32_t batch, int32_t kv_heads, bool tree, bool spread) {
    cuda::TreeAttentionPlanOptions o;
    o.qo_heads = 32;
    o.kv_heads = kv_heads;
    o.head_dim = 128;
    o.partial_capacity_rows = 1 << 24;
    o.fixed_chunk = 512;
    o.rows_per_item = kernels::kTreeAttnMmaRowsPerBlock;
    o.spread_windows = spread;
    std::vector<TreeAttentionRequest> reqs(static_cast<size_t>(batch));
    for (int32_t i = 0; i < batch; ++i) {
      reqs[i].token_begin = 64 * i;
      reqs[i].token_count = 64;
      reqs[i].kv_prefix = 2048;
      reqs[i].mask_words_per_row = 1;
      reqs[i].mask_begin = tree ? 64 * i : -1;
    }
    auto plan = cuda::PlanTreeAttention(reqs, o);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    if (plan.ok()) ExpectPlanCovers(reqs, *plan, 32, 32 / kv_heads, o.partial_capacity_rows);
    return plan.ok() ? std::move(*plan) : cuda::TreeAttentionPlan{};
  };
  const cuda::TreeAttentionPlan one = plan_for(1, 32, true, true);
  EXPECT_EQ(one.spread_items, 4);  // the last chunk, [2048, 2112): 4 items of 16 rows
  for (const auto& w : one.work) EXPECT_EQ(w.spread != 0, w.chunk == 4);
  EXPECT_LE(static_cast<int64_t>(one.work.size()) * 32, 264);
  EXPECT_EQ(plan_for(1, 32, true, false).spread_items, 0);
  EXPECT_EQ(plan_for(32, 32, true, true).spread_items, 0);  // would not fit the GPU once
  EXPECT_EQ(plan_for(1, 8, true, true).spread_items, 0);    // 4 rows per token
  EXPECT_EQ(plan_for(1, 32, false, true).spread_items, 0);  // no window

  // Adaptive chunks leave room for the spread chunk: still one wave.
  std::vector<TreeAttentionRequest> reqs(1);
  reqs[0].token_count = 64;
  reqs[0].kv_prefix = 2048;
  reqs[0].mask_words_per_row = 1;
  reqs[0].mask_begin = 0;
  cuda::TreeAttentionPlanOptions o;
  o.qo_heads = 32;
  o.kv_heads = 32;
  o.head_dim = 128;
  o.partial_capacity_rows = 1 << 24;
  o.rows_per_item = kernels::kTreeAttnMmaRowsPerBlock;
  auto adaptive = cuda::PlanTreeAttention(reqs, o);
  ASSERT_TRUE(adaptive.ok());
  EXPECT_TRUE(adaptive->any_split);
  EXPECT_EQ(adaptive->spread_items, 4);
  EXPECT_LE(static_cast<int64_t>(adaptive->work.size()) * 32, o.target_blocks);
  EXPECT_GT(static_cast<int64_t>(adaptive->work.size()) * 32, o.target_blocks / 2);
  ExpectPlanCovers(reqs, *adaptive, 32, 1, o.partial_capacity_rows);
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
