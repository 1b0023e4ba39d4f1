#include "backend/cuda/tree_attention_plan.h"

#include <algorithm>
#include <string>

namespace specinfer::cuda {

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

StatusOr<TreeAttentionPlan> PlanTreeAttention(std::span<kernels::TreeAttentionRequest> requests,
                                              const TreeAttentionPlanOptions& o) {
  using kernels::kTreeAttnTileKv;
  const int32_t rows_per_item = o.rows_per_item;
  if (rows_per_item != kernels::kTreeAttnRowsPerBlock &&
      rows_per_item != kernels::kTreeAttnMmaRowsPerBlock)
    return InvalidArgumentError("tree attention plan: rows per item must be one kernel's (" +
                                std::to_string(kernels::kTreeAttnRowsPerBlock) + " or " +
                                std::to_string(kernels::kTreeAttnMmaRowsPerBlock) + ")");
  if (o.qo_heads <= 0 || o.kv_heads <= 0 || o.qo_heads % o.kv_heads != 0 || o.head_dim <= 0 ||
      o.head_dim > kernels::kTreeAttnMaxHeadDim)
    return InvalidArgumentError("tree attention plan: bad head geometry");
  const int64_t group = o.qo_heads / o.kv_heads;
  // Whether a masked request's window chunks may be spread (see the options), and the blocks a
  // spread chunk adds.
  const bool spreads =
      o.spread_windows && rows_per_item == kernels::kTreeAttnMmaRowsPerBlock && group * 4 < 16;
  auto spread_extra = [&](const kernels::TreeAttentionRequest& r) -> int64_t {
    if (!spreads || r.mask_begin < 0) return 0;
    const int64_t rows = r.token_count * group;
    return (CeilDiv(rows, kernels::kTreeAttnSpreadRows) - CeilDiv(rows, rows_per_item)) *
           o.kv_heads;
  };
  TreeAttentionPlan plan;
  int32_t expect = 0;
  int32_t max_kv = 0;
  int64_t base_blocks = 0, extra_blocks = 0;
  for (auto& r : requests) {
    if (r.token_begin != expect || r.token_count <= 0 || r.kv_prefix < 0 || r.masked_kv < 0)
      return InvalidArgumentError("tree attention plan: requests not contiguous and non-empty");
    r.kv_len = r.kv_prefix + r.masked_kv + r.token_count;
    max_kv = std::max(max_kv, r.kv_len);
    if (r.mask_begin >= 0) plan.max_window = std::max(plan.max_window, r.masked_kv + r.token_count);
    base_blocks += CeilDiv(r.token_count * group, rows_per_item) * o.kv_heads;
    extra_blocks += spread_extra(r);
    expect += r.token_count;
  }
  plan.num_tokens = expect;

  // Chunk length: the whole context unless the GPU would be underused and the workspace allows.
  // Splitting leaves room for the spread window chunks where they fit beside the base blocks.
  const int64_t split_target = base_blocks + extra_blocks <= o.target_blocks
                                   ? o.target_blocks - extra_blocks
                                   : o.target_blocks;
  int64_t chunk = CeilDiv(std::max(max_kv, 1), kTreeAttnTileKv) * kTreeAttnTileKv;
  if (o.fixed_chunk > 0) {
    chunk = CeilDiv(o.fixed_chunk, kTreeAttnTileKv) * kTreeAttnTileKv;
  } else if (base_blocks < split_target && o.partial_capacity_rows > 0) {
    const int64_t splits = CeilDiv(split_target, std::max<int64_t>(base_blocks, 1));
    int64_t c = CeilDiv(CeilDiv(max_kv, splits), kTreeAttnTileKv) * kTreeAttnTileKv;
    c = std::max<int64_t>(c, CeilDiv(o.min_chunk, kTreeAttnTileKv) * kTreeAttnTileKv);
    // Rounding to whole tiles can leave a few blocks more than fill the GPU once (a second wave
    // for them alone): lengthen the chunk a tile at a time until the blocks fit.
    while (c < chunk && base_blocks * CeilDiv(max_kv, c) > split_target) c += kTreeAttnTileKv;
    for (; c < chunk; c *= 2) {
      int64_t rows = 0;
      for (const auto& r : requests) {
        const int64_t n = CeilDiv(r.kv_len, c);
        if (n > 1) rows += n * r.token_count * o.qo_heads;
      }
      if (rows <= o.partial_capacity_rows) {
        chunk = c;
        break;
      }
    }
  }
  plan.kv_chunk = static_cast<int32_t>(chunk);
  plan.rows_per_item = rows_per_item;

  plan.token_request.resize(static_cast<size_t>(expect));
  int64_t blocks = 0;
  for (auto& r : requests) {
    r.num_chunks = static_cast<int32_t>(CeilDiv(std::max(r.kv_len, 1), chunk));
    blocks += r.num_chunks * CeilDiv(r.token_count * group, rows_per_item) * o.kv_heads;
  }
  // Each request's last chunk comes first: it holds the tree's window, whose tiles run token by
  // token and take longest, so those blocks start in the first wave and the others fill around
  // them. The chunks from the one holding the window's first tile on are spread where they fit.
  std::vector<kernels::TreeAttentionWorkItem> rest;
  for (size_t ri = 0; ri < requests.size(); ++ri) {
    auto& r = requests[ri];
    r.partial_begin = 0;
    if (r.num_chunks > 1) {
      r.partial_begin = plan.partial_rows;
      plan.partial_rows += static_cast<int64_t>(r.num_chunks) * r.token_count * o.qo_heads;
      plan.any_split = true;
    }
    std::fill_n(plan.token_request.begin() + r.token_begin, r.token_count,
                static_cast<int32_t>(ri));
    const int32_t rows = static_cast<int32_t>(r.token_count * group);
    const int32_t first_window_chunk =
        static_cast<int32_t>(r.kv_prefix / kTreeAttnTileKv * kTreeAttnTileKv / chunk);
    const int64_t extra = spread_extra(r) * (r.num_chunks - first_window_chunk);
    const bool spread = extra > 0 && blocks + extra <= o.target_blocks;
    if (spread) blocks += extra;
    for (int32_t c = r.num_chunks - 1; c >= 0; --c) {
      const bool spread_c = spread && c >= first_window_chunk;
      const int32_t step = spread_c ? kernels::kTreeAttnSpreadRows : rows_per_item;
      for (int32_t row = 0; row < rows; row += step) {
        (c == r.num_chunks - 1 ? plan.work : rest)
            .push_back({static_cast<int32_t>(ri), row, c, spread_c ? 1 : 0});
        plan.spread_items += spread_c ? 1 : 0;
      }
    }
  }
  plan.work.insert(plan.work.end(), rest.begin(), rest.end());
  if (plan.partial_rows > o.partial_capacity_rows)
    return ResourceExhaustedError("tree attention plan: " + std::to_string(plan.partial_rows) +
                                  " partial rows exceed the workspace's " +
                                  std::to_string(o.partial_capacity_rows));
  return plan;
}

}  // namespace specinfer::cuda
