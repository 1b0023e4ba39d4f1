// The Llama layer program on CPUs, for one worker's share of a model split tensor-parallel (TP)
// x pipeline-parallel (PP), or for the whole model (a 1 x 1 layout: CpuModelRunner is a thin
// ModelRunner adapter over it). A share's logits are BIT-IDENTICAL to the whole model's for the
// same batch (batch-invariant kernels); the steps themselves are backend/llama_program.h.
//
// Why the split is by OUTPUT ROWS everywhere, with all-gathers (not Megatron's all-reduce):
// the CPU kernels compute every output element as an independent dot product of one weight row
// with one token's full input (cpu::MatMul with batch_invariant), so a rank that computes a
// subset of a matrix's rows from the full input gets exactly the values the 1 x 1 layout gets
// for those rows. Megatron's scheme splits wo and w_down by INPUT columns and sums
// partial products with an all-reduce: that changes the summation order of every output and
// breaks bit-exactness (greedy output would drift from the single-process engine). So, per layer
// on a TP group of size T, rank r:
//   attn_norm(x)                      redundant on every rank (x: [n, dim] on every rank)
//   q, k, v = rows of wq/wk/wv         its query heads [r*H/T, (r+1)*H/T) and the matching KV
//                                      heads (GQA: T must divide n_kv_heads, else refused)
//   rope, KV write, attention          its heads only, against its KV shard
//   all-gather attention outputs   ->  [n, q_dim]
//   wo rows [dim share of r]           all-gather -> [n, dim]; residual add (redundant)
//   ffn_norm                           redundant
//   w_gate/w_up rows [hidden share]    SwiGLU on its share; all-gather -> [n, hidden]
//   w_down rows [dim share]            all-gather -> [n, dim]; residual add (redundant)
// Four all-gathers per layer, each of n * width floats. Pipeline: stage s runs the contiguous
// layer range SplitEvenly(n_layers, S, s); stage 0 embeds, stages pass x [n, dim] on through the
// Collective (tp rank r of stage s to tp rank r of stage s+1), the last stage applies the final
// norm and its vocabulary rows [share of r] of the output matrix: each last-stage rank returns
// its logits columns, which the request manager assembles (no all-gather of logits).
// Non-batch-invariant batches (BLAS prefill) are computed correctly but, like BLAS itself, not
// bit-identically to the 1 x 1 layout. With a 1 x 1 layout every gather is a no-op: the steps
// write straight into the full buffers, so the whole-model pass makes no extra copies.
//
// KV: each rank stores only its KV heads of its layers: [local layer][slot][kv_dim / T], slots
// addressed through the block tables the manager sends with every batch.
//
// Thread safety: one Forward/MoveKv at a time; runs on its thread pool (its own, or one shared
// with runners that take turns with it).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/collective.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "common/thread_pool.h"
#include "model/model.h"

namespace specinfer {

// A contiguous share [begin, begin + count).
struct ShardRange {
  int64_t begin = 0, count = 0;
  int64_t end() const { return begin + count; }
};
// Part `index` of `parts` as-even-as-possible shares of [0, total) (the first total % parts
// shares are one longer).
ShardRange SplitEvenly(int64_t total, int32_t parts, int32_t index);

// Checks that `config` can be split this way: stages <= layers, tp divides n_kv_heads.
Status CheckShardable(const ModelConfig& config, const CollectiveLayout& layout);

struct CpuRunnerOptions {
  int32_t num_threads = 0;    // 0: all hardware threads
  int32_t num_kv_blocks = 0;  // KV storage, in blocks of kv_block_size positions
  int32_t kv_block_size = 16;
  // Threads to run on, shared with other runners that take turns with this one (an LLM and its
  // draft models); null: a pool of num_threads of its own.
  std::shared_ptr<ThreadPool> pool;
};

class CpuShardRunner {
 public:
  // `model` holds the full weights (typically a mapped file: only this shard's pages are read).
  // Checks that every weight type of the share is supported and allocates its KV storage
  // (ResourceExhausted if it cannot be allocated).
  static StatusOr<std::unique_ptr<CpuShardRunner>> Create(std::shared_ptr<const Model> model,
                                                          const CollectiveLayout& layout,
                                                          const CpuRunnerOptions& options);

  const Model& model() const { return *model_; }
  const CollectiveLayout& layout() const { return layout_; }
  ShardRange layers() const { return layers_; }
  ShardRange vocab() const { return vocab_; }  // output rows computed on the last stage
  bool last_stage() const { return layout_.stage + 1 == layout_.num_stages; }
  int32_t num_kv_blocks() const { return num_kv_blocks_; }
  int32_t kv_block_size() const { return kv_block_size_; }
  const std::shared_ptr<ThreadPool>& pool() const { return pool_; }

  // Runs this shard's part of the batch. tables[i] is the block table of batch.seqs[i]. The
  // caller has validated the batch (CheckForward, or ForwardBatch::Validate and the tables:
  // block ids < num_kv_blocks, long enough for kv_end()). `group` may be null only for a 1 x 1
  // layout. On the last stage, `logits` ([logit_rows, vocab().count], row-major) receives the
  // logits and must be at least that large; elsewhere it is not touched.
  Status Forward(const ForwardBatch& batch, std::span<const std::span<const int32_t>> tables,
                 Collective* group, std::span<float> logits);

  // Last stage: all-gathers `n` rows of this rank's logits columns (`local`, [n, vocab().count])
  // into whole rows (`full`, [n, vocab_size]) on every TP rank of the stage; a collective, which
  // each of them calls with the same n. With tp_size 1 it copies.
  Status GatherVocabRows(Collective* group, const float* local, int64_t n, float* full);

  // Copies this shard's K/V at positions src[i] to dst[i] of the sequence with `table`, in
  // order. The caller has validated the positions and block ids.
  void MoveKv(std::span<const int32_t> table, std::span<const int32_t> src,
              std::span<const int32_t> dst);

 private:
  class Pass;  // one Forward: the operations of backend/llama_program.h on this share

  CpuShardRunner() = default;
  float* KeyAt(int32_t local_layer, int64_t slot) {
    return k_cache_.get() + (static_cast<size_t>(local_layer) * kv_slots_ + slot) * kv_dim_;
  }
  float* ValueAt(int32_t local_layer, int64_t slot) {
    return v_cache_.get() + (static_cast<size_t>(local_layer) * kv_slots_ + slot) * kv_dim_;
  }
  // All-gathers `local` ([n, shares[tp_rank]]) into `full` ([n, sum(shares)]), token-major.
  // With tp_size 1 the two are the same buffer and nothing is done.
  Status Gather(Collective* group, const float* local, int64_t n,
                std::span<const ShardRange> shares, float* full);

  // This rank's rows of one layer's matrices (views into the model's weights, with their tiles).
  struct LayerShard {
    cpu::CpuMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
    WeightVector bq, bk, bv;
  };

  std::shared_ptr<const Model> model_;
  CollectiveLayout layout_;
  std::shared_ptr<ThreadPool> pool_;
  cpu::RopeTable rope_;
  cpu::RopeTable rope_local_;  // sliding-window layers with their own RoPE base (Gemma 3)
  ShardRange layers_, vocab_;
  std::vector<ShardRange> heads_;    // per TP rank: query heads
  std::vector<ShardRange> kv_heads_;  // per TP rank
  std::vector<ShardRange> q_cols_, dim_rows_, hidden_rows_;  // per TP rank, in floats
  std::vector<ShardRange> vocab_cols_;  // per TP rank: output rows (last stage)
  std::vector<LayerShard> shards_;   // [layers_.count]
  cpu::CpuMatrix output_;            // vocab_ rows of the output matrix
  int32_t num_kv_blocks_ = 0, kv_block_size_ = 0;
  int64_t kv_slots_ = 0;
  int32_t kv_dim_ = 0;               // this rank's KV width: local kv heads * head_dim
  // [local layer, slot, kv_dim_], zeroed. calloc'ed: the kernel hands zero pages out as they are
  // first touched, so a daemon sized for many long sequences starts at once and holds only the
  // memory its sequences used (a zero-filled vector made every page resident at start-up:
  // 1.9 GB and 1 s for SmolLM2's default cache).
  struct FreeFloats {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], FreeFloats> k_cache_, v_cache_;

  // Activations, grown to the largest batch seen. att_full_, part_ and ffn_full_ (the gathered
  // or TP-local halves of a step) stay empty with tp_size 1: the steps use att_, xb_ and gate_.
  std::vector<float> x_, xb_, q_, k_, v_, att_, att_full_, part_, gate_, up_, ffn_full_,
      gathered_, final_;
  std::vector<uint8_t> act_scratch_;
};

}  // namespace specinfer
