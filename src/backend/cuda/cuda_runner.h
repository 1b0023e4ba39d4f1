// The CUDA backend: runs a Llama-family model on one NVIDIA GPU behind the same ModelRunner
// interface as the CPU backend (backend/backend.h), so the engine, speculation and serving code
// run unchanged on it.
//
// What is supported:
//   - the whole Llama/Qwen2/Qwen3/Mistral/Gemma 2/Gemma 3 forward pass of a ForwardBatch (decode,
//     causal prefill chunks and token-tree verification of many sequences at once): embedding
//     gather (+ Gemma's scale), RMSNorm, Q/K/V/O and SwiGLU/GeGLU projections (+ Qwen2 biases,
//     per-head QK-norm, Gemma's post-norms and attention scale, Gemma 2's soft-capping),
//     sliding-window layers (with Gemma 3's local RoPE base), RoPE in both pairings (interleaved
//     and half) with the host's scaled frequencies, the fused tree-attention kernel over the paged KV cache
//     (packed-bit masks, grouped-query attention, split KV for long contexts), final norm and
//     classifier for the requested logit rows;
//   - weights F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q2_K, Q3_K, Q4_K,
//     Q5_K, Q6_K (every type the CPU reads; others are refused naming the type), uploaded
//     once at Create; quantised weights stay quantised on the GPU: products read the blocks
//     directly (kernels/linear.cuh), and batch-dependent prompt passes dequantise a matrix into
//     an fp16 workspace for cuBLAS;
//   - matrix products: a batch-invariant kernel (bit-identical outputs for a token whatever it
//     is batched with, as ForwardBatch::batch_invariant requires: decode and tree passes) and
//     cuBLAS (fp32 SGEMM without TF32 for F32 weights, fp16/bf16 GEMM with fp32 accumulation
//     otherwise) for batches that allow batch-dependent results with >= cublas_min_tokens tokens;
//   - the KV cache in fixed-size blocks on the GPU ([layer][slot][kv_dim], KvCacheManager's block
//     tables), in float32 (default for float32 models: greedy output equals the CPU backend's
//     token for token on stories260K) or fp16/bf16; MoveKv compacts an accepted tree path;
//   - device memory planned up front: weights + KV blocks + workspace for max_batch_tokens tokens
//     are computed and allocated at Create, and a shortfall is ResourceExhausted with the sizes,
//     never a crash; larger batches run in pieces of max_batch_tokens tokens.
//   - one share of a model split tensor-parallel (TP) x pipeline-parallel (PP) over GPUs
//     (CudaRunnerOptions::layout and ::collective): exactly the CPU's split
//     (backend/cpu/shard_runner.h: by OUTPUT ROWS with all-gathers, SplitEvenly shares, stage s
//     holds layers SplitEvenly(n_layers, S, s), the last stage's ranks compute their vocabulary
//     rows of the logits), with the collectives on device buffers
//     (backend/cuda/device_collective.h: NCCL, or ranks as threads on the emulator). Each output
//     element is still one weight row's product with the full input, so a share's batch-invariant
//     logits are bit-identical to the whole-model runner's columns; a 1 x 1 layout runs exactly the
//     whole-model pass (no extra copies or launches). All ranks must use the same max_batch_tokens
//     (pieces line up).
//   - greedy rows' argmax on the device (ForwardArgmax: ForwardBatch::argmax_rows), and a
//     sampled sequence's token drawn there too (ForwardBatch::draws: temperature, top-k, top-p
//     and the uniform its random stream supplied): the classifier's output stays on the GPU and
//     only token ids come back.
//   - CUDA graphs (CudaRunnerOptions::cuda_graphs): a batch-invariant pass whose wanted rows fit
//     a classifier chunk of each kind (up to 128 logits rows and 128 argmax rows) is captured
//     into a graph the second time its shape comes, and later passes of that shape only upload
//     their metadata (tokens, positions, slots, masks, block tables: a fixed layout per shape)
//     and launch the graph. A shape is everything a launch takes by value: tokens, sequences,
//     mask words, attention work items and chunking, rows wanted. Decode at a given batch size
//     keeps one graph while the contexts grow (the work items change only every attention
//     chunk), a fixed tree shape one more. A share of a TP x PP group captures its collectives
//     too (DeviceCollective::capturable: NCCL, and the in-process collective on the emulator);
//     the shape depends on the batch alone, so every rank captures and replays the same passes,
//     as NCCL requires. A failed capture turns graphs off for a whole-model runner (warning
//     logged, the pass runs eagerly); on a share it fails the pass (so the group: its peers
//     captured it), and graphs come back on when the group is re-formed (SetCollective).
//   - a sampled token tree's distributions computed on the device (ForwardBatch::dist_rows):
//     multi-step speculative sampling on the host gets each node's kept tokens and their
//     probabilities, not its logits.
// Not done: rows of
// requests that read logits (logprobs) come back as logits. Numerics
// against the CPU backend (float32 weights and KV): products and attention differ only in summation
// order (relative differences ~1e-6 on logits), RoPE tables are the CPU's. Within the GPU,
// batch-invariant passes are bit-exact: a token's logits do not depend on its batch, and a tree
// node's equal those of decoding its path token by token (kernels/linear.cuh,
// kernels/tree_attention.cuh), so speculative greedy output equals incremental output.
//
// Thread safety: one Forward/MoveKv at a time (the engine's step loop), as the CPU runner.
// This header has no CUDA types; it exists only in builds with SPECINFER_WITH_CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/collective.h"
#include "backend/cpu/shard_runner.h"
#include "backend/cuda/device_collective.h"
#include "tensor/dtype.h"

namespace specinfer::cuda {

enum class KvCacheType { kAuto, kF32, kF16, kBF16 };  // kAuto: F32 for float32 models, else F16

struct CudaRunnerOptions {
  int32_t device = 0;
  int32_t num_kv_blocks = 0;  // KV storage, in blocks of kv_block_size positions
  int32_t kv_block_size = 16;
  // Workspace is planned for this many tokens per pass; larger batches run in pieces.
  int32_t max_batch_tokens = 512;
  KvCacheType kv_type = KvCacheType::kAuto;
  // Batches with batch_invariant == false and at least this many tokens use cuBLAS.
  int32_t cublas_min_tokens = 16;
  // Attention splits every sequence's KV into chunks of this many positions (0: max(512,
  // context / 16)), the same in every batch so results stay batch-invariant; the workspace for
  // the chunks' partial results is planned for max_batch_tokens tokens at full context.
  int32_t attention_chunk = 0;
  // This runner's share of the model; with more than one rank, `collective` (whose layout must
  // equal it) connects it to its peers (null: passes fail with FAILED_PRECONDITION until
  // SetCollective gives it one). 1 x 1: the whole model, no collective.
  CollectiveLayout layout;
  std::shared_ptr<DeviceCollective> collective;
  // CUDA graphs: a batch-invariant pass (decode, token-tree verification) of a shape seen before
  // is replayed from a graph captured the second time that shape came (one launch instead of a
  // few hundred); false: every pass is launched kernel by kernel (vLLM's --enforce-eager).
  bool cuda_graphs = true;
  int32_t max_graphs = 64;  // graphs kept, least recently used dropped first
};

// What the graph cache did (CudaModelRunner::graph_stats).
struct CudaGraphStats {
  int64_t captured = 0;   // graphs captured and instantiated
  int64_t replayed = 0;   // passes (pieces) run by launching a graph
  int64_t eager = 0;      // passes (pieces) launched kernel by kernel
  int64_t evicted = 0;    // graphs dropped for newer ones
  bool disabled = false;  // a capture or instantiation failed: graphs were turned off
};

// Device memory the runner holds, in bytes.
struct CudaMemoryPlan {
  int64_t weights = 0;
  int64_t kv_cache = 0;
  int64_t workspace = 0;
  int64_t total() const { return weights + kv_cache + workspace; }
  std::string ToString() const;
};

class CudaModelRunner final : public ModelRunner {
 public:
  ~CudaModelRunner() override;

  // Uploads the model's weights and allocates the KV cache and workspace on `options.device`.
  // FailedPrecondition without a device; Unimplemented for weight types the backend cannot use;
  // ResourceExhausted (with the planned sizes) when the GPU has too little memory.
  static StatusOr<std::unique_ptr<CudaModelRunner>> Create(std::shared_ptr<const Model> model,
                                                           const CudaRunnerOptions& options);

  // A model of shape `config` whose weights are generated on the GPU (seeded uniform values of
  // `weight_type`, F32 or F16; norm gains near 1), for benchmarks: no host copy ever exists.
  // model().weights() is empty.
  static StatusOr<std::unique_ptr<CudaModelRunner>> CreateRandom(const ModelConfig& config,
                                                                 DType weight_type, uint64_t seed,
                                                                 const CudaRunnerOptions& options);

  const Model& model() const override;
  std::string name() const override;
  // With a TP x PP layout, every rank of the group runs the same batches in the same order (each
  // with its own KvCacheManager making the same plans, or the same block tables); on the last
  // stage `logits` holds [logit_rows, vocab().count] (this rank's columns), elsewhere it is not
  // touched. A failed pass aborts the group (its peers' passes fail instead of waiting).
  Status Forward(const ForwardBatch& batch, const KvCacheManager& kv,
                 std::span<float> logits) override;
  // The argmax rows' ids (argmaxes or draws) are found on the GPU (kernels/sampling.cuh), after
  // the classifier: only they cross to the host, not [argmax_rows, vocab] floats. A share (TP > 1)
  // refuses it: its rows' argmax over its columns alone is ForwardWithTables' ArgmaxShare.
  // Distribution rows (ForwardBatch::dist_rows) become distributions on the GPU too
  // (kernels/sampling.cuh DistRows), and only what each keeps crosses: its tokens and their
  // probabilities when top-k/top-p leave few, else the row's vocab probabilities.
  Status ForwardArgmax(const ForwardBatch& batch, const KvCacheManager& kv, std::span<float> logits,
                       std::span<int32_t> argmax, DistRows* dists = nullptr) override;
  // Sampled draws run on the device (kernels/sampling.cuh DrawTokens); not on a share.
  bool draws_tokens() const override;
  // True but on a share (ForwardArgmax is the whole model's; a share's are ForwardWithTables').
  bool returns_distributions() const override;
  // 2 with CUDA graphs (a shape is captured the second time it comes), else 0; a share too
  // (whether its group's operations can be captured is known only once it has one).
  int32_t warmup_passes() const override;
  Status MoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                std::span<const int32_t> dst) override;
  // The same, with the block tables given directly (an LLM worker, which gets them with every
  // batch): tables[i] is that of batch.seqs[i]; they are checked against the KV storage. On the
  // last stage `argmax` ([argmax_rows]) receives each argmax row's largest logit over this
  // rank's columns and its (model-wide) token id, for the group's ranks' shares to combine; and
  // `dists` the distribution rows (required with them on the last stage, untouched before it):
  // with TP > 1 the last stage's ranks all-gather those rows' columns and each computes the
  // whole distributions.
  Status ForwardWithTables(const ForwardBatch& batch,
                           std::span<const std::span<const int32_t>> tables,
                           std::span<float> logits, std::span<ArgmaxShare> argmax = {},
                           DistRows* dists = nullptr);
  Status MoveKvWithTable(std::span<const int32_t> table, std::span<const int32_t> src,
                         std::span<const int32_t> dst);

  // Replaces the group of a share (a worker re-forms it under a new epoch); null: none. Drops
  // the graphs held (they hold the old group's operations) and turns graphs back on if a failed
  // capture had turned them off. InvalidArgument if its layout is not the runner's.
  Status SetCollective(std::shared_ptr<DeviceCollective> collective);
  const CollectiveLayout& layout() const;
  ShardRange layers() const;  // the layers this stage holds
  ShardRange vocab() const;   // the logits columns this rank computes (last stage)
  bool last_stage() const { return layout().stage + 1 == layout().num_stages; }
  int32_t num_kv_blocks() const override;
  int32_t kv_block_size() const override;

  const CudaMemoryPlan& memory_plan() const;
  CudaGraphStats graph_stats() const;
  // Turns graph replay on or off from the next pass (benchmarks time both on one runner); off
  // drops the graphs held. Not while a pass runs.
  void SetCudaGraphs(bool on);
  // Waits for the GPU and returns the first asynchronous error, if any (benchmarks use it to
  // time passes).
  Status Synchronize();

  struct Impl;

 private:
  explicit CudaModelRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specinfer::cuda
