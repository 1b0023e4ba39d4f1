#include "backend/cuda/cuda_runner.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <unordered_set>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/tree_attention_plan.h"
#include "backend/forward_check.h"
#include "backend/llama_program.h"
#include "dequant.cuh"
#include "elementwise.cuh"
#include "kv_cache.cuh"
#include "linear.cuh"
#include "random_fill.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "sampling.cuh"
#include "tree_attention.cuh"

namespace specinfer::cuda {

namespace {

using kernels::ElemType;

constexpr int64_t kAlign = 256;
int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

StatusOr<ElemType> ToElemType(DType t, const std::string& what) {
  switch (t) {
    case DType::kF32:
      return ElemType::kF32;
    case DType::kF16:
      return ElemType::kF16;
    case DType::kBF16:
      return ElemType::kBF16;
    case DType::kQ8_0:
      return ElemType::kQ8_0;
    case DType::kQ4_0:
      return ElemType::kQ4_0;
    case DType::kQ4_1:
      return ElemType::kQ4_1;
    case DType::kQ5_0:
      return ElemType::kQ5_0;
    case DType::kQ5_1:
      return ElemType::kQ5_1;
    case DType::kQ2_K:
      return ElemType::kQ2_K;
    case DType::kQ3_K:
      return ElemType::kQ3_K;
    case DType::kQ4_K:
      return ElemType::kQ4_K;
    case DType::kQ5_K:
      return ElemType::kQ5_K;
    case DType::kQ6_K:
      return ElemType::kQ6_K;
    default:
      return UnimplementedError("the CUDA backend cannot use " + std::string(DTypeName(t)) +
                                " weights (" + what +
                                "); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                                "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K");
  }
}

struct DeviceMatrix {
  ElemType type = ElemType::kF32;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  int64_t bytes() const { return rows * kernels::ElemRowBytes(type, cols); }
  bool quantized() const { return kernels::ElemBlockElems(type) > 1; }
};

struct DeviceLayer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;  // [head_dim] each, with qk_norm
  const float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;  // [dim] each, post_norms
  DeviceMatrix wq, wk, wv, wo, w_gate, w_down, w_up;
};

// Sub-allocations of one buffer, by offset.
struct Arena {
  int64_t size = 0;
  int64_t Add(int64_t bytes) {
    const int64_t off = size;
    size += AlignUp(std::max<int64_t>(bytes, 1));
    return off;
  }
};

// A weight to place: from the host model (host != nullptr) or generated (random).
struct MatrixSlot {
  const void* host = nullptr;
  DType type = DType::kF32;
  int64_t rows = 0, cols = 0;
  DeviceMatrix* target = nullptr;
  int64_t offset = 0;
  int64_t bytes = 0;
  bool alias = false;  // same host data as an earlier slot (tied output): shares its memory
};
struct VectorSlot {
  const float* host = nullptr;
  int64_t size = 0;
  float fill = 1.0f;  // random models: value around which gains are drawn
  const float** target = nullptr;
  int64_t offset = 0;
};

}  // namespace

std::string CudaMemoryPlan::ToString() const {
  return "weights " + MiB(weights) + ", KV cache " + MiB(kv_cache) + ", workspace " +
         MiB(workspace) + " (total " + MiB(total()) + ")";
}

struct CudaModelRunner::Impl {
  std::shared_ptr<const Model> model;
  CudaRunnerOptions opt;
  std::string device_name;
  int num_sms = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  CudaMemoryPlan plan;
  DeviceBuffer weights_buf, kv_buf, ws_buf;

  // Weights.
  DeviceMatrix emb, output;
  const float* final_norm = nullptr;
  std::vector<DeviceLayer> layers;
  int64_t max_quantized_elems = 0;  // largest quantised matrix (fp16 scratch for cuBLAS)

  // RoPE tables: the CPU's values; rope_local those of the sliding-window layers where they have
  // a base of their own (Gemma 3's rope_local_base_freq), else the same as rope.
  struct RopeTables {
    const float* cos = nullptr;   // [rope_max_pos, head_dim / 2]
    const float* sin = nullptr;   // [rope_max_pos, head_dim / 2]
    const float* inv_freq = nullptr;  // [head_dim / 2]
  };
  RopeTables rope, rope_local;
  int32_t rope_max_pos = 0;

  // KV cache [layer][slot][kv_dim] for K and for V.
  kernels::AttnType kv_type = kernels::AttnType::kF32;
  int32_t kv_elem_bytes = 4;
  int64_t kv_slots = 0;
  uint8_t* k_cache = nullptr;
  uint8_t* v_cache = nullptr;

  // Workspace for up to N = max_batch_tokens tokens, L = logit rows per classifier pass.
  int32_t logit_chunk = 0;
  float *x = nullptr, *xb = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr;
  float *gate = nullptr, *up = nullptr, *fin = nullptr, *logits = nullptr;
  int32_t* argmax_ids = nullptr;  // [L] argmax of a chunk of argmax rows, and the maxima
  float* argmax_values = nullptr;
  // A chunk of distribution rows: their nonzero counts [L] and the rows packed ([L * vocab]
  // words at most; kernels/sampling.cuh DistRows).
  int32_t* dist_counts = nullptr;
  uint32_t* dist_packed = nullptr;
  // TP > 1: the chunk's whole rows [L, vocab], gathered from the ranks' columns (dist_packed is
  // the all-gather's landing buffer first), and every rank's columns.
  float* dist_full = nullptr;
  std::vector<ShardRange> vocab_cols;
  // The pass's distribution rows as they came back (by index in batch.dist_rows: pieces and
  // chunks take them in token order), before they are appended in order.
  std::vector<int32_t> dist_kept;
  std::vector<std::vector<uint32_t>> dist_words;
  void* q_kv = nullptr;   // q in the KV type, [N, q_dim] (16-bit caches)
  void* x16 = nullptr;    // activations in fp16/bf16 for cuBLAS, [N, max in-features]
  __half* w16 = nullptr;  // a dequantised weight matrix for cuBLAS
  float* partial_out = nullptr;
  float* partial_ml = nullptr;
  float* linear_scratch = nullptr;  // kernels::LaunchLinear's, for up to N tokens
  int64_t partial_rows = 0;
  int32_t attn_chunk = 0;

  // Per-pass metadata (device) and its pinned staging.
  DeviceBuffer meta;
  PinnedBuffer meta_host, logits_host;

  // The share of the model (backend/cpu/shard_runner.h's split): layers [layer_range] of the
  // model are this runner's layers [0, layer_range.count); widths are this TP rank's.
  CollectiveLayout layout;
  std::shared_ptr<DeviceCollective> group;  // null with a 1 x 1 layout
  ShardRange layer_range, vocab_range;
  std::vector<ShardRange> q_cols, dim_rows, hidden_rows;  // per TP rank, in floats
  int32_t hq = 0, hk = 0;                                 // this rank's query and KV heads
  int64_t q_local = 0, kv_local = 0, hidden_local = 0;    // q_dim, kv_dim, hidden: its share
  // TP > 1 only: the gathered attention output [N, q_dim], this rank's rows of a dim-wide product
  // [N, dim share], the gathered SwiGLU output [N, hidden], and the all-gathers' rank-major
  // landing buffer.
  float *att_full = nullptr, *part = nullptr, *ffn_full = nullptr, *gathered = nullptr;

  // CUDA graphs of batch-invariant pass shapes (CudaRunnerOptions::cuda_graphs), by shape key.
  struct GraphEntry {
    cudaGraphExec_t exec = nullptr;
    int64_t last_use = 0;
  };
  std::map<std::vector<int64_t>, GraphEntry> graphs;
  std::map<std::vector<int64_t>, int32_t> shapes_seen;  // shapes without a graph: times run
  int64_t graph_clock = 0;
  CudaGraphStats graph_stats;

  ~Impl() {
    DropGraphs();
    if (cublas) cublasDestroy(cublas);
    if (stream) cudaStreamDestroy(stream);
  }

  const ModelConfig& config() const { return model->config(); }
  int64_t KvLayerBytes() const {
    return kv_slots * kv_local * static_cast<int64_t>(kv_elem_bytes);
  }
  bool sharded() const { return layout.tp_size > 1 || layout.num_stages > 1; }
  // Waits for the stream (through the group when there is one: bounded, and its errors count).
  Status Wait(const char* what) {
    if (group) return group->Synchronize(stream).WithContext(what);
    return CudaStatus(cudaStreamSynchronize(stream), what);
  }
  // All-gathers `local` ([n, shares[tp_rank]]) into `full` ([n, sum(shares)]), token-major.
  Status Gather(const float* local, int32_t n, std::span<const ShardRange> shares, float* full,
                float* landing = nullptr);
  // A failed pass of a share: its peers must not wait for it.
  Status Fail(Status s) {
    if (group && !s.ok()) group->Abort(s);
    return s;
  }
  // `dists` receives batch.dist_rows (required with them on the last stage; with TP > 1 the
  // stage's ranks gather those rows' columns first).
  Status Run(const ForwardBatch& batch, std::span<const std::span<const int32_t>> tables,
             std::span<float> logits, std::span<ArgmaxShare> argmax, DistRows* dists = nullptr);
  // A share's graphs hold its group's operations, and whether a pass is captured must be the
  // same on every rank of the group: a new group (or none) drops them and returns graphs to
  // their configured state (a capture that failed under the old group turned them off on this
  // rank only), so that every rank starts the new group alike.
  Status SetGroup(std::shared_ptr<DeviceCollective> c) {
    if (c) {
      const CollectiveLayout& g = c->layout();
      if (g.stage != layout.stage || g.num_stages != layout.num_stages ||
          g.tp_rank != layout.tp_rank || g.tp_size != layout.tp_size)
        return InvalidArgumentError("the collective's layout differs from the runner's");
    }
    if (sharded()) {
      DropGraphs();
      graph_stats.disabled = false;
    }
    group = sharded() ? std::move(c) : nullptr;
    return Status::Ok();
  }
  // Whether passes may be captured into graphs (those of a share only where its group's
  // operations can be captured: NCCL's, or the in-process collective on the emulator).
  bool GraphsAllowed() const {
    return !sharded() || (group != nullptr && group->capturable());
  }
  // Grows the pass metadata (device and pinned staging) to at least `bytes`. Graphs hold its
  // addresses, so growing it drops them; it grows at the same passes on every rank of a group
  // (the sizes depend on the batch alone), so their graphs stay alike.
  Status ReserveMeta(int64_t bytes, const char* what) {
    if (bytes <= meta.bytes() && bytes <= meta_host.bytes()) return Status::Ok();
    DropGraphs();
    SI_RETURN_IF_ERROR(meta_host.Reserve(bytes, what));
    return meta.Reserve(bytes, what);
  }
  Status Move(std::span<const int32_t> table, std::span<const int32_t> src,
              std::span<const int32_t> dst);

  Status Init(const CudaRunnerOptions& o, bool random, DType random_type, uint64_t seed);
  Status Matmul(const DeviceMatrix& w, const float* xin, int32_t n, float* y, float beta,
                bool use_cublas);
  Status RunPiece(const ForwardBatch& batch, std::span<const std::span<const int32_t>> tables,
                  int32_t g0, int32_t g1, std::span<float> logits_out,
                  std::span<ArgmaxShare> argmax_out);
  // The graph of pass shape `key`: cached; captured from `program` (which then issues its work
  // into the graph instead of running it) the second time the shape comes; null the first time,
  // or when graphs are off or a capture failed (graphs are then turned off): run it eagerly. A
  // share's failed capture is an error instead (its peers captured the pass: running it
  // eagerly here would not meet their graphs), which fails the pass and so the group.
  StatusOr<cudaGraphExec_t> GraphFor(const std::vector<int64_t>& key,
                                     const std::function<Status()>& program);
  void DisableGraphs(const std::string& why);
  // Destroys the graphs held and forgets the shapes seen.
  void DropGraphs() {
    for (auto& [key, g] : graphs) cudaGraphExecDestroy(g.exec);
    graphs.clear();
    shapes_seen.clear();
  }
};

void CudaModelRunner::Impl::DisableGraphs(const std::string& why) {
  spdlog::warn("CUDA graphs turned off for {}: {}; passes run kernel by kernel", device_name, why);
  graph_stats.disabled = true;
  DropGraphs();
  cudaGetLastError();  // a failed capture's error is not the next pass's
}

StatusOr<cudaGraphExec_t> CudaModelRunner::Impl::GraphFor(const std::vector<int64_t>& key,
                                                          const std::function<Status()>& program) {
  if (!opt.cuda_graphs || graph_stats.disabled || opt.max_graphs <= 0) return nullptr;
  ++graph_clock;
  if (auto it = graphs.find(key); it != graphs.end()) {
    it->second.last_use = graph_clock;
    return it->second.exec;
  }
  // A shape seen once runs eagerly (one-off shapes are not worth a capture, and its first run
  // sets up what kernels initialise lazily); the second time it is captured.
  if (shapes_seen.size() > 4096) shapes_seen.clear();
  if (++shapes_seen[key] < 2) return nullptr;
  shapes_seen.erase(key);

  if (cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
      e != cudaSuccess) {
    const std::string why = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
    DisableGraphs(why);
    if (sharded()) return InternalError("CUDA graph capture failed on a share: " + why);
    return nullptr;
  }
  const Status issued = program();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  cudaGraphExec_t exec = nullptr;
  cudaError_t made = cudaErrorUnknown;
  if (issued.ok() && ended == cudaSuccess) made = cudaGraphInstantiate(&exec, graph, 0);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!issued.ok() || ended != cudaSuccess || made != cudaSuccess) {
    const std::string why =
        !issued.ok()           ? "capture: " + issued.ToString()
        : ended != cudaSuccess ? std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended)
                               : std::string("cudaGraphInstantiate: ") + cudaGetErrorString(made);
    DisableGraphs(why);
    if (sharded()) return InternalError("CUDA graph capture failed on a share: " + why);
    return nullptr;
  }
  if (static_cast<int32_t>(graphs.size()) >= opt.max_graphs) {
    auto oldest = graphs.begin();
    for (auto it = graphs.begin(); it != graphs.end(); ++it)
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    cudaGraphExecDestroy(oldest->second.exec);
    graphs.erase(oldest);
    ++graph_stats.evicted;
  }
  graphs[key] = GraphEntry{exec, graph_clock};
  ++graph_stats.captured;
  return exec;
}

namespace {

Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  if (s == CUBLAS_STATUS_ALLOC_FAILED)
    return ResourceExhaustedError(std::string(what) + ": cuBLAS could not allocate memory");
  return InternalError(std::string(what) + ": cuBLAS error " + std::to_string(static_cast<int>(s)));
}

}  // namespace

Status CudaModelRunner::Impl::Init(const CudaRunnerOptions& o, bool random, DType random_type,
                                   uint64_t seed) {
  opt = o;
  const ModelConfig& c = config();
  if (o.num_kv_blocks <= 0 || o.kv_block_size <= 0)
    return InvalidArgumentError("KV cache needs a positive number and size of blocks");
  if (o.max_batch_tokens <= 0) return InvalidArgumentError("max_batch_tokens must be positive");
  if (c.head_dim > kernels::kTreeAttnMaxHeadDim)
    return UnimplementedError("the CUDA backend supports head_dim <= 256");
  // The switches of the other decoder families (model_config.h) the layer program implements:
  // Qwen3's QK-norm, Mistral's sliding window, Gemma 2's soft-capping and Gemma 3's set; a new
  // switch is refused by name until it is implemented here.
  std::vector<std::string> missing = c.ExtendedFeatures();
  for (const char* done : {"qk_norm", "sliding_window", "gelu_tanh", "embedding_scale",
                           "post_norms", "attention_scale", "rope_theta_local", "softcap"})
    std::erase(missing, std::string(done));
  if (!missing.empty()) {
    std::string names;
    for (const std::string& s : missing) names += (names.empty() ? "" : ", ") + s;
    return UnimplementedError("the CUDA backend runs the plain Llama layer; this " +
                              c.architecture + " model needs " + names +
                              " (use the CPU backend)");
  }
  SI_RETURN_IF_ERROR(CheckShardable(c, o.layout));
  layout = o.layout;
  if (layout.tp_size > 1 || layout.num_stages > 1) {
    if (random)
      return InvalidArgumentError("random device weights are for the whole model (1 x 1)");
    SI_RETURN_IF_ERROR(SetGroup(o.collective));
  }
  const int32_t T = layout.tp_size, me = layout.tp_rank;
  layer_range = SplitEvenly(c.n_layers, layout.num_stages, layout.stage);
  vocab_range = SplitEvenly(c.vocab_size, T, me);
  ShardRange kv_cols;
  for (int32_t i = 0; i < T; ++i) {
    const ShardRange kvh = SplitEvenly(c.n_kv_heads, T, i);
    const ShardRange h = SplitEvenly(c.n_heads, T, i);  // = kvh * group: T divides n_kv_heads
    q_cols.push_back({h.begin * c.head_dim, h.count * c.head_dim});
    dim_rows.push_back(SplitEvenly(c.dim, T, i));
    hidden_rows.push_back(SplitEvenly(c.hidden_dim, T, i));
    if (i == me) {
      hq = static_cast<int32_t>(h.count);
      hk = static_cast<int32_t>(kvh.count);
      kv_cols = {kvh.begin * c.head_dim, kvh.count * c.head_dim};
    }
  }
  q_local = q_cols[static_cast<size_t>(me)].count;
  kv_local = kv_cols.count;
  hidden_local = hidden_rows[static_cast<size_t>(me)].count;
  const bool first_stage = layout.stage == 0;
  const bool last_stage = layout.stage + 1 == layout.num_stages;

  if (DeviceCount() <= o.device || o.device < 0)
    return FailedPreconditionError("no CUDA device " + std::to_string(o.device) + " (found " +
                                   std::to_string(DeviceCount()) + ")");
  SI_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o.device), "cudaSetDevice"));
  cudaDeviceProp prop;
  SI_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, o.device), "device properties"));
  device_name = prop.name;
  num_sms = prop.multiProcessorCount;
  SI_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  SI_RETURN_IF_ERROR(CublasStatus(cublasCreate(&cublas), "cublasCreate"));
  SI_RETURN_IF_ERROR(CublasStatus(cublasSetStream(cublas, stream), "cublasSetStream"));
  // No TF32: float32 products keep float32 precision.
  SI_RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH), "math mode"));

  // --- weights: plan the arena ---
  const ModelWeights& w = model->weights();
  std::vector<MatrixSlot> mats;
  std::vector<VectorSlot> vecs;
  layers.resize(static_cast<size_t>(layer_range.count));
  const int64_t dim = c.dim, q_dim = c.q_dim(), hidden = c.hidden_dim;
  // Rows [rows] of a matrix with `cols` columns (all of them with a 1 x 1 layout).
  auto add_matrix = [&](const WeightMatrix* hm, ShardRange rows, int64_t cols, DeviceMatrix* t) {
    MatrixSlot s;
    s.rows = rows.count;
    s.cols = cols;
    s.target = t;
    if (random) {
      s.type = random_type;
    } else {
      s.host = hm->row(rows.begin);
      s.type = hm->type;
    }
    mats.push_back(s);
  };
  auto slice = [](const WeightVector& v, ShardRange r) -> const float* {
    return v.data == nullptr ? nullptr : v.data + r.begin;  // missing: refused below
  };
  const ShardRange q_rows = q_cols[static_cast<size_t>(me)];
  const ShardRange d_rows = dim_rows[static_cast<size_t>(me)];
  const ShardRange h_rows = hidden_rows[static_cast<size_t>(me)];
  if (!random) {
    if (w.token_embedding.empty() || w.output.empty() || w.final_norm.data == nullptr ||
        w.layers.size() != static_cast<size_t>(c.n_layers))
      return InvalidArgumentError("model weights are incomplete");
  }
  if (first_stage) add_matrix(&w.token_embedding, {0, c.vocab_size}, dim, &emb);
  for (int32_t i = 0; i < layer_range.count; ++i) {
    DeviceLayer& dl = layers[static_cast<size_t>(i)];
    const LayerWeights* hl =
        random ? nullptr : &w.layers[static_cast<size_t>(layer_range.begin + i)];
    if (hl) {
      for (const WeightMatrix* m :
           {&hl->wq, &hl->wk, &hl->wv, &hl->wo, &hl->w_gate, &hl->w_down, &hl->w_up})
        if (m->empty()) return InvalidArgumentError("model is missing a layer weight");
    }
    add_matrix(hl ? &hl->wq : nullptr, q_rows, dim, &dl.wq);
    add_matrix(hl ? &hl->wk : nullptr, kv_cols, dim, &dl.wk);
    add_matrix(hl ? &hl->wv : nullptr, kv_cols, dim, &dl.wv);
    add_matrix(hl ? &hl->wo : nullptr, d_rows, q_dim, &dl.wo);
    add_matrix(hl ? &hl->w_gate : nullptr, h_rows, dim, &dl.w_gate);
    add_matrix(hl ? &hl->w_down : nullptr, d_rows, hidden, &dl.w_down);
    add_matrix(hl ? &hl->w_up : nullptr, h_rows, dim, &dl.w_up);
    vecs.push_back({hl ? hl->attn_norm.data : nullptr, dim, 1.0f, &dl.attn_norm});
    vecs.push_back({hl ? hl->ffn_norm.data : nullptr, dim, 1.0f, &dl.ffn_norm});
    if (c.attention_bias) {
      vecs.push_back({hl ? slice(hl->bq, q_rows) : nullptr, q_local, 0.0f, &dl.bq});
      vecs.push_back({hl ? slice(hl->bk, kv_cols) : nullptr, kv_local, 0.0f, &dl.bk});
      vecs.push_back({hl ? slice(hl->bv, kv_cols) : nullptr, kv_local, 0.0f, &dl.bv});
    }
    if (c.post_norms) {  // applied to whole rows (after the all-gather): every share holds them
      vecs.push_back({hl ? hl->post_attn_norm.data : nullptr, dim, 1.0f, &dl.post_attn_norm});
      vecs.push_back({hl ? hl->post_ffn_norm.data : nullptr, dim, 1.0f, &dl.post_ffn_norm});
    }
    if (c.qk_norm) {  // one gain vector per layer for every head: each share holds it whole
      vecs.push_back({hl ? hl->q_norm.data : nullptr, c.head_dim, 1.0f, &dl.q_norm});
      vecs.push_back({hl ? hl->k_norm.data : nullptr, c.head_dim, 1.0f, &dl.k_norm});
    }
  }
  if (last_stage) {
    add_matrix(&w.output, vocab_range, dim, &output);
    vecs.push_back({random ? nullptr : w.final_norm.data, dim, 1.0f, &final_norm});
    if (random && c.tied_output) mats.back().alias = true;
  }

  Arena warena;
  int64_t linear_floats = 0;  // the scratch the largest product needs (LinearScratchFloats)
  for (size_t i = 0; i < mats.size(); ++i) {
    MatrixSlot& s = mats[i];
    SI_ASSIGN_OR_RETURN(ElemType et, ToElemType(s.type, "weight matrix " + std::to_string(i)));
    if (s.cols % kernels::ElemBlockElems(et) != 0)
      return InvalidArgumentError(std::string(DTypeName(s.type)) + " matrix " + std::to_string(i) +
                                  " with a row length not a multiple of " +
                                  std::to_string(kernels::ElemBlockElems(et)));
    s.target->type = et;
    s.target->rows = s.rows;
    s.target->cols = s.cols;
    s.bytes = s.target->bytes();
    if (!random && s.host) {
      for (size_t j = 0; j < i; ++j)
        if (mats[j].host == s.host && mats[j].type == s.type && mats[j].bytes == s.bytes) {
          s.alias = true;
          s.offset = mats[j].offset;
          break;
        }
    }
    if (s.alias && random) s.offset = mats[0].offset;  // tied output = embedding
    if (!s.alias) s.offset = warena.Add(s.bytes);
    if (s.target->quantized()) max_quantized_elems = std::max(max_quantized_elems, s.rows * s.cols);
    if (s.target != &emb)  // the embedding is gathered, every other matrix multiplied
      linear_floats = std::max(
          linear_floats, kernels::LinearScratchFloats(et, s.rows, s.cols, o.max_batch_tokens));
  }
  for (VectorSlot& v : vecs) {
    if (!random && v.host == nullptr) return InvalidArgumentError("model is missing a norm/bias");
    v.offset = warena.Add(v.size * 4);
  }
  const int32_t half = c.head_dim / 2;
  rope_max_pos = std::min(c.max_seq_len, 1 << 16);
  struct RopeSlot {
    std::vector<float> inv;
    int64_t cos_off, sin_off, inv_off;
    RopeTables* target;
  };
  std::vector<RopeSlot> rope_slots;
  auto add_rope = [&](std::vector<float> inv, RopeTables* target) {
    const int64_t cos_off = warena.Add(int64_t{4} * rope_max_pos * half);
    const int64_t sin_off = warena.Add(int64_t{4} * rope_max_pos * half);
    const int64_t inv_off = warena.Add(int64_t{4} * half);
    rope_slots.push_back({std::move(inv), cos_off, sin_off, inv_off, target});
  };
  add_rope(RopeInvFrequencies(c), &rope);
  if (c.rope_theta_local != 0.0f) add_rope(RopeInvFrequenciesLocal(c), &rope_local);
  plan.weights = warena.size;

  // --- KV cache ---
  KvCacheType kt = o.kv_type;
  if (kt == KvCacheType::kAuto) {
    // From the whole model's matrices, so that every share of it picks the same type.
    bool all_f32 = true;
    if (random) {
      all_f32 = random_type == DType::kF32;
    } else {
      all_f32 = w.token_embedding.type == DType::kF32 && w.output.type == DType::kF32;
      for (const LayerWeights& l : w.layers)
        for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_down, &l.w_up})
          all_f32 &= m->type == DType::kF32;
    }
    kt = all_f32 ? KvCacheType::kF32 : KvCacheType::kF16;
  }
  kv_type = kt == KvCacheType::kF32   ? kernels::AttnType::kF32
            : kt == KvCacheType::kF16 ? kernels::AttnType::kF16
                                      : kernels::AttnType::kBF16;
  kv_elem_bytes = kt == KvCacheType::kF32 ? 4 : 2;
  kv_slots = static_cast<int64_t>(o.num_kv_blocks) * o.kv_block_size;
  plan.kv_cache = 2 * layer_range.count * KvLayerBytes();

  // --- workspace ---
  const int64_t n = o.max_batch_tokens;
  logit_chunk = std::min<int32_t>(o.max_batch_tokens, 128);
  const int64_t max_in = std::max({dim, q_dim, hidden});
  Arena wsa;
  const int64_t x_off = wsa.Add(4 * n * dim);
  const int64_t xb_off = wsa.Add(4 * n * std::max(dim, q_dim));
  const int64_t q_off = wsa.Add(4 * n * q_local);
  const int64_t k_off = wsa.Add(4 * n * kv_local);
  const int64_t v_off = wsa.Add(4 * n * kv_local);
  const int64_t att_off = wsa.Add(4 * n * q_local);
  const int64_t gate_off = wsa.Add(4 * n * hidden_local);
  const int64_t up_off = wsa.Add(4 * n * hidden_local);
  const int64_t fin_off = wsa.Add(4 * int64_t{logit_chunk} * dim);
  const int64_t logits_off = wsa.Add(4 * int64_t{logit_chunk} * vocab_range.count);
  const int64_t amax_id_off = wsa.Add(4 * int64_t{logit_chunk});
  const int64_t amax_val_off = wsa.Add(4 * int64_t{logit_chunk});
  // Distribution rows, on the last stage: their counts and packed words, and with TP > 1 the
  // gathered whole rows (a rank's columns make no distribution).
  const bool dists = layout.stage + 1 == layout.num_stages;
  const int64_t dist_count_off = dists ? wsa.Add(4 * int64_t{logit_chunk}) : -1;
  const int64_t dist_packed_off = dists ? wsa.Add(4 * int64_t{logit_chunk} * c.vocab_size) : -1;
  const int64_t dist_full_off =
      dists && layout.tp_size > 1 ? wsa.Add(4 * int64_t{logit_chunk} * c.vocab_size) : -1;
  const int64_t qkv_off = kv_elem_bytes == 2 ? wsa.Add(2 * n * q_local) : -1;
  const bool tp = layout.tp_size > 1;
  const int64_t att_full_off = tp ? wsa.Add(4 * n * q_dim) : -1;
  const int64_t part_off = tp ? wsa.Add(4 * n * d_rows.count) : -1;
  const int64_t ffn_full_off = tp ? wsa.Add(4 * n * hidden) : -1;
  const int64_t gathered_off = tp ? wsa.Add(4 * n * max_in) : -1;
  const bool cublas_on = o.cublas_min_tokens > 0 && o.cublas_min_tokens <= o.max_batch_tokens;
  const int64_t x16_off = cublas_on ? wsa.Add(2 * n * max_in) : -1;
  const int64_t w16_off =
      cublas_on && max_quantized_elems > 0 ? wsa.Add(2 * max_quantized_elems) : -1;
  // Attention chunks: fixed, so that a token's attention is the same in every batch.
  const int64_t max_kv =
      std::min<int64_t>(kv_slots, int64_t{c.max_seq_len} + 512 + o.kv_block_size);
  attn_chunk = o.attention_chunk > 0
                   ? o.attention_chunk
                   : static_cast<int32_t>(std::max<int64_t>(512, (max_kv + 15) / 16));
  attn_chunk = (attn_chunk + kernels::kTreeAttnTileKv - 1) / kernels::kTreeAttnTileKv *
               kernels::kTreeAttnTileKv;
  const int64_t max_chunks = (max_kv + attn_chunk - 1) / attn_chunk;
  partial_rows = max_chunks > 1 ? n * hq * max_chunks : 0;
  const int64_t po_off = partial_rows > 0 ? wsa.Add(4 * partial_rows * c.head_dim) : -1;
  const int64_t pml_off = partial_rows > 0 ? wsa.Add(8 * partial_rows) : -1;
  // The tensor-core products' split activations and partition sums (none for other types).
  const int64_t ls_off = wsa.Add(std::max<int64_t>(16, 4 * linear_floats));
  plan.workspace = wsa.size;

  // --- allocate everything up front ---
  size_t free_bytes = 0, total_bytes = 0;
  SI_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  if (plan.total() > static_cast<int64_t>(free_bytes))
    return ResourceExhaustedError("the model needs " + plan.ToString() + " of GPU memory; " +
                                  device_name + " has " + MiB(static_cast<int64_t>(free_bytes)) +
                                  " free (fewer KV blocks or a smaller max_batch_tokens may fit)");
  SI_RETURN_IF_ERROR(weights_buf.Allocate(plan.weights, "weights (" + plan.ToString() + ")"));
  SI_RETURN_IF_ERROR(kv_buf.Allocate(plan.kv_cache, "the KV cache (" + plan.ToString() + ")"));
  SI_RETURN_IF_ERROR(ws_buf.Allocate(plan.workspace, "the workspace (" + plan.ToString() + ")"));

  uint8_t* wb = weights_buf.get<uint8_t>();
  for (size_t i = 0; i < mats.size(); ++i) {
    MatrixSlot& s = mats[i];
    s.target->data = wb + s.offset;
    if (s.alias) continue;
    if (random) {
      const float scale = 0.02f * std::sqrt(3.0f);  // uniform with standard deviation 0.02
      cudaError_t err =
          s.type == DType::kF16
              ? kernels::LaunchRandomFill(reinterpret_cast<__half*>(wb + s.offset), s.rows * s.cols,
                                          seed + i, 0.0f, scale, stream)
              : kernels::LaunchRandomFill(reinterpret_cast<float*>(wb + s.offset), s.rows * s.cols,
                                          seed + i, 0.0f, scale, stream);
      SI_RETURN_IF_ERROR(CudaStatus(err, "random weights"));
    } else {
      SI_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(wb + s.offset, s.host, static_cast<size_t>(s.bytes), cudaMemcpyHostToDevice),
          "weight upload"));
    }
  }
  for (size_t i = 0; i < vecs.size(); ++i) {
    const VectorSlot& v = vecs[i];
    float* dst = reinterpret_cast<float*>(wb + v.offset);
    *v.target = dst;
    if (random) {
      SI_RETURN_IF_ERROR(
          CudaStatus(kernels::LaunchRandomFill(dst, v.size, seed + 7919 + i, v.fill, 0.05f, stream),
                     "random norms"));
    } else {
      SI_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(dst, v.host, static_cast<size_t>(v.size) * 4, cudaMemcpyHostToDevice),
          "norm upload"));
    }
  }
  for (const RopeSlot& r : rope_slots) {
    // Exactly cpu::RopeTable's values (float angle, std::cos/std::sin in float).
    std::vector<float> cs(static_cast<size_t>(rope_max_pos) * half), sn(cs.size());
    for (int32_t p = 0; p < rope_max_pos; ++p)
      for (int32_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(p) * r.inv[static_cast<size_t>(i)];
        cs[static_cast<size_t>(p) * half + i] = std::cos(angle);
        sn[static_cast<size_t>(p) * half + i] = std::sin(angle);
      }
    SI_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(wb + r.cos_off, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice),
                   "rope upload"));
    SI_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(wb + r.sin_off, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice),
                   "rope upload"));
    SI_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(wb + r.inv_off, r.inv.data(), r.inv.size() * 4, cudaMemcpyHostToDevice),
        "rope upload"));
    r.target->cos = reinterpret_cast<const float*>(wb + r.cos_off);
    r.target->sin = reinterpret_cast<const float*>(wb + r.sin_off);
    r.target->inv_freq = reinterpret_cast<const float*>(wb + r.inv_off);
  }
  if (rope_slots.size() == 1) rope_local = rope;

  k_cache = kv_buf.get<uint8_t>();
  v_cache = k_cache + layer_range.count * KvLayerBytes();
  // Zeroed so that reading a never-written slot (a bug) gives zeros, not NaNs.
  SI_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(kv_buf.get(), 0, plan.kv_cache, stream), "KV clear"));

  uint8_t* ws = ws_buf.get<uint8_t>();
  auto f = [&](int64_t off) { return reinterpret_cast<float*>(ws + off); };
  x = f(x_off);
  xb = f(xb_off);
  q = f(q_off);
  k = f(k_off);
  v = f(v_off);
  att = f(att_off);
  gate = f(gate_off);
  up = f(up_off);
  fin = f(fin_off);
  logits = f(logits_off);
  argmax_ids = reinterpret_cast<int32_t*>(f(amax_id_off));
  argmax_values = f(amax_val_off);
  dist_counts = dist_count_off >= 0 ? reinterpret_cast<int32_t*>(f(dist_count_off)) : nullptr;
  dist_packed = dist_packed_off >= 0 ? reinterpret_cast<uint32_t*>(f(dist_packed_off)) : nullptr;
  dist_full = dist_full_off >= 0 ? f(dist_full_off) : nullptr;
  for (int32_t r = 0; r < layout.tp_size; ++r)
    vocab_cols.push_back(SplitEvenly(c.vocab_size, layout.tp_size, r));
  q_kv = qkv_off >= 0 ? ws + qkv_off : nullptr;
  x16 = x16_off >= 0 ? ws + x16_off : nullptr;
  w16 = w16_off >= 0 ? reinterpret_cast<__half*>(ws + w16_off) : nullptr;
  partial_out = po_off >= 0 ? f(po_off) : nullptr;
  partial_ml = pml_off >= 0 ? f(pml_off) : nullptr;
  linear_scratch = f(ls_off);
  att_full = att_full_off >= 0 ? f(att_full_off) : nullptr;
  part = part_off >= 0 ? f(part_off) : nullptr;
  ffn_full = ffn_full_off >= 0 ? f(ffn_full_off) : nullptr;
  gathered = gathered_off >= 0 ? f(gathered_off) : nullptr;

  // Metadata for a typical pass; grows if a pass needs more.
  SI_RETURN_IF_ERROR(meta.Reserve(int64_t{64} << 10, "pass metadata"));
  SI_RETURN_IF_ERROR(meta_host.Reserve(int64_t{64} << 10, "pass metadata"));
  // A chunk of logits rows, then a chunk of argmax rows' ids and maxima and one of distribution
  // rows' counts (apart, so that a pass replayed from a graph can bring back one chunk of each
  // before its rows are handed out; the packed distributions come after, into the logits rows'
  // part, once those are handed out).
  SI_RETURN_IF_ERROR(logits_host.Reserve(
      4 * int64_t{logit_chunk} * (std::max<int64_t>(vocab_range.count, 1) + 3), "logits staging"));
  return CudaStatus(cudaStreamSynchronize(stream), "model upload");
}

Status CudaModelRunner::Impl::Matmul(const DeviceMatrix& w, const float* xin, int32_t n, float* y,
                                     float beta, bool use_cublas) {
  if (!use_cublas || x16 == nullptr) {
    return CudaStatus(
        kernels::LaunchLinear(w.type, w.data, w.rows, w.cols, xin, n, y, beta, stream,
                              linear_scratch),
        "linear kernel");
  }
  const float alpha = 1.0f;
  const int m = static_cast<int>(w.rows), kk = static_cast<int>(w.cols);
  if (w.type == ElemType::kF32) {
    return CublasStatus(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, kk, &alpha,
                                    static_cast<const float*>(w.data), kk, xin, kk, &beta, y, m),
                        "cublasSgemm");
  }
  const void* wptr = w.data;
  cudaDataType_t dt = CUDA_R_16F;
  if (w.type == ElemType::kBF16) {
    dt = CUDA_R_16BF;
    SI_RETURN_IF_ERROR(CudaStatus(
        kernels::LaunchCast(xin, static_cast<__nv_bfloat16*>(x16), int64_t{n} * kk, stream),
        "cast"));
  } else {
    SI_RETURN_IF_ERROR(CudaStatus(
        kernels::LaunchCast(xin, static_cast<__half*>(x16), int64_t{n} * kk, stream), "cast"));
    if (w.quantized()) {
      if (w16 == nullptr) return InternalError("no dequantisation workspace");
      SI_RETURN_IF_ERROR(CudaStatus(kernels::LaunchDequantizeRows(w.type, w.data, w.rows, w.cols,
                                                                  nullptr, w.rows, w16, stream),
                                    "dequantise"));
      wptr = w16;
    }
  }
  return CublasStatus(
      cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, kk, &alpha, wptr, dt, kk, x16, dt, kk,
                   &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

namespace {

// A TokenDraw as the kernels read it.
kernels::TokenDraw ToKernel(const TokenDraw& d) {
  kernels::TokenDraw k;
  k.temperature = d.temperature;
  k.top_k = d.top_k;
  k.top_p = d.top_p;
  k.u = d.u;
  return k;
}

// Appends `count` values of T to a byte blob at a 16-byte aligned offset; returns the offset.
template <typename T>
int64_t Append(std::vector<uint8_t>& blob, const T* data, size_t count) {
  const int64_t off = static_cast<int64_t>((blob.size() + 15) / 16 * 16);
  blob.resize(static_cast<size_t>(off) + count * sizeof(T));
  if (count) std::memcpy(blob.data() + off, data, count * sizeof(T));
  return off;
}

// The operations of backend/llama_program.h for one piece of a batch ([np] tokens) on the GPU:
// the launches RunPiece made, in the same order. Residual adds are fused into the products
// (beta = 1), so ProjectOutAdd and ProjectDownAdd are one product each. With TP > 1 they are a
// gather of the input, this rank's rows of the product, a gather of those rows and the residual
// add, which rounds exactly as the fused beta = 1 (fma(1, x, p) == x + p).
struct PieceOps {
  using Impl = CudaModelRunner::Impl;
  PieceOps(Impl& impl, const ForwardBatch& b, int32_t n, const std::vector<int32_t>& local,
           const std::vector<int32_t>& index, std::span<float> out,
           const std::vector<int32_t>& a_index, std::span<ArgmaxShare> a_out,
           const std::vector<int32_t>& d_index)
      : im(impl),
        c(impl.config()),
        batch(b),
        np(n),
        logit_local(local),
        logit_index(index),
        logits_out(out),
        argmax_index(a_index),
        argmax_out(a_out),
        dist_index(d_index) {
    use_cublas = !batch.batch_invariant && im.opt.cublas_min_tokens > 0 &&
                 np >= im.opt.cublas_min_tokens;
    rope_mode = c.rope_style == RopeStyle::kInterleaved ? kernels::RopeMode::kInterleaved
                                                        : kernels::RopeMode::kHalf;
  }

  Status Input() {
    if (im.layout.stage > 0)
      return im.group->RecvFromPrevStage(im.x, static_cast<size_t>(np) * c.dim, im.stream);
    SI_RETURN_IF_ERROR(Check(kernels::LaunchDequantizeRows(im.emb.type, im.emb.data, im.emb.rows,
                                                           c.dim, d_tokens, np, im.x, im.stream),
                             "embedding"));
    if (c.embedding_scale == 1.0f) return Status::Ok();
    return Check(kernels::LaunchScale(im.x, c.embedding_scale, int64_t{np} * c.dim, im.stream),
                 "embedding scale");
  }
  Status Norm(int32_t li, LlamaNorm which) {
    const DeviceLayer& l = im.layers[static_cast<size_t>(li)];
    const bool attn = which == LlamaNorm::kAttention;
    return Check(kernels::LaunchRmsNorm(im.x, attn ? l.attn_norm : l.ffn_norm, im.xb, np,
                                        static_cast<int>(c.dim), c.norm_eps, im.stream),
                 attn ? "attention norm" : "ffn norm");
  }
  Status ProjectQkv(int32_t li) {
    const DeviceLayer& l = im.layers[static_cast<size_t>(li)];
    SI_RETURN_IF_ERROR(im.Matmul(l.wq, im.xb, np, im.q, 0.0f, use_cublas));
    SI_RETURN_IF_ERROR(im.Matmul(l.wk, im.xb, np, im.k, 0.0f, use_cublas));
    SI_RETURN_IF_ERROR(im.Matmul(l.wv, im.xb, np, im.v, 0.0f, use_cublas));
    if (l.bq != nullptr) {
      SI_RETURN_IF_ERROR(
          Check(kernels::LaunchAddBias(im.q, l.bq, np, im.q_local, im.stream), "bias"));
      SI_RETURN_IF_ERROR(
          Check(kernels::LaunchAddBias(im.k, l.bk, np, im.kv_local, im.stream), "bias"));
      SI_RETURN_IF_ERROR(
          Check(kernels::LaunchAddBias(im.v, l.bv, np, im.kv_local, im.stream), "bias"));
    }
    if (l.q_norm == nullptr) return Status::Ok();
    // QK-norm (Qwen3): every head's q and k RMS-normed on their own, [np * heads, head_dim] rows
    // in place (a row's bits do not depend on the batch).
    const auto hd = static_cast<int>(c.head_dim);
    SI_RETURN_IF_ERROR(Check(
        kernels::LaunchRmsNorm(im.q, l.q_norm, im.q, np * im.hq, hd, c.norm_eps, im.stream),
        "q norm"));
    return Check(
        kernels::LaunchRmsNorm(im.k, l.k_norm, im.k, np * im.hk, hd, c.norm_eps, im.stream),
        "k norm");
  }
  // RoPE on q and k, k and v appended to the layer's cache slots, and q cast to a 16-bit cache's
  // type for the attention kernel.
  Status RopeAndStoreKv(int32_t li) {
    const Impl::RopeTables& rope =
        c.IsSlidingLayer(static_cast<int32_t>(im.layer_range.begin) + li) ? im.rope_local : im.rope;
    SI_RETURN_IF_ERROR(
        Check(kernels::LaunchRope(im.q, im.hq, im.k, im.hk, c.head_dim, d_pos, np, rope.cos,
                                  rope.sin, im.rope_max_pos, rope.inv_freq, rope_mode, im.stream),
              "rope"));
    uint8_t* kl = im.k_cache + li * im.KvLayerBytes();
    uint8_t* vl = im.v_cache + li * im.KvLayerBytes();
    const int32_t kv_dim = static_cast<int32_t>(im.kv_local);
    const int64_t q_elems = int64_t{np} * im.q_local;
    cudaError_t err;
    switch (im.kv_type) {
      case kernels::AttnType::kF32:
        err = kernels::LaunchKvAppend(im.k, im.v, d_slots, np, kv_dim,
                                      reinterpret_cast<float*>(kl), reinterpret_cast<float*>(vl),
                                      im.stream);
        break;
      case kernels::AttnType::kF16:
        err = kernels::LaunchKvAppend(im.k, im.v, d_slots, np, kv_dim,
                                      reinterpret_cast<__half*>(kl), reinterpret_cast<__half*>(vl),
                                      im.stream);
        if (err == cudaSuccess)
          err = kernels::LaunchCast(im.q, static_cast<__half*>(im.q_kv), q_elems, im.stream);
        break;
      default:
        err = kernels::LaunchKvAppend(im.k, im.v, d_slots, np, kv_dim,
                                      reinterpret_cast<__nv_bfloat16*>(kl),
                                      reinterpret_cast<__nv_bfloat16*>(vl), im.stream);
        if (err == cudaSuccess)
          err = kernels::LaunchCast(im.q, static_cast<__nv_bfloat16*>(im.q_kv), q_elems,
                                    im.stream);
        break;
    }
    return Check(err, "KV append");
  }
  Status Attend(int32_t li) {
    attn.k_cache = im.k_cache + li * im.KvLayerBytes();
    attn.v_cache = im.v_cache + li * im.KvLayerBytes();
    // Sliding-window layers (Mistral: all of them) see the last sliding_window positions.
    attn.sliding_window = c.IsSlidingLayer(static_cast<int32_t>(im.layer_range.begin) + li)
                              ? c.sliding_window
                              : 0;
    return Check(kernels::LaunchTreeAttention(attn, im.kv_type, /*out_float=*/true, im.stream),
                 "tree attention");
  }
  Status ProjectOutAdd(int32_t li) {  // x += att W_o^T (normed first with post-norms)
    const DeviceLayer& l = im.layers[static_cast<size_t>(li)];
    if (im.layout.tp_size == 1) {
      if (l.post_attn_norm == nullptr) return im.Matmul(l.wo, im.att, np, im.x, 1.0f, use_cublas);
      SI_RETURN_IF_ERROR(im.Matmul(l.wo, im.att, np, im.xb, 0.0f, use_cublas));
      return NormAndAdd(l.post_attn_norm);
    }
    SI_RETURN_IF_ERROR(im.Gather(im.att, np, im.q_cols, im.att_full));
    SI_RETURN_IF_ERROR(im.Matmul(l.wo, im.att_full, np, im.part, 0.0f, use_cublas));
    return GatherAndAdd(l.post_attn_norm);
  }
  Status ProjectGateUp(int32_t li) {
    const DeviceLayer& l = im.layers[static_cast<size_t>(li)];
    SI_RETURN_IF_ERROR(im.Matmul(l.w_gate, im.xb, np, im.gate, 0.0f, use_cublas));
    return im.Matmul(l.w_up, im.xb, np, im.up, 0.0f, use_cublas);
  }
  Status SwiGlu() {
    const int64_t n = int64_t{np} * im.hidden_local;
    if (c.ffn_activation == FfnActivation::kGeluTanh)
      return Check(kernels::LaunchGeGluTanh(im.gate, im.up, n, im.stream), "geglu");
    return Check(kernels::LaunchSwiGlu(im.gate, im.up, n, im.stream), "swiglu");
  }
  Status ProjectDownAdd(int32_t li) {  // x += ffn (normed first with post-norms)
    const DeviceLayer& l = im.layers[static_cast<size_t>(li)];
    if (im.layout.tp_size == 1) {
      if (l.post_ffn_norm == nullptr)
        return im.Matmul(l.w_down, im.gate, np, im.x, 1.0f, use_cublas);
      SI_RETURN_IF_ERROR(im.Matmul(l.w_down, im.gate, np, im.xb, 0.0f, use_cublas));
      return NormAndAdd(l.post_ffn_norm);
    }
    SI_RETURN_IF_ERROR(im.Gather(im.gate, np, im.hidden_rows, im.ffn_full));
    SI_RETURN_IF_ERROR(im.Matmul(l.w_down, im.ffn_full, np, im.part, 0.0f, use_cublas));
    return GatherAndAdd(l.post_ffn_norm);
  }
  // TP > 1: xb = all-gather of this rank's rows of a dim-wide product; then NormAndAdd.
  Status GatherAndAdd(const float* post_norm) {
    SI_RETURN_IF_ERROR(im.Gather(im.part, np, im.dim_rows, im.xb));
    return NormAndAdd(post_norm);
  }
  // x += xb, xb RMS-normed first (in place) where the model has post-norms (Gemma 2/3).
  Status NormAndAdd(const float* post_norm) {
    if (post_norm != nullptr)
      SI_RETURN_IF_ERROR(Check(kernels::LaunchRmsNorm(im.xb, post_norm, im.xb, np,
                                                      static_cast<int>(c.dim), c.norm_eps,
                                                      im.stream),
                               "post-norm"));
    return Check(kernels::LaunchAddBias(im.x, im.xb, 1, int64_t{np} * c.dim, im.stream),
                 "residual add");
  }
  // Final norm and classifier for the wanted rows (this rank's vocabulary rows), logit_chunk rows
  // at a time: the logits rows' come back; the argmax rows' (d_lrows after the logits rows')
  // stay on the GPU, which finds their argmax and sends only it; the distribution rows' (after
  // those) become distributions there and only what each keeps comes back. Before the last
  // stage, x goes on to the next one instead. With `deferred` (a pass captured into a graph: one
  // chunk of each kind at most), the chunks' rows are copied to the host but left there for
  // CollectAll after the pass.
  Status Output() {
    if (im.layout.stage + 1 < im.layout.num_stages)
      return im.group->SendToNextStage(im.x, static_cast<size_t>(np) * c.dim, im.stream);
    for (size_t r0 = 0, r1 = 0; r0 < total_rows(); r0 = r1) {
      r1 = ChunkEnd(r0);
      SI_RETURN_IF_ERROR(Classify(r0, r1));
      if (!deferred) SI_RETURN_IF_ERROR(Collect(r0, r1));
    }
    return Status::Ok();
  }
  size_t total_rows() const { return logit_local.size() + argmax_index.size() + dist_index.size(); }
  size_t dist_first() const { return logit_local.size() + argmax_index.size(); }
  // A chunk holds rows of one kind: logits, argmax or distribution rows.
  size_t ChunkEnd(size_t r0) const {
    const size_t num_logits = logit_local.size();
    const size_t kind_end = r0 < num_logits     ? num_logits
                            : r0 < dist_first() ? dist_first()
                                                : total_rows();
    return std::min(r0 + static_cast<size_t>(im.logit_chunk), kind_end);
  }
  // Whether the wanted rows take at most one classifier chunk of each kind (a pass a graph can
  // hold whole: the host staging has room for one of each).
  bool OneChunkEach() const {
    const size_t chunk = static_cast<size_t>(im.logit_chunk);
    return logit_local.size() <= chunk && argmax_index.size() <= chunk &&
           dist_index.size() <= chunk;
  }
  Status CollectAll() {
    if (im.layout.stage + 1 < im.layout.num_stages) return Status::Ok();  // rows are the last's
    for (size_t r0 = 0, r1 = 0; r0 < total_rows(); r0 = r1) {
      r1 = ChunkEnd(r0);
      SI_RETURN_IF_ERROR(Collect(r0, r1));
    }
    return Status::Ok();
  }
  int32_t* argmax_ids_host() const {
    return reinterpret_cast<int32_t*>(im.logits_host.get<float>() +
                                      int64_t{im.logit_chunk} * im.vocab_range.count);
  }
  float* argmax_values_host() const {
    return im.logits_host.get<float>() + int64_t{im.logit_chunk} * (im.vocab_range.count + 1);
  }
  int32_t* dist_counts_host() const {
    return reinterpret_cast<int32_t*>(im.logits_host.get<float>() +
                                      int64_t{im.logit_chunk} * (im.vocab_range.count + 2));
  }
  // Rows [r0, r1) on the device: norm, classifier, argmax for argmax rows; copied to the host.
  Status Classify(size_t r0, size_t r1) {
    const int64_t vocab = im.vocab_range.count;
    const int32_t m = static_cast<int32_t>(r1 - r0);
    SI_RETURN_IF_ERROR(
        Check(kernels::LaunchRmsNormRows(im.x, d_lrows + r0, im.final_norm, im.fin, m,
                                         static_cast<int>(c.dim), c.norm_eps, im.stream),
              "final norm"));
    SI_RETURN_IF_ERROR(im.Matmul(im.output, im.fin, m, im.logits, 0.0f,
                                 use_cublas && m >= im.opt.cublas_min_tokens));
    if (c.final_softcap != 0.0f)  // Gemma 2: before anything reads the logits
      SI_RETURN_IF_ERROR(Check(
          kernels::LaunchSoftCap(im.logits, c.final_softcap, int64_t{m} * vocab, im.stream),
          "logit soft-capping"));
    if (r0 < logit_local.size())
      return Check(
          cudaMemcpyAsync(im.logits_host.get(), im.logits, static_cast<size_t>(m * vocab) * 4,
                          cudaMemcpyDeviceToHost, im.stream),
          "logits download");
    if (r0 >= dist_first()) {
      // A TP rank's columns make no distribution: the ranks gather their rows whole first.
      float* rows = im.logits;
      if (im.layout.tp_size > 1) {
        SI_RETURN_IF_ERROR(im.Gather(im.logits, m, im.vocab_cols, im.dist_full,
                                     reinterpret_cast<float*>(im.dist_packed)));
        rows = im.dist_full;
      }
      const auto full_vocab = static_cast<int32_t>(c.vocab_size);
      SI_RETURN_IF_ERROR(
          Check(kernels::LaunchDistRows(rows, m, full_vocab, d_dist + (r0 - dist_first()),
                                        im.dist_counts, im.dist_packed, im.stream),
                "distribution rows"));
      return Check(cudaMemcpyAsync(dist_counts_host(), im.dist_counts, static_cast<size_t>(m) * 4,
                                   cudaMemcpyDeviceToHost, im.stream),
                   "distribution counts download");
    }
    if (d_draws != nullptr) {
      SI_RETURN_IF_ERROR(
          Check(kernels::LaunchDrawTokens(im.logits, m, static_cast<int32_t>(vocab),
                                          d_draws + (r0 - logit_local.size()), im.argmax_ids,
                                          im.stream, im.argmax_values),
                "token draws"));
    } else {
      SI_RETURN_IF_ERROR(Check(kernels::LaunchArgmax(im.logits, m, static_cast<int32_t>(vocab),
                                                     im.argmax_ids, im.stream, im.argmax_values),
                               "argmax"));
    }
    SI_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(argmax_ids_host(), im.argmax_ids, static_cast<size_t>(m) * 4,
                              cudaMemcpyDeviceToHost, im.stream),
              "argmax download"));
    return Check(cudaMemcpyAsync(argmax_values_host(), im.argmax_values, static_cast<size_t>(m) * 4,
                                 cudaMemcpyDeviceToHost, im.stream),
                 "argmax download");
  }
  // Waits for rows [r0, r1) to reach the host and hands them out.
  Status Collect(size_t r0, size_t r1) {
    SI_RETURN_IF_ERROR(im.Wait("forward pass"));
    const int64_t vocab = im.vocab_range.count;
    const size_t num_logits = logit_local.size();
    const int32_t m = static_cast<int32_t>(r1 - r0);
    if (r0 < num_logits) {
      for (int32_t i = 0; i < m; ++i)
        std::memcpy(logits_out.data() + static_cast<size_t>(logit_index[r0 + i]) * vocab,
                    im.logits_host.get<float>() + static_cast<size_t>(i) * vocab,
                    static_cast<size_t>(vocab) * 4);
      return Status::Ok();
    }
    if (r0 >= dist_first()) return CollectDists(r0, m);
    const int32_t* ids = argmax_ids_host();
    const float* values = argmax_values_host();
    for (int32_t i = 0; i < m; ++i)
      argmax_out[static_cast<size_t>(argmax_index[r0 - num_logits + i])] =
          ArgmaxShare{values[i], static_cast<int32_t>(im.vocab_range.begin) + ids[i]};
    return Status::Ok();
  }

  // Distribution rows [r0, r0 + m), their counts on the host: their packed words (a second
  // download, of exactly what they keep, into the logits rows' staging) kept by row index.
  Status CollectDists(size_t r0, int32_t m) {
    const auto vocab = static_cast<int32_t>(c.vocab_size);
    const int32_t* counts = dist_counts_host();
    int64_t total = 0;
    for (int32_t i = 0; i < m; ++i) {
      if (counts[i] < 0 || counts[i] > vocab)
        return InternalError("distribution row kept " + std::to_string(counts[i]) + " tokens");
      total += kernels::DistRowWords(counts[i], vocab);
    }
    auto* words = reinterpret_cast<uint32_t*>(im.logits_host.get<float>());
    SI_RETURN_IF_ERROR(Check(cudaMemcpyAsync(words, im.dist_packed, static_cast<size_t>(total) * 4,
                                             cudaMemcpyDeviceToHost, im.stream),
                             "distribution rows download"));
    SI_RETURN_IF_ERROR(im.Wait("distribution rows download"));
    for (int32_t i = 0; i < m; ++i) {
      const auto index = static_cast<size_t>(dist_index[r0 - dist_first() + i]);
      const int64_t n = kernels::DistRowWords(counts[i], vocab);
      im.dist_kept[index] = counts[i];
      im.dist_words[index].assign(words, words + n);
      words += n;
    }
    return Status::Ok();
  }

  static Status Check(cudaError_t err, const char* what) { return CudaStatus(err, what); }

  Impl& im;
  const ModelConfig& c;
  const ForwardBatch& batch;
  const int32_t np;
  const std::vector<int32_t>& logit_local;  // rows of this piece whose logits are wanted
  const std::vector<int32_t>& logit_index;  // their index in batch.logit_rows
  const std::span<float> logits_out;
  const std::vector<int32_t>& argmax_index;  // this piece's argmax rows' index in argmax_rows
  const std::span<ArgmaxShare> argmax_out;
  const std::vector<int32_t>& dist_index;  // this piece's distribution rows' index in dist_rows
  bool use_cublas = false;
  bool deferred = false;  // Output leaves the rows on the host for Collect
  kernels::RopeMode rope_mode = kernels::RopeMode::kHalf;
  // Device metadata of the piece: tokens, positions, KV slots [np], logit rows.
  const int32_t* d_tokens = nullptr;
  const int32_t* d_pos = nullptr;
  const int64_t* d_slots = nullptr;
  const int32_t* d_lrows = nullptr;
  const kernels::TokenDraw* d_draws = nullptr;  // [argmax rows] with sampled draws, else null
  const kernels::TokenDraw* d_dist = nullptr;   // [distribution rows] their settings
  kernels::TreeAttentionParams attn;  // all but the layer's caches, set once per piece
};

}  // namespace

Status CudaModelRunner::Impl::Gather(const float* local, int32_t n,
                                     std::span<const ShardRange> shares, float* full,
                                     float* landing) {
  if (landing == nullptr) landing = gathered;
  std::vector<size_t> counts;
  for (const ShardRange& s : shares) counts.push_back(static_cast<size_t>(n * s.count));
  SI_RETURN_IF_ERROR(group->AllGather(local, landing, counts, stream));
  // [rank][n][share] -> [n][total]
  const int64_t total = shares.back().end();
  const float* src = landing;
  for (const ShardRange& s : shares) {
    SI_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy2DAsync(full + s.begin, static_cast<size_t>(total) * 4, src,
                          static_cast<size_t>(s.count) * 4, static_cast<size_t>(s.count) * 4,
                          static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream),
        "gather layout"));
    src += n * s.count;
  }
  return Status::Ok();
}

Status CudaModelRunner::Impl::RunPiece(const ForwardBatch& batch,
                                       std::span<const std::span<const int32_t>> tables_in,
                                       int32_t g0, int32_t g1, std::span<float> logits_out,
                                       std::span<ArgmaxShare> argmax_out) {
  const ModelConfig& c = config();
  const int32_t np = g1 - g0;
  const int32_t bs = opt.kv_block_size;

  // --- host metadata ---
  std::vector<int64_t> slots(static_cast<size_t>(np));
  std::vector<kernels::TreeAttentionRequest> reqs;
  std::vector<int32_t> tables;
  std::vector<uint64_t> masks;
  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    const BatchSequence& s = batch.seqs[si];
    const int32_t b = std::max(g0, s.token_begin), e = std::min(g1, s.token_begin + s.token_count);
    if (b >= e) continue;
    const int32_t row0 = b - s.token_begin, rows = e - b;
    kernels::TreeAttentionRequest r;
    r.token_begin = b - g0;
    r.token_count = rows;
    if (s.mask == nullptr) {
      // Causal: the rows before this piece are committed entries for it.
      r.kv_prefix = s.kv_prefix + row0;
      r.masked_kv = 0;
      r.mask_begin = -1;
    } else {
      r.kv_prefix = s.kv_prefix;
      r.masked_kv = s.masked_kv + row0;
      r.mask_words_per_row = s.mask->words_per_row;
      r.mask_begin = static_cast<int64_t>(masks.size());
      const auto first = s.mask->bits.begin() + static_cast<int64_t>(row0) * s.mask->words_per_row;
      masks.insert(masks.end(), first, first + static_cast<int64_t>(rows) * s.mask->words_per_row);
    }
    const int32_t kv_len = r.kv_prefix + r.masked_kv + rows;
    std::span<const int32_t> table = tables_in[si];
    const int32_t nblocks = (kv_len + bs - 1) / bs;
    r.block_table_begin = static_cast<int32_t>(tables.size());
    tables.insert(tables.end(), table.begin(), table.begin() + nblocks);
    for (int32_t i = 0; i < rows; ++i) {
      const int32_t p = s.kv_prefix + s.masked_kv + row0 + i;
      slots[static_cast<size_t>(b - g0 + i)] =
          int64_t{table[static_cast<size_t>(p / bs)]} * bs + p % bs;
    }
    reqs.push_back(r);
  }
  TreeAttentionPlanOptions po;
  po.qo_heads = hq;
  po.kv_heads = hk;
  po.head_dim = c.head_dim;
  po.target_blocks = 2 * num_sms;
  po.partial_capacity_rows = partial_rows;
  po.fixed_chunk = attn_chunk;
  po.rows_per_item = kernels::TreeAttentionRowsPerItem(kv_type, c.head_dim);
  SI_ASSIGN_OR_RETURN(TreeAttentionPlan ap, PlanTreeAttention(reqs, po));

  // Rows whose logits are wanted in this piece: (local row, index in batch.logit_rows); then
  // its argmax rows (local row after them, index in batch.argmax_rows), then its distribution
  // rows (the same, in batch.dist_rows).
  std::vector<int32_t> logit_local, logit_index, argmax_index, dist_index;
  for (size_t i = 0; i < batch.logit_rows.size(); ++i) {
    const int32_t r = batch.logit_rows[i];
    if (r >= g0 && r < g1) {
      logit_local.push_back(r - g0);
      logit_index.push_back(static_cast<int32_t>(i));
    }
  }
  std::vector<int32_t> lrows = logit_local;
  for (size_t i = 0; i < batch.argmax_rows.size(); ++i) {
    const int32_t r = batch.argmax_rows[i];
    if (r >= g0 && r < g1) {
      lrows.push_back(r - g0);
      argmax_index.push_back(static_cast<int32_t>(i));
    }
  }
  std::vector<kernels::TokenDraw> dist_settings;
  for (size_t i = 0; i < batch.dist_rows.size(); ++i) {
    const int32_t r = batch.dist_rows[i];
    if (r < g0 || r >= g1) continue;
    lrows.push_back(r - g0);
    dist_index.push_back(static_cast<int32_t>(i));
    dist_settings.push_back(ToKernel(batch.dist_settings[i]));
  }
  // With sampled draws, every argmax row's rule (ForwardBatch::draws), for DrawTokens.
  std::vector<kernels::TokenDraw> draws;
  if (batch.has_draws()) {
    for (int32_t i : argmax_index) draws.push_back(ToKernel(batch.draws[static_cast<size_t>(i)]));
  }

  // The metadata, laid out so that every offset but the end depends only on the pass's shape
  // (the graph key below): the block tables, which grow with the contexts, come last.
  std::vector<uint8_t> blob;
  const int64_t tok_off = Append(blob, batch.tokens.data() + g0, static_cast<size_t>(np));
  const int64_t pos_off = Append(blob, batch.positions.data() + g0, static_cast<size_t>(np));
  const int64_t slot_off = Append(blob, slots.data(), slots.size());
  const int64_t mask_off = Append(blob, masks.data(), masks.size());
  const int64_t req_off = Append(blob, reqs.data(), reqs.size());
  const int64_t work_off = Append(blob, ap.work.data(), ap.work.size());
  const int64_t treq_off = Append(blob, ap.token_request.data(), ap.token_request.size());
  const int64_t lrow_off = Append(blob, lrows.data(), lrows.size());
  const int64_t draw_off = Append(blob, draws.data(), draws.size());
  const int64_t dist_off = Append(blob, dist_settings.data(), dist_settings.size());
  const int64_t table_off = Append(blob, tables.data(), tables.size());
  const int64_t bytes = static_cast<int64_t>(blob.size());
  // Grown with room to spare (growing drops the graphs).
  SI_RETURN_IF_ERROR(ReserveMeta(bytes <= meta.bytes() ? bytes : 2 * bytes, "pass metadata"));
  std::memcpy(meta_host.get(), blob.data(), blob.size());
  SI_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(meta.get(), meta_host.get(), blob.size(), cudaMemcpyHostToDevice, stream),
      "metadata upload"));
  uint8_t* md = meta.get<uint8_t>();

  PieceOps ops(*this, batch, np, logit_local, logit_index, logits_out, argmax_index, argmax_out,
               dist_index);
  ops.d_tokens = reinterpret_cast<const int32_t*>(md + tok_off);
  ops.d_pos = reinterpret_cast<const int32_t*>(md + pos_off);
  ops.d_slots = reinterpret_cast<const int64_t*>(md + slot_off);
  ops.d_lrows = reinterpret_cast<const int32_t*>(md + lrow_off);
  if (!draws.empty()) ops.d_draws = reinterpret_cast<const kernels::TokenDraw*>(md + draw_off);
  if (!dist_settings.empty())
    ops.d_dist = reinterpret_cast<const kernels::TokenDraw*>(md + dist_off);
  kernels::TreeAttentionParams& ap_params = ops.attn;
  ap_params.out = att;
  ap_params.q = kv_type == kernels::AttnType::kF32 ? static_cast<const void*>(q) : q_kv;
  ap_params.block_tables = reinterpret_cast<const int32_t*>(md + table_off);
  ap_params.mask_words = reinterpret_cast<const uint64_t*>(md + mask_off);
  ap_params.requests = reinterpret_cast<const kernels::TreeAttentionRequest*>(md + req_off);
  ap_params.work = reinterpret_cast<const kernels::TreeAttentionWorkItem*>(md + work_off);
  ap_params.token_request = reinterpret_cast<const int32_t*>(md + treq_off);
  ap_params.partial_out = partial_out;
  ap_params.partial_ml = partial_ml;
  ap_params.num_tokens = np;
  ap_params.num_work = static_cast<int32_t>(ap.work.size());
  ap_params.qo_heads = hq;
  ap_params.kv_heads = hk;
  ap_params.head_dim = c.head_dim;
  ap_params.block_size = bs;
  ap_params.kv_chunk = ap.kv_chunk;
  ap_params.rows_per_item = ap.rows_per_item;
  ap_params.max_window = ap.max_window;
  ap_params.scale = c.AttentionScale();  // 1 / sqrt(head_dim) unless the model says otherwise
  ap_params.any_split = ap.any_split;
  ap_params.positions = ops.d_pos;
  ap_params.softcap = c.attn_softcap;

  const auto program = [&] {
    return RunLlamaProgram(ops, static_cast<int32_t>(layer_range.count));
  };
  // A graph holds a batch-invariant pass whose rows fit a classifier chunk of each kind (logits,
  // argmax and distribution rows), of the whole model or of a share whose group's operations can
  // be captured; its key is everything the pass's launches and collectives take by value (the
  // rest is in `meta`, whose address is fixed while graphs are held, as is the host staging's).
  // Every value in it comes from the batch alone (a share's head counts and widths are fixed),
  // so the ranks of a group capture and replay the same passes.
  cudaGraphExec_t graph = nullptr;
  if (batch.batch_invariant && !ops.use_cublas && ops.OneChunkEach() && GraphsAllowed()) {
    const std::vector<int64_t> key = {np,
                                      static_cast<int64_t>(reqs.size()),
                                      static_cast<int64_t>(masks.size()),
                                      static_cast<int64_t>(ap.work.size()),
                                      ap.kv_chunk,
                                      ap.max_window,
                                      ap.rows_per_item,
                                      ap.any_split,
                                      static_cast<int64_t>(logit_local.size()),
                                      static_cast<int64_t>(argmax_index.size()),
                                      static_cast<int64_t>(draws.size()),
                                      static_cast<int64_t>(dist_index.size())};
    ops.deferred = true;
    SI_ASSIGN_OR_RETURN(graph, GraphFor(key, program));
  }
  if (graph != nullptr) {
    SI_RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(graph, stream), "graph launch"));
    ++graph_stats.replayed;
  } else {
    SI_RETURN_IF_ERROR(program());
    ++graph_stats.eager;
  }
  if (ops.deferred) SI_RETURN_IF_ERROR(ops.CollectAll());
  // The pinned metadata is reused by the next piece: wait until this one has run.
  return Wait("forward pass");
}

CudaModelRunner::CudaModelRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModelRunner::~CudaModelRunner() = default;

StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    std::shared_ptr<const Model> model, const CudaRunnerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->model = std::move(model);
  SI_RETURN_IF_ERROR(impl->Init(options, /*random=*/false, DType::kF32, 0));
  spdlog::info("CUDA backend on {}: {}; {}", impl->device_name, impl->plan.ToString(),
               options.cuda_graphs && options.max_graphs > 0
                   ? "decode and tree passes replay CUDA graphs"
                   : "CUDA graphs off (every pass launched kernel by kernel)");
  return std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(impl)));
}

StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::CreateRandom(
    const ModelConfig& config, DType weight_type, uint64_t seed, const CudaRunnerOptions& options) {
  SI_RETURN_IF_ERROR(config.Validate());
  if (weight_type != DType::kF32 && weight_type != DType::kF16)
    return InvalidArgumentError("random device weights are F32 or F16");
  auto impl = std::make_unique<Impl>();
  impl->model = std::make_shared<Model>(config, ModelWeights{}, "random-on-device");
  SI_RETURN_IF_ERROR(impl->Init(options, /*random=*/true, weight_type, seed));
  return std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(impl)));
}

const Model& CudaModelRunner::model() const { return *impl_->model; }
std::string CudaModelRunner::name() const { return "cuda:" + std::to_string(impl_->opt.device); }
int32_t CudaModelRunner::num_kv_blocks() const { return impl_->opt.num_kv_blocks; }
int32_t CudaModelRunner::kv_block_size() const { return impl_->opt.kv_block_size; }
const CudaMemoryPlan& CudaModelRunner::memory_plan() const { return impl_->plan; }
CudaGraphStats CudaModelRunner::graph_stats() const { return impl_->graph_stats; }
void CudaModelRunner::SetCudaGraphs(bool on) {
  impl_->opt.cuda_graphs = on;
  if (!on) impl_->DropGraphs();
}

Status CudaModelRunner::Synchronize() {
  return CudaStatus(cudaStreamSynchronize(impl_->stream), "synchronize");
}

Status CudaModelRunner::Impl::Run(const ForwardBatch& batch,
                                  std::span<const std::span<const int32_t>> tables,
                                  std::span<float> logits, std::span<ArgmaxShare> argmax,
                                  DistRows* dists) {
  if (sharded() && group == nullptr)
    return FailedPreconditionError("this share of the model is not in a group");
  if (sharded() && layout.stage + 1 == layout.num_stages &&
      logits.size() < batch.logit_rows.size() * static_cast<size_t>(vocab_range.count))
    return InvalidArgumentError("logits buffer too small for this share's columns");
  if (layout.stage + 1 == layout.num_stages && argmax.size() < batch.argmax_rows.size())
    return InvalidArgumentError("argmax buffer too small");
  if (sharded() && batch.has_draws())
    return InvalidArgumentError("a share of the model does not draw sampled tokens");
  if (!batch.dist_rows.empty() && layout.stage + 1 == layout.num_stages && dists == nullptr)
    return InvalidArgumentError("distribution rows need a DistRows to fill");
  const int32_t vocab = config().vocab_size;
  dist_kept.assign(batch.dist_rows.size(), -1);
  dist_words.resize(batch.dist_rows.size());
  const int32_t n = batch.size();
  if (n == 0) return Status::Ok();
  SI_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(opt.device), "cudaSetDevice"));
  for (int32_t g0 = 0; g0 < n; g0 += opt.max_batch_tokens) {
    const int32_t g1 = std::min(n, g0 + opt.max_batch_tokens);
    Status s = RunPiece(batch, tables, g0, g1, logits, argmax);
    if (!s.ok()) {
      cudaStreamSynchronize(stream);  // leave nothing running on a failed pass
      return s;
    }
  }
  if (dists == nullptr || layout.stage + 1 < layout.num_stages) return Status::Ok();
  dists->Reset(vocab);
  std::vector<uint32_t> words;
  for (size_t i = 0; i < dist_kept.size(); ++i) {
    if (dist_kept[i] < 0) return InternalError("a distribution row did not come back");
    words.insert(words.end(), dist_words[i].begin(), dist_words[i].end());
  }
  return dists->AddPacked(dist_kept, words);
}

namespace {

// The block table of each of batch.seqs, in order, as `kv` holds them.
std::vector<std::span<const int32_t>> BlockTables(const ForwardBatch& batch,
                                                  const KvCacheManager& kv) {
  std::vector<std::span<const int32_t>> tables;
  tables.reserve(batch.seqs.size());
  for (const BatchSequence& s : batch.seqs) tables.push_back(kv.BlockTable(s.seq));
  return tables;
}

}  // namespace

Status CudaModelRunner::Forward(const ForwardBatch& batch, const KvCacheManager& kv,
                                std::span<float> logits) {
  Impl& im = *impl_;
  const ForwardLimits limits{im.config().vocab_size, im.opt.num_kv_blocks, im.opt.kv_block_size};
  // A share's logits hold only its columns: Run checks their size.
  SI_RETURN_IF_ERROR(
      im.Fail(CheckForward(batch, kv, limits, im.sharded() ? SIZE_MAX : logits.size())));
  return im.Fail(im.Run(batch, BlockTables(batch, kv), logits, {}));
}

Status CudaModelRunner::ForwardArgmax(const ForwardBatch& batch, const KvCacheManager& kv,
                                      std::span<float> logits, std::span<int32_t> argmax,
                                      DistRows* dists) {
  Impl& im = *impl_;
  if (im.sharded())
    return im.Fail(FailedPreconditionError(
        "ForwardArgmax on a share of the model: its argmax is ForwardWithTables' share"));
  const ForwardLimits limits{im.config().vocab_size, im.opt.num_kv_blocks, im.opt.kv_block_size};
  SI_RETURN_IF_ERROR(
      CheckForward(batch, kv, limits, logits.size(), argmax.size(), dists != nullptr));
  std::vector<ArgmaxShare> shares(batch.argmax_rows.size());
  SI_RETURN_IF_ERROR(im.Run(batch, BlockTables(batch, kv), logits, shares, dists));
  for (size_t i = 0; i < shares.size(); ++i) argmax[i] = shares[i].id;
  return Status::Ok();
}

bool CudaModelRunner::draws_tokens() const { return !impl_->sharded(); }
bool CudaModelRunner::returns_distributions() const { return !impl_->sharded(); }

int32_t CudaModelRunner::warmup_passes() const {
  const Impl& im = *impl_;
  return im.opt.cuda_graphs && im.opt.max_graphs > 0 ? 2 : 0;
}

Status CudaModelRunner::ForwardWithTables(const ForwardBatch& batch,
                                          std::span<const std::span<const int32_t>> tables,
                                          std::span<float> logits, std::span<ArgmaxShare> argmax,
                                          DistRows* dists) {
  Impl& im = *impl_;
  const ForwardLimits limits{im.config().vocab_size, im.opt.num_kv_blocks, im.opt.kv_block_size};
  Status s = batch.Validate(im.config().vocab_size);
  if (s.ok() && tables.size() != batch.seqs.size())
    s = InvalidArgumentError("one block table per sequence");
  for (size_t i = 0; s.ok() && i < tables.size(); ++i)
    s = CheckBlockTable(tables[i], batch.seqs[i].kv_end(), limits,
                        "sequence " + std::to_string(i) + "'s block table");
  if (s.ok() && !im.sharded() &&
      logits.size() < batch.logit_rows.size() * static_cast<size_t>(im.config().vocab_size))
    s = InvalidArgumentError("logits buffer too small");
  SI_RETURN_IF_ERROR(im.Fail(s));
  return im.Fail(im.Run(batch, tables, logits, argmax, dists));
}

const CollectiveLayout& CudaModelRunner::layout() const { return impl_->layout; }
Status CudaModelRunner::SetCollective(std::shared_ptr<DeviceCollective> collective) {
  return impl_->SetGroup(std::move(collective));
}
ShardRange CudaModelRunner::layers() const { return impl_->layer_range; }
ShardRange CudaModelRunner::vocab() const { return impl_->vocab_range; }

Status CudaModelRunner::MoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                               std::span<const int32_t> dst) {
  SI_RETURN_IF_ERROR(CheckMoveKv(kv, seq, src, dst));
  return impl_->Move(kv.BlockTable(seq), src, dst);
}

Status CudaModelRunner::MoveKvWithTable(std::span<const int32_t> table,
                                        std::span<const int32_t> src,
                                        std::span<const int32_t> dst) {
  Impl& im = *impl_;
  if (src.size() != dst.size()) return InvalidArgumentError("MoveKv: src and dst differ in size");
  const int64_t covers = static_cast<int64_t>(table.size()) * im.opt.kv_block_size;
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i] < 0 || dst[i] < 0 || src[i] >= covers || dst[i] >= covers)
      return InvalidArgumentError("MoveKv: a position outside the block table");
  const ForwardLimits limits{im.config().vocab_size, im.opt.num_kv_blocks, im.opt.kv_block_size};
  SI_RETURN_IF_ERROR(CheckBlockTable(table, covers, limits, "MoveKv's block table"));
  return im.Move(table, src, dst);
}

Status CudaModelRunner::Impl::Move(std::span<const int32_t> table, std::span<const int32_t> src,
                                   std::span<const int32_t> dst) {
  const int32_t bs = opt.kv_block_size;
  auto slot_of = [&](int32_t p) {
    return int64_t{table[static_cast<size_t>(p / bs)]} * bs + p % bs;
  };
  std::vector<int64_t> from, to;
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == dst[i]) continue;
    from.push_back(slot_of(src[i]));
    to.push_back(slot_of(dst[i]));
  }
  if (from.empty()) return Status::Ok();
  // The moves must behave as if done in order. They run in parallel only when no slot one move
  // writes is read or written by another; otherwise one at a time, in order.
  bool hazard = false;
  {
    std::unordered_set<int64_t> written;
    for (int64_t t : to) hazard |= !written.insert(t).second;
    for (size_t i = 0; i < from.size() && !hazard; ++i)
      hazard = written.count(from[i]) != 0;  // from[i] == to[i] was dropped above
  }
  const int64_t count = static_cast<int64_t>(from.size());
  std::vector<uint8_t> blob;
  const int64_t f_off = Append(blob, from.data(), from.size());
  const int64_t t_off = Append(blob, to.data(), to.size());
  Impl& im = *this;
  SI_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(im.opt.device), "cudaSetDevice"));
  SI_RETURN_IF_ERROR(im.ReserveMeta(static_cast<int64_t>(blob.size()), "move metadata"));
  std::memcpy(im.meta_host.get(), blob.data(), blob.size());
  SI_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(im.meta.get(), im.meta_host.get(), blob.size(),
                                                cudaMemcpyHostToDevice, im.stream),
                                "move metadata upload"));
  const int64_t* d_from = reinterpret_cast<const int64_t*>(im.meta.get<uint8_t>() + f_off);
  const int64_t* d_to = reinterpret_cast<const int64_t*>(im.meta.get<uint8_t>() + t_off);
  const int64_t layer_stride = im.kv_slots * im.kv_local;
  for (int64_t i = 0; i < (hazard ? count : 1); ++i) {
    SI_RETURN_IF_ERROR(
        CudaStatus(kernels::LaunchKvMove(im.k_cache, im.v_cache, im.kv_elem_bytes,
                                         static_cast<int32_t>(im.layer_range.count), layer_stride,
                                         static_cast<int32_t>(im.kv_local), d_from + i, d_to + i,
                                         hazard ? 1 : static_cast<int32_t>(count), im.stream),
                   "KV move"));
  }
  return CudaStatus(cudaStreamSynchronize(im.stream), "KV move");
}

}  // namespace specinfer::cuda
