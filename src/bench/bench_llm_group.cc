// Token-tree passes of an LLM group (dist/llm_client.h: tensor- x pipeline-parallel LLM workers
// over gRPC, here in this process on loopback), their rows brought back as logits, as argmax
// rows (ModelRunner::ForwardArgmax: each last-stage worker answers a row's largest logit over its
// columns and that token's id) or as distribution rows (what each row's sampling distribution
// keeps, made on the last stage). Greedy sequences that read no logits get the second, sampled
// ones the third; this measures what each saves, in one run.
//
//   bench_llm_group [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--tp 1] [--pp 1]
//                   [--threads 2] [--tree 1,8,32,64] [--prefix 128] [--runs 15]
//                   [--temperature 0.7] [--top-k 0] [--top-p 0.9]
//
// For each tree size n (a chain of n nodes after a --prefix-token context, every node's row
// wanted): the median wall time of a pass of each kind (in rotation, so a drift of the machine's
// speed weighs on all), the response bytes per pass (all workers), and the ratios against logits
// rows. Every argmax row is checked against the Argmax of its logits row and every distribution
// row against ComputeProbs of it (bit for bit); a mismatch fails the benchmark.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "bench/bench_util.h"
#include "dist/llm_client.h"
#include "dist/llm_worker.h"
#include "model/loader.h"
#include "sampling/dist_rows.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

using namespace specinfer;
using specinfer::bench::Median;

int main(int argc, char** argv) {
  CLI::App app{"specinfer LLM group tree passes: logits rows against argmax and distribution rows"};
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf", tokenizer_path;
  int tp = 1, pp = 1, threads = 2, prefix = 128, runs = 15;
  std::vector<int> trees = {1, 8, 32, 64};
  float temperature = 0.7f, top_p = 0.9f;
  int top_k = 0;
  app.add_option("--model", model_path, "Model file");
  app.add_option("--tokenizer", tokenizer_path, "Tokenizer (if not in the model file)");
  app.add_option("--tp", tp, "Tensor-parallel workers per stage")->check(CLI::Range(1, 8));
  app.add_option("--pp", pp, "Pipeline stages")->check(CLI::Range(1, 8));
  app.add_option("--threads", threads, "CPU threads per worker")->check(CLI::Range(1, 64));
  app.add_option("--tree", trees, "Tree sizes (nodes per pass)")
      ->delimiter(',')
      ->check(CLI::Range(1, 512));
  app.add_option("--prefix", prefix, "Context tokens before the tree")->check(CLI::Range(1, 8192));
  app.add_option("--runs", runs, "Passes per setting (the median is reported)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--temperature", temperature, "Distribution rows: temperature")
      ->check(CLI::Range(0.01f, 100.0f));
  app.add_option("--top-k", top_k, "Distribution rows: top-k (0: off)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--top-p", top_p, "Distribution rows: top-p")->check(CLI::Range(0.01f, 1.0f));
  CLI11_PARSE(app, argc, argv);

  auto loaded = LoadModelAndTokenizer(model_path, tokenizer_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  const int max_tree = *std::max_element(trees.begin(), trees.end());
  loaded->model->set_context_length(
      std::min(loaded->model->config().max_seq_len, prefix + max_tree + 16));
  const uint64_t fingerprint = VocabFingerprint(*loaded->tokenizer);
  std::shared_ptr<const Model> model(std::move(loaded->model));
  const int32_t vocab = model->config().vocab_size;
  if (prefix + max_tree > model->config().max_seq_len) {
    std::fprintf(stderr, "error: prefix + tree exceeds the context (%d)\n",
                 model->config().max_seq_len);
    return 1;
  }

  std::vector<std::unique_ptr<LlmWorkerServer>> workers;
  LlmGroupOptions group;
  group.tp_size = tp;
  group.num_stages = pp;
  for (int s = 0; s < pp; ++s) {
    for (int r = 0; r < tp; ++r) {
      LlmWorkerOptions o;
      o.stage = s, o.num_stages = pp, o.tp_rank = r, o.tp_size = tp;
      o.num_threads = threads;
      o.max_sequences = 1;
      auto w = LlmWorkerServer::Start(o, model, fingerprint);
      if (!w.ok()) {
        std::fprintf(stderr, "error: worker: %s\n", w.status().ToString().c_str());
        return 1;
      }
      group.workers.push_back((*w)->address());
      workers.push_back(std::move(*w));
    }
  }
  auto remote = RemoteLlmRunner::Connect(group, model, fingerprint);
  if (!remote.ok()) {
    std::fprintf(stderr, "error: %s\n", remote.status().ToString().c_str());
    return 1;
  }
  RemoteLlmRunner& runner = **remote;
  if (!runner.returns_distributions()) {
    std::fprintf(stderr, "error: the group's workers do not return distribution rows\n");
    return 1;
  }
  SamplingParams sp;
  sp.temperature = temperature;
  sp.top_k = top_k;
  sp.top_p = top_p;
  const TokenDraw settings = TokenDraw::Of(sp, 0.0);
  KvCacheManager kv(runner.num_kv_blocks(), runner.kv_block_size());

  // The context, once.
  const SeqId seq = kv.AddSequence();
  if (!kv.Reserve(seq, prefix + max_tree).ok()) {
    std::fprintf(stderr, "error: no KV room\n");
    return 1;
  }
  {
    std::vector<int32_t> toks(static_cast<size_t>(prefix)), pos(static_cast<size_t>(prefix));
    for (int i = 0; i < prefix; ++i) toks[i] = 1 + (i * 7919) % (vocab - 1);
    std::iota(pos.begin(), pos.end(), 0);
    ForwardBatch pre;
    pre.AddSequence(seq, toks, pos, 0, nullptr);
    pre.batch_invariant = false;
    std::vector<float> none;
    Status s = runner.Forward(pre, kv, none);
    if (!s.ok()) {
      std::fprintf(stderr, "error: prefill: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  std::printf(
      "LLM group tp=%d pp=%d (%d threads per worker, in this process, gRPC on loopback), "
      "%s, vocabulary %d, context %d; distribution rows at temperature %.2f, top-k %d, top-p "
      "%.2f\n",
      tp, pp, threads, model_path.c_str(), vocab, prefix, temperature, top_k, top_p);
  std::printf("%6s  %14s  %14s  %12s  %7s  %7s  %14s  %13s  %11s\n", "nodes", "logits ms/pass",
              "argmax ms/pass", "dist ms/pass", "ratio a", "ratio d", "logits B/pass",
              "argmax B/pass", "dist B/pass");
  bool mismatch = false;
  for (int n : trees) {
    std::vector<int32_t> parents(static_cast<size_t>(n));
    std::iota(parents.begin(), parents.end(), -1);
    const TreeMask mask = TreeMask::FromParents(parents);
    std::vector<int32_t> toks(static_cast<size_t>(n)), pos(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) toks[i] = 2 + (i * 104729) % (vocab - 2);
    std::iota(pos.begin(), pos.end(), prefix);
    std::vector<int32_t> rows(static_cast<size_t>(n));
    std::iota(rows.begin(), rows.end(), 0);
    ForwardBatch with_logits, with_argmax, with_dists;
    with_logits.AddSequence(seq, toks, pos, prefix, n > 1 ? &mask : nullptr);
    with_argmax = with_logits;
    with_dists = with_logits;
    with_logits.logit_rows = rows;
    with_argmax.argmax_rows = rows;
    for (int32_t row : rows) with_dists.AddDistRow(row, settings);
    std::vector<float> logits(static_cast<size_t>(n) * vocab), none, want, got;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    DistRows dists;
    std::vector<double> seconds[3];
    int64_t bytes[3] = {0, 0, 0};
    for (int r = 0; r < 3 * (runs + 1); ++r) {
      const int which = (r / 3 + r) % 3;  // 0 1 2 1 2 0 2 0 1 ...: none always goes first
      const auto before = runner.traffic();
      const auto t0 = std::chrono::steady_clock::now();
      Status s = which == 0   ? runner.Forward(with_logits, kv, logits)
                 : which == 1 ? runner.ForwardArgmax(with_argmax, kv, none, ids)
                              : runner.ForwardArgmax(with_dists, kv, none, {}, &dists);
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!s.ok()) {
        std::fprintf(stderr, "error: pass: %s\n", s.ToString().c_str());
        return 1;
      }
      if (r < 3) continue;  // warm-up
      seconds[which].push_back(sec);
      bytes[which] = runner.traffic().response_bytes - before.response_bytes;
    }
    if (dists.size() != n) {
      std::fprintf(stderr, "MISMATCH: tree %d: %d distribution rows\n", n, dists.size());
      return 1;
    }
    for (int i = 0; i < n; ++i) {
      const std::span<const float> row(logits.data() + static_cast<size_t>(i) * vocab,
                                       static_cast<size_t>(vocab));
      if (ids[i] != Argmax(row)) {
        std::fprintf(stderr, "MISMATCH: tree %d row %d: argmax row %d, logits row's argmax %d\n", n,
                     i, ids[i], Argmax(row));
        mismatch = true;
      }
      ComputeProbs(row, sp, want);
      dists.Expand(i, got);
      if (std::memcmp(want.data(), got.data(), want.size() * 4) != 0) {
        std::fprintf(stderr,
                     "MISMATCH: tree %d row %d: distribution row differs from ComputeProbs "
                     "of its logits row\n",
                     n, i);
        mismatch = true;
      }
    }
    const double lm = Median(seconds[0]), am = Median(seconds[1]), dm = Median(seconds[2]);
    std::printf("%6d  %14.2f  %14.2f  %12.2f  %6.2fx  %6.2fx  %14lld  %13lld  %11lld\n", n,
                1e3 * lm, 1e3 * am, 1e3 * dm, lm / am, lm / dm, static_cast<long long>(bytes[0]),
                static_cast<long long>(bytes[1]), static_cast<long long>(bytes[2]));
  }
  std::printf(
      "ratio a, d: logits-row pass time / argmax-row, distribution-row pass time (median "
      "of %d passes each)\n",
      runs);
  kv.RemoveSequence(seq);
  return mismatch ? 1 : 0;
}
