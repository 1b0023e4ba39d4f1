// Benchmark of the tree-attention kernel alone (kernels/tree_attention.cuh) on the GPU: every
// combination of batch size, token-tree size and committed context, fp16 Q/K/V with fp32
// accumulation, paged KV (16-position blocks, pages shuffled), random trees in depth-first
// order with their packed-bit masks, the plan adapting KV splitting to the batch. Prints the
// kernel time (median of --iters launches, CUDA events) and the achieved bandwidth: the bytes
// the kernel must read (K and V of every request's context and tree, Q) and write (out) over
// the time.
//
//   bench_cuda_attention [--batch 1,8,32] [--tree 8,32,64,128] [--context 512,2048,8192]
//                        [--heads 32] [--kv-heads 32] [--head-dim 128] [--iters 50] [--csv]
//                        [--kernel auto|cuda-cores] [--no-spread]
//
// Defaults are Llama-2-7B's attention (32 heads of 128, no GQA). --csv prints
// batch,tree,context,us,gbps lines (scripts/bench_cuda_vs_torch.py reads them). --kernel
// cuda-cores times the CUDA-core kernel that fp16 took before the tensor-core one (the baseline
// of tree_attention_mma.cu); auto, the default, is what LaunchTreeAttention runs. --no-spread
// plans every tree's window chunk as 64-row items (TreeAttentionPlanOptions::spread_windows off:
// the same bits, the layout before spreading), the baseline of the spread items.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/tree_attention_plan.h"
#include "random_fill.cuh"
#include "tree_attention.cuh"
#include "tree_attention_internal.cuh"

namespace specinfer {
namespace {

#define BENCH_CHECK(expr)                                                    \
  do {                                                                       \
    const cudaError_t e = (expr);                                            \
    if (e != cudaSuccess) {                                                  \
      std::fprintf(stderr, "error: %s: %s\n", #expr, cudaGetErrorString(e)); \
      return false;                                                          \
    }                                                                        \
  } while (0)

struct Options {
  std::vector<int> batch = {1, 8, 32};
  std::vector<int> tree = {8, 32, 64, 128};
  std::vector<int> context = {512, 2048, 8192};
  int heads = 32, kv_heads = 32, head_dim = 128, iters = 50, block_size = 16;
  bool csv = false;
  std::string kernel = "auto";
  bool no_spread = false;
};

template <typename T>
struct Dev {
  T* p = nullptr;
  ~Dev() {
    if (p) cudaFree(p);
  }
  cudaError_t Alloc(size_t n) { return cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)); }
};

template <typename T>
cudaError_t Upload(Dev<T>& d, const std::vector<T>& v) {
  cudaError_t e = d.Alloc(std::max<size_t>(v.size(), 1));
  if (e != cudaSuccess) return e;
  return cudaMemcpy(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
}

bool RunOne(const Options& o, int batch, int tree, int context, int num_sms) {
  std::mt19937 rng(batch * 1000003 + tree * 1009 + context);
  const int bs = o.block_size;
  const int kv_len = context + tree;
  const int blocks_per_req = (kv_len + bs - 1) / bs;
  const int64_t total_blocks = int64_t{batch} * blocks_per_req;
  std::vector<int32_t> perm(static_cast<size_t>(total_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);

  std::vector<kernels::TreeAttentionRequest> reqs;
  std::vector<uint64_t> words;
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> parents(static_cast<size_t>(tree));
    for (int i = 0; i < tree; ++i)
      parents[i] = i == 0 ? -1 : std::uniform_int_distribution<int>(0, i - 1)(rng);
    const TreeMask m = TreeMask::FromParents(parents);
    kernels::TreeAttentionRequest r;
    r.token_begin = b * tree;
    r.token_count = tree;
    r.kv_prefix = context;
    r.block_table_begin = b * blocks_per_req;
    r.mask_words_per_row = m.words_per_row;
    r.mask_begin = static_cast<int64_t>(words.size());
    words.insert(words.end(), m.bits.begin(), m.bits.end());
    reqs.push_back(r);
  }
  cuda::TreeAttentionPlanOptions po;
  po.qo_heads = o.heads;
  po.kv_heads = o.kv_heads;
  po.head_dim = o.head_dim;
  const bool cuda_cores = o.kernel == "cuda-cores";
  // Blocks that fill the GPU once: the tensor-core kernel keeps 2 blocks per SM, the CUDA-core
  // kernel 4 (its launch bounds for fp16 x 128).
  po.target_blocks = (cuda_cores ? 4 : 2) * num_sms;
  po.partial_capacity_rows = int64_t{batch} * tree * o.heads * 64;
  po.spread_windows = !o.no_spread;
  po.rows_per_item = cuda_cores
                         ? kernels::kTreeAttnRowsPerBlock
                         : kernels::TreeAttentionRowsPerItem(kernels::AttnType::kF16, o.head_dim);
  auto plan = cuda::PlanTreeAttention(reqs, po);
  if (!plan.ok()) {
    std::fprintf(stderr, "error: %s\n", plan.status().ToString().c_str());
    return false;
  }
  const int64_t tokens = int64_t{batch} * tree;
  const int64_t slots = total_blocks * bs;
  const int64_t kv_elems = slots * o.kv_heads * o.head_dim;
  Dev<__half> q, k, v, out;
  Dev<float> pout, pml;
  Dev<int32_t> tables, treq;
  Dev<uint64_t> mask;
  Dev<kernels::TreeAttentionRequest> dreq;
  Dev<kernels::TreeAttentionWorkItem> work;
  BENCH_CHECK(q.Alloc(tokens * o.heads * o.head_dim));
  BENCH_CHECK(out.Alloc(tokens * o.heads * o.head_dim));
  BENCH_CHECK(k.Alloc(kv_elems));
  BENCH_CHECK(v.Alloc(kv_elems));
  BENCH_CHECK(pout.Alloc(std::max<int64_t>(plan->partial_rows, 1) * o.head_dim));
  BENCH_CHECK(pml.Alloc(std::max<int64_t>(plan->partial_rows, 1) * 2));
  BENCH_CHECK(kernels::LaunchRandomFill(q.p, tokens * o.heads * o.head_dim, 1, 0, 1, nullptr));
  BENCH_CHECK(kernels::LaunchRandomFill(k.p, kv_elems, 2, 0, 1, nullptr));
  BENCH_CHECK(kernels::LaunchRandomFill(v.p, kv_elems, 3, 0, 1, nullptr));
  BENCH_CHECK(Upload(tables, perm));
  BENCH_CHECK(Upload(treq, plan->token_request));
  BENCH_CHECK(Upload(mask, words));
  BENCH_CHECK(Upload(dreq, reqs));
  BENCH_CHECK(Upload(work, plan->work));

  kernels::TreeAttentionParams p;
  p.q = q.p;
  p.k_cache = k.p;
  p.v_cache = v.p;
  p.out = out.p;
  p.block_tables = tables.p;
  p.mask_words = mask.p;
  p.requests = dreq.p;
  p.work = work.p;
  p.token_request = treq.p;
  p.partial_out = pout.p;
  p.partial_ml = pml.p;
  p.num_tokens = static_cast<int32_t>(tokens);
  p.num_work = static_cast<int32_t>(plan->work.size());
  p.qo_heads = o.heads;
  p.kv_heads = o.kv_heads;
  p.head_dim = o.head_dim;
  p.block_size = bs;
  p.kv_chunk = plan->kv_chunk;
  p.rows_per_item = plan->rows_per_item;
  p.max_window = plan->max_window;
  p.scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));
  p.any_split = plan->any_split;

  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < o.iters + 3; ++i) {
    BENCH_CHECK(cudaEventRecord(start));
    BENCH_CHECK(
        cuda_cores
            ? kernels::LaunchTreeAttentionCudaCores(p, kernels::AttnType::kF16, false, nullptr)
            : kernels::LaunchTreeAttention(p, kernels::AttnType::kF16, false, nullptr));
    BENCH_CHECK(cudaEventRecord(stop));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (i >= 3) ms.push_back(t);  // the first launches warm up
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  const double us = ms[ms.size() / 2] * 1000.0;
  const double bytes =
      2.0 * (2.0 * batch * kv_len * o.kv_heads * o.head_dim + 2.0 * tokens * o.heads * o.head_dim);
  const double gbps = bytes / (us * 1e-6) / 1e9;
  if (o.csv) {
    std::printf("%d,%d,%d,%.2f,%.1f\n", batch, tree, context, us, gbps);
  } else {
    std::printf("batch %3d  tree %4d  context %5d  %10.1f us  %7.1f GB/s  (%zu blocks%s%s)\n",
                batch, tree, context, us, gbps, plan->work.size() * o.kv_heads,
                plan->any_split ? ", split KV" : "", plan->spread_items > 0 ? ", spread" : "");
  }
  std::fflush(stdout);
  return true;
}

}  // namespace
}  // namespace specinfer

int main(int argc, char** argv) {
  using namespace specinfer;
  Options o;
  CLI::App app{"Tree-attention kernel benchmark (GPU)"};
  app.add_option("--batch", o.batch)->delimiter(',');
  app.add_option("--tree", o.tree)->delimiter(',');
  app.add_option("--context", o.context)->delimiter(',');
  app.add_option("--heads", o.heads);
  app.add_option("--kv-heads", o.kv_heads);
  app.add_option("--head-dim", o.head_dim);
  app.add_option("--iters", o.iters);
  app.add_flag("--csv", o.csv);
  app.add_option("--kernel", o.kernel)->check(CLI::IsMember({"auto", "cuda-cores"}));
  app.add_flag("--no-spread", o.no_spread, "plan tree windows as 64-row items (the old layout)");
  CLI11_PARSE(app, argc, argv);
  if (cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "error: no CUDA device found: this benchmark needs a GPU\n");
    return 2;
  }
  if (o.iters < 1 || o.heads % o.kv_heads != 0 || o.head_dim > 256) {
    std::fprintf(stderr, "error: bad options\n");
    return 2;
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto desc = cuda::DeviceDescription(0);
  if (!o.csv)
    std::printf("%s, %d SMs; heads %d/%d x %d, fp16; kernel %s\n", desc.ok() ? desc->c_str() : "?",
                sms, o.heads, o.kv_heads, o.head_dim, o.kernel.c_str());
  for (int b : o.batch)
    for (int t : o.tree)
      for (int c : o.context)
        if (!RunOne(o, b, t, c, sms)) return 1;
  return 0;
}
