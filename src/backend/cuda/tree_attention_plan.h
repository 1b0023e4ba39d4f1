// Host-side plan of the tree-attention kernel (kernels/tree_attention.cuh): how a batch's
// requests are cut into work items, and whether long contexts are split into KV chunks whose
// partial results a merge kernel combines. Planning only reads the requests' geometry, so a plan
// can be built once and replayed (e.g. inside a CUDA graph) for every layer of a pass.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "specinfer/status.h"
#include "tree_attention.cuh"

namespace specinfer::cuda {

struct TreeAttentionPlanOptions {
  int32_t qo_heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  // Blocks that fill the GPU (e.g. 2 x the number of SMs): below it, contexts are split.
  int32_t target_blocks = 264;
  // Partial rows the caller's workspace holds ([rows, head_dim] + [rows, 2] floats); splitting
  // is limited to what fits (0: never split).
  int64_t partial_capacity_rows = 0;
  // Never split into chunks shorter than this (positions): 4 tiles, enough for the kernel to
  // overlap one tile's loads with the previous tile's arithmetic.
  int32_t min_chunk = 128;
  // > 0: every request is cut into chunks of exactly this many positions (rounded up to the
  // tile), whatever else is in the batch, so a token's result is bit-identical in every batch
  // (what ForwardBatch::batch_invariant asks for). ResourceExhausted if the partial rows do not
  // fit. 0: the chunk adapts to the batch to fill the GPU.
  int32_t fixed_chunk = 0;
  // (token, group head) rows per work item: kernels::TreeAttentionRowsPerItem of the launch's
  // input type and head size (the tensor-core kernel takes 64 rows per block, the other 16).
  int32_t rows_per_item = kernels::kTreeAttnRowsPerBlock;
  // Tensor-core kernel: cut the chunks that hold a tree's window into spread items
  // (TreeAttentionWorkItem::spread) where a token has fewer than 4 rows (GQA group < 4, so a
  // 64-row item gives each warp more than 4 tokens to run one by one) and the blocks, with them,
  // still fit target_blocks (requests in order). Off: every item has rows_per_item rows (the same
  // results bit for bit; benchmarks compare the two).
  bool spread_windows = true;
};

struct TreeAttentionPlan {
  std::vector<kernels::TreeAttentionWorkItem> work;
  std::vector<int32_t> token_request;  // [num_tokens]: the request of each token
  int32_t num_tokens = 0;
  int32_t kv_chunk = 0;
  int32_t rows_per_item = kernels::kTreeAttnRowsPerBlock;  // TreeAttentionParams::rows_per_item
  int32_t max_window = 0;                                  // TreeAttentionParams::max_window
  int64_t partial_rows = 0;                                // partial rows used
  bool any_split = false;
  int32_t spread_items = 0;  // work items with spread set
};

// Plans `requests` (token_begin, token_count, kv_prefix, masked_kv filled in; tokens contiguous
// from 0 in request order). Fills each request's kv_len, num_chunks and partial_begin.
// InvalidArgument for inconsistent geometry.
StatusOr<TreeAttentionPlan> PlanTreeAttention(std::span<kernels::TreeAttentionRequest> requests,
                                              const TreeAttentionPlanOptions& options);

}  // namespace specinfer::cuda
