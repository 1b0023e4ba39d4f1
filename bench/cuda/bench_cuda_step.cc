// Benchmark of one LLM step on the GPU (CudaModelRunner) for a Llama-2-7B-shaped model whose
// random fp16 weights are generated on the device: the latency of a pass verifying a token tree
// of T tokens (T = 1: plain decoding) after a committed context, for T from 1 to 128, and its
// ratio to the 1-token step (how much more a tree costs than one token: SpecInfer's premise is
// that it costs little more). Both matrix-product paths are timed: the batch-invariant kernel
// the engine uses for decode and trees, and cuBLAS (batch-dependent, what prompt passes use).
// The batch-invariant passes are timed launched kernel by kernel (eager) and replayed from a
// CUDA graph (what the engine does for decode and tree passes of a shape it has seen): the
// graph's gain is the launch overhead of a few hundred kernels. Two more graph columns bring back
// what the engine asks for when nobody reads logits: every node's argmax (a greedy tree) and every
// node's distribution under top_k 50, top_p 0.9 (a sampled tree: DistRows, only the kept tokens
// cross), instead of every node's logits.
// --decode N instead generates N tokens one step at a time after the prompt and prints decode
// tokens per second, with graphs and eager (scripts/bench_cuda_vs_torch.py compares the graph
// figure with Hugging Face transformers).
//
//   bench_cuda_step [--preset llama2-7b|tiny|micro] [--context 512] [--trees 1,2,4,8,16,32,64,128]
//                   [--iters 10] [--decode 0] [--kv f16|f32] [--no-partition-blocks]
//
// --no-partition-blocks runs 17-64-token products on the 32- and 64-token tiles of all partitions
// (kernels::SetLinearPartitionBlocks(false): the shape before the partition blocks, the same
// bits), their baseline.
//
// Presets: llama2-7b (dim 4096, 32 layers, 32 heads, ffn 11008, vocab 32000), tiny (for a quick
// check: dim 512, 4 layers), micro (dim 256, 2 layers, vocab 2048: the CUDA emulator's smoke run).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_runner.h"
#include "kv/kv_cache.h"
#include "linear.cuh"

namespace specinfer {
namespace {

using Clock = std::chrono::steady_clock;

ModelConfig Preset(const std::string& name) {
  ModelConfig c;
  c.vocab_size = 32000;
  if (name == "tiny") {
    c.dim = 512, c.hidden_dim = 1376, c.n_layers = 4, c.n_heads = 8, c.n_kv_heads = 8;
  } else if (name == "micro") {
    c.dim = 256, c.hidden_dim = 688, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 4;
    c.vocab_size = 2048;
  } else {
    c.dim = 4096, c.hidden_dim = 11008, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 32;
  }
  c.head_dim = c.dim / c.n_heads;
  c.max_seq_len = 4096;
  c.rope_style = RopeStyle::kHalf;
  c.tied_output = false;
  return c;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace
}  // namespace specinfer

int main(int argc, char** argv) {
  using namespace specinfer;
  std::string preset = "llama2-7b", kv_type = "f16";
  int32_t context = 512, iters = 10, decode = 0;
  std::vector<int32_t> trees = {1, 2, 4, 8, 16, 32, 64, 128};
  CLI::App app{"One LLM step on the GPU vs token-tree size (random fp16 Llama-2-7B shape)"};
  app.add_option("--preset", preset)->check(CLI::IsMember({"llama2-7b", "tiny", "micro"}));
  app.add_option("--context", context, "committed tokens before the tree (the prompt)");
  app.add_option("--trees", trees)->delimiter(',');
  app.add_option("--iters", iters);
  app.add_option("--decode", decode, "generate this many tokens one by one instead");
  app.add_option("--kv", kv_type)->check(CLI::IsMember({"f16", "f32"}));
  bool no_partition_blocks = false;
  app.add_flag("--no-partition-blocks", no_partition_blocks,
               "17-64-token products on the tiles of all partitions (the shape before)");
  CLI11_PARSE(app, argc, argv);
  kernels::SetLinearPartitionBlocks(!no_partition_blocks);
  if (cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "error: no CUDA device found: this benchmark needs a GPU\n");
    return 2;
  }
  const int32_t max_tree = *std::max_element(trees.begin(), trees.end());
  if (context < 1 || iters < 1 || max_tree < 1 || max_tree > 512 ||
      context + std::max(max_tree, decode) > 4096) {
    std::fprintf(stderr, "error: bad options (context + tree or decode must fit 4096)\n");
    return 2;
  }
  const ModelConfig c = Preset(preset);
  cuda::CudaRunnerOptions o;
  o.kv_block_size = 16;
  o.num_kv_blocks = (context + std::max(max_tree, decode) + 16) / 16 + 1;
  o.max_batch_tokens = std::max(512, max_tree);
  o.kv_type = kv_type == "f16" ? cuda::KvCacheType::kF16 : cuda::KvCacheType::kF32;
  auto desc = cuda::DeviceDescription(0);
  std::printf("%s; model %s, random fp16 weights on the device; context %d\n",
              desc.ok() ? desc->c_str() : "?", c.ToString().c_str(), context);
  auto runner_or = cuda::CudaModelRunner::CreateRandom(c, DType::kF16, 1234, o);
  if (!runner_or.ok()) return Fail(runner_or.status());
  cuda::CudaModelRunner& runner = **runner_or;
  std::printf("memory: %s\n", runner.memory_plan().ToString().c_str());
  KvCacheManager kv(o.num_kv_blocks, o.kv_block_size);
  const SeqId seq = kv.AddSequence();
  std::mt19937 rng(5);
  auto tokens = [&](int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = std::uniform_int_distribution<int32_t>(1, c.vocab_size - 1)(rng);
    return t;
  };
  std::vector<float> logits;

  // The prompt (one batch-dependent pass, as the engine's prefill).
  {
    Status s = kv.Reserve(seq, context);
    if (!s.ok()) return Fail(s);
    ForwardBatch b;
    std::vector<int32_t> pos(static_cast<size_t>(context));
    std::iota(pos.begin(), pos.end(), 0);
    b.AddSequence(seq, tokens(context), pos, 0, nullptr);
    b.logit_rows = {context - 1};
    b.batch_invariant = false;
    logits.resize(static_cast<size_t>(c.vocab_size));
    const auto t0 = Clock::now();
    s = runner.Forward(b, kv, logits);
    if (!s.ok()) return Fail(s);
    std::printf("prefill of %d tokens: %.1f ms\n", context,
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }

  if (decode > 0) {
    // Eager first, then with graphs over the same positions (the KV entries are rewritten).
    double tps[2] = {0, 0};
    for (int graphs = 0; graphs < 2; ++graphs) {
      runner.SetCudaGraphs(graphs == 1);
      kv.Truncate(seq, context);
      const auto t0 = Clock::now();
      for (int32_t i = 0; i < decode; ++i) {
        Status s = kv.Reserve(seq, context + i + 1);
        if (!s.ok()) return Fail(s);
        ForwardBatch b;
        b.AddSequence(seq, tokens(1), std::vector<int32_t>{context + i}, context + i, nullptr);
        b.logit_rows = {0};
        s = runner.Forward(b, kv, logits);
        if (!s.ok()) return Fail(s);
      }
      const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      tps[graphs] = decode / sec;
      std::printf("decode (%s): %d tokens in %.3f s: %.2f tokens/s (%.2f ms/token)\n",
                  graphs ? "CUDA graphs" : "eager", decode, sec, decode / sec,
                  1000.0 * sec / decode);
    }
    std::printf("graphs vs eager: %.2fx (graphs captured %lld)\n", tps[1] / tps[0],
                static_cast<long long>(runner.graph_stats().captured));
    std::printf("decode_tokens_per_second=%.3f\n", tps[1]);
    return 0;
  }

  Status s = kv.Reserve(seq, context + max_tree);
  if (!s.ok()) return Fail(s);
  std::printf("%8s %12s %12s %8s %10s %12s %10s %10s %10s %10s\n", "tree", "eager ms", "graph ms",
              "gain", "ratio", "cuBLAS ms", "ratio", "argmax ms", "dists ms", "ratio");
  double base[5] = {0, 0, 0, 0, 0};
  std::vector<int32_t> ids;
  DistRows dists;
  for (int32_t t : trees) {
    // A random tree of t nodes in depth-first order, positions context + depth.
    std::vector<int32_t> parents(static_cast<size_t>(t)), depth(static_cast<size_t>(t));
    for (int32_t i = 0; i < t; ++i) {
      parents[i] = i == 0 ? -1 : std::uniform_int_distribution<int32_t>(0, i - 1)(rng);
      depth[i] = i == 0 ? 0 : depth[parents[i]] + 1;
    }
    const TreeMask mask = TreeMask::FromParents(parents);
    std::vector<int32_t> pos(static_cast<size_t>(t));
    for (int32_t i = 0; i < t; ++i) pos[i] = context + depth[i];
    ForwardBatch b;
    b.AddSequence(seq, tokens(t), pos, context, &mask);
    b.logit_rows.resize(static_cast<size_t>(t));
    std::iota(b.logit_rows.begin(), b.logit_rows.end(), 0);
    logits.resize(static_cast<size_t>(t) * c.vocab_size);
    // The same tree wanting every node's argmax, and every node's distribution.
    ForwardBatch argmax_rows = b, dist_rows = b;
    argmax_rows.logit_rows.clear();
    dist_rows.logit_rows.clear();
    for (int32_t i = 0; i < t; ++i) {
      argmax_rows.AddTokenRow(i);
      dist_rows.AddDistRow(i, TokenDraw{0.8f, 50, 0.9f, 0.0});
    }
    ids.resize(static_cast<size_t>(t));
    // Modes: batch-invariant kernels eager, the same from a graph, cuBLAS (eager: batch-dependent
    // passes are not captured), argmax rows and distribution rows from a graph.
    double ms[5];
    for (int mode = 0; mode < 5; ++mode) {
      b.batch_invariant = mode != 2;
      runner.SetCudaGraphs(mode == 1 || mode >= 3);
      std::vector<double> runs;
      // Untimed first passes: one, and for the graph a second (a shape's first pass runs
      // eagerly, its second is captured).
      const int32_t warmup = mode == 1 || mode >= 3 ? 2 : 1;
      for (int32_t i = 0; i < iters + warmup; ++i) {
        const auto t0 = Clock::now();
        // Synchronous: logits, ids or distributions are back on the host.
        if (mode == 3)
          s = runner.ForwardArgmax(argmax_rows, kv, {}, ids);
        else if (mode == 4)
          s = runner.ForwardArgmax(dist_rows, kv, {}, {}, &dists);
        else
          s = runner.Forward(b, kv, logits);
        if (!s.ok()) return Fail(s);
        if (i >= warmup)
          runs.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      std::sort(runs.begin(), runs.end());
      ms[mode] = runs[runs.size() / 2];
      if (t == trees.front()) base[mode] = ms[mode];
    }
    std::printf("%8d %12.2f %12.2f %7.2fx %10.2f %12.2f %10.2f %10.2f %10.2f %10.2f\n", t, ms[0],
                ms[1], ms[0] / ms[1], ms[1] / base[1], ms[2], ms[2] / base[2], ms[3], ms[4],
                ms[4] / base[3]);
    std::fflush(stdout);
  }
  std::printf(
      "(gain: eager / graph; ratios are to the %d-token step, graph and cuBLAS; those steps "
      "include copying every node's logits back; argmax and dists: graphs bringing back every "
      "node's argmax or distribution (top_k 50, top_p 0.9: the last tree's rows kept %lld "
      "values), the last ratio dists to the %d-token argmax step)\n",
      trees.front(), static_cast<long long>(dists.stored_values()), trees.front());
  return 0;
}
