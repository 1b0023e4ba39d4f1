// Tree attention on the GPU: one fused kernel for every new token of a batch of requests, each
// token attending to its request's committed KV entries and to the subset of the request's
// masked window (earlier tree entries + the new tokens) that its mask row allows: decode (one
// token), causal prefill (a chain) and token-tree verification are the same kernel.
//
// Computes, for token t of request r, query head h and kv head kvh = h / (qo_heads / kv_heads):
//   out[t, h, :] = sum_p softmax_p(scale * q[t, h, :] . K[p, kvh, :]) V[p, kvh, :]
// over the visible logical positions p of r: every p < kv_prefix, and p = kv_prefix + j for the
// window entries j (< masked_kv + token_count) whose bit is set in the token's mask row (bit j of
// word j / 64; mask_begin < 0 means causal: j <= i for the i-th new token). A row that sees
// nothing gets zeros. Logical position p lives in slot block_tables[p / block_size] * block_size
// + p % block_size of the paged cache.
// Sliding window (params.sliding_window = W > 0, one layer's): a token at rotary position P sees
// only the keys of its virtual sequence (below) at index v >= P - W + 1. The virtual index of a
// key is its position (the committed prefix, then the window entries by depth, as the engine
// lays out trees), so this is ModelConfig::sliding_window's rule, the CPU's (cpu::AttendKvHead):
// keys at positions p with P - p < W. Tiles before every row's window in a block are skipped
// (not read): a long context costs about the window (a chunk wholly before it only writes its
// empty partial rows).
// Soft-capping (params.softcap = cap > 0, Gemma 2): every score s = scale q.k becomes
// cap tanh(s / cap) before the softmax (computed in the kernels' base-2 units: the same function
// of s, rounded differently from the CPU's by tanhf).
// Layout: q [num_tokens, qo_heads, head_dim] T; k_cache, v_cache (one layer)
//   [num_slots, kv_heads, head_dim] T; out [num_tokens, qo_heads, head_dim] OutT; T is float32,
//   fp16 or bf16 and OutT float32 or T. All arithmetic in float32 with an online softmax
//   (base-2 exponentials, scale * log2(e) folded into q).
// Order: a row's keys form its "virtual" sequence: positions 0..kv_prefix-1, then the window
//   entries its mask shows, compacted, in order. KV chunks and 32-key tiles are cut in that
//   sequence, and every tile goes through the same arithmetic whatever its kind: scores q . k
//   (4 fixed partial sums of fmas, added pairwise), the tile's max, one rescale of the running
//   max, sum and output (online softmax per tile), the tile's sum of p by a fixed butterfly,
//   and p.V as one fma chain per output element over the tile's keys in order. So a row's
//   result depends only on the keys it sees, in order: bit for bit the same in any batch, and
//   for a tree node the same as decoding its root-to-node path one token at a time (what keeps
//   speculative greedy output equal to incremental output).
// Launch (flashinfer-style plan/run split): the host plan (backend/cuda/tree_attention_plan.h)
//   cuts the work into items of (request, 16 consecutive (token, group-head) rows, KV chunk)
//   (64 rows on the tensor-core path below); the run launches grid (num_work, kv_heads) blocks
//   of 128 threads. On CUDA cores, row r belongs to warp r % 4 (softmax: a lane per key; output: a
//   lane per head_dim / 32 contiguous dims). Tiles that hold the same keys for every row (inside
//   the committed prefix, or any tile of a causal request) are staged in shared memory as T
//   (16-byte loads when head_dim allows, the next tile loaded into registers while this one is
//   computed), and their scores are computed by thread (key, quarter of head_dim) for all the
//   block's rows; tiles reaching into a tree's window (the last few of a row) are read per row from
//   global memory by the row's warp. Requests cut into several chunks write partial (max, sum,
//   output) rows that a second kernel merges. head_dim <= 256.
// Tensor-core path (kernels/tree_attention_mma.cu): fp16/bf16 inputs with head_dim 64 or 128
//   always take it (whatever the batch, so the property above holds within it). The same virtual
//   sequence and tiles; a block holds 64 rows (4 warps x 16), and every tile, shared or not, goes
//   through the same warp-level arithmetic: scores q . k as mma.sync m16n8k16 (16-bit q and k,
//   products exact, float32 accumulation over head_dim in 16-wide steps), the tile's softmax in the
//   fragments (max and a fixed sum per row, quad butterflies), and p.V as mma with p split into
//   16-bit parts whose sum is p to about float32 precision (fp16: p * 2^15 in two parts, so the
//   low part stays normal; bf16: three parts). A tile reaching into a tree's window is gathered
//   per token (its row's compacted keys in the same tile positions) into the warp's own shared
//   memory and run with only that token's rows active; the rows of an mma do not affect each
//   other's results (mma.cuh), so a row's bits depend only on its keys, as above. Spread items
//   (the plan's, for the chunks holding a wide tree's window) give each warp 4 rows of a 16-row
//   item instead, the same arithmetic per row.
// Tolerance against the CPU reference (float32 K/V): 2e-5 + 2e-5 |ref|; with fp16/bf16 inputs
//   against an fp64 reference on the same rounded inputs: 1e-3 + 1e-3 |ref| (fp16), 1e-2 (bf16)
//   when OutT is the 16-bit type (its rounding dominates), 2e-5 when OutT is float32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specinfer::kernels {

inline constexpr int kTreeAttnRowsPerBlock = 16;  // (token, group head) rows per work item
inline constexpr int kTreeAttnTileKv = 32;        // KV positions per shared-memory tile
inline constexpr int kTreeAttnMaxHeadDim = 256;
inline constexpr int kTreeAttnMmaRowsPerBlock = 64;  // rows per work item on tensor cores
inline constexpr int kTreeAttnSpreadRows = 16;  // rows of a spread item (4 per warp, see below)

enum class AttnType : int32_t { kF32, kF16, kBF16 };

// Whether attention over inputs of in_type with this head size runs on tensor cores (see the
// header comment): a fixed choice, so a token's result does not depend on its batch.
inline constexpr bool TreeAttentionUsesMma(AttnType in_type, int32_t head_dim) {
  return in_type != AttnType::kF32 && (head_dim == 64 || head_dim == 128);
}
// The rows per work item the plan must cut for that kernel.
inline constexpr int32_t TreeAttentionRowsPerItem(AttnType in_type, int32_t head_dim) {
  return TreeAttentionUsesMma(in_type, head_dim) ? kTreeAttnMmaRowsPerBlock : kTreeAttnRowsPerBlock;
}

// One request of the batch (host-filled; num_chunks and partial_begin by the plan).
struct TreeAttentionRequest {
  int32_t token_begin = 0;        // its first token (row of q and out)
  int32_t token_count = 0;        // its new tokens
  int32_t kv_prefix = 0;          // committed entries every new token sees
  int32_t masked_kv = 0;          // window entries before the new tokens (see backend.h)
  int32_t block_table_begin = 0;  // index of its first block in block_tables
  int32_t mask_words_per_row = 0;
  int64_t mask_begin = -1;    // index of its row 0's first mask word; < 0: causal
  int32_t num_chunks = 1;     // KV chunks it is cut into (plan); 1: written straight to out
  int32_t kv_len = 0;         // kv_prefix + masked_kv + token_count (plan)
  int64_t partial_begin = 0;  // first partial row (plan): row (chunk * token_count + i) *
                              // qo_heads + h after it
};

// One block's work: rows [row_begin, row_begin + rows_per_item) of request `request`, row = i *
// group + g (token i, query head kvh * group + g), over KV positions [chunk * kv_chunk, (chunk + 1)
// * kv_chunk).
// spread (tensor-core kernel only): the item holds kTreeAttnSpreadRows rows instead, 4 per warp,
// so that the tiles of a tree's window, which a warp runs one token at a time, are shared by
// four times the warps (the plan spreads the chunks holding a window where the launch still fits
// the GPU once). Which rows share a block does not change any row's bits.
struct TreeAttentionWorkItem {
  int32_t request = 0;
  int32_t row_begin = 0;
  int32_t chunk = 0;
  int32_t spread = 0;
};

struct TreeAttentionParams {
  const void* q = nullptr;        // [num_tokens, qo_heads, head_dim] T
  const void* k_cache = nullptr;  // [slots, kv_heads, head_dim] T, one layer
  const void* v_cache = nullptr;
  void* out = nullptr;                             // [num_tokens, qo_heads, head_dim] OutT
  const int32_t* block_tables = nullptr;           // device
  const uint64_t* mask_words = nullptr;            // device
  const TreeAttentionRequest* requests = nullptr;  // device [num_requests]
  const TreeAttentionWorkItem* work = nullptr;     // device [num_work]
  const int32_t* token_request = nullptr;          // device [num_tokens] (merge only)
  float* partial_out = nullptr;  // [partial rows, head_dim] (when any request is split)
  float* partial_ml = nullptr;   // [partial rows, 2]: running max (log2 units) and sum
  int32_t num_tokens = 0;
  int32_t num_work = 0;
  int32_t qo_heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t kv_chunk = 0;  // multiple of kTreeAttnTileKv
  // Rows per work item of the plan: TreeAttentionRowsPerItem(in_type, head_dim), checked.
  int32_t rows_per_item = kTreeAttnRowsPerBlock;
  // The most window entries (masked_kv + token_count) of a masked request (plan): the
  // tensor-core kernel sizes its shared window for them (a larger one is read from global memory,
  // with the same result, slower).
  int32_t max_window = 0;
  float scale = 0.0f;      // usually 1 / sqrt(head_dim)
  bool any_split = false;  // some request has num_chunks > 1: run the merge
  // This layer's sliding window (0: none) and, with one, each token's rotary position.
  int32_t sliding_window = 0;
  const int32_t* positions = nullptr;  // device [num_tokens]
  float softcap = 0.0f;                // attention soft-capping (0: none)
};

// Runs the attention (and the merge when any_split). in_type is T; out_float selects OutT =
// float32 (else OutT = T).
cudaError_t LaunchTreeAttention(const TreeAttentionParams& params, AttnType in_type, bool out_float,
                                cudaStream_t stream);

}  // namespace specinfer::kernels
