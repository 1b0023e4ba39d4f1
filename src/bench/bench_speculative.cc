// Speculative decoding against incremental decoding, on one model, in one run.
//
//   bench_speculative [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--threads 2]
//                     [--tokens 128] [--runs 3]
//
// Part 1: the cost of one LLM pass over a token tree of n nodes, relative to a single-token
// decode pass (on a CPU it grows with n; what a tree may cost to pay off), and the weight
// multiply-adds per second it reaches beside the measured int8 peak of the cores.
// Part 2: for each workload (chat prompts: editing a text, summarising it, open-ended writing)
// and each speculation setting, greedy generation of --tokens tokens: median decode tokens per
// second over --runs runs, generated tokens per LLM pass, and the speed-up over incremental
// decoding measured in the same run (the runs go round-robin over the settings, so a changing
// load weighs on all alike). Every speculative output is checked to equal the
// incremental one token for token; a mismatch is reported and fails the benchmark.
// Rows marked "(auto)" run with the adaptive controller (engine/spec_controller.h), which cuts
// the tree each step; rows marked "(dynamic)" grow dynamic trees (spec/dynamic_tree.h) to the
// node budget the controller chooses each step, no deeper than their shape; the others expand
// their full shape (--spec-budget static).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <numeric>
#include <vector>

#include "backend/cpu/simd.h"
#include "backend/cpu/tiled_matrix.h"
#include "bench/bench_util.h"
#include "engine/engine.h"

namespace {

using namespace specinfer;
using bench::Median;

constexpr const char* kText =
    "The city council met on Tuesday to discuss the new park on Elm Street. Residents asked for "
    "more trees, a playground for young children and benches along the river path. The council "
    "agreed to plant two hundred trees in the spring, to build the playground by the end of the "
    "summer and to add twenty benches. The cost of the project is four million dollars, which "
    "will be paid from the city budget and a state grant. Work will start in March and the park "
    "will open to the public in September.";

struct Workload {
  const char* name;
  std::string prompt;
};

struct Setting {
  std::string label;
  std::vector<std::string> drafts;
  std::string tree;
  SpecBudgetMode mode = SpecBudgetMode::kStatic;  // --spec-budget of the row
};

// CPU time of this process (all its threads), seconds.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct PassTime {
  double wall = 0;  // median seconds per pass
  double cpu = 0;   // median CPU seconds per pass, all threads (on a machine busy with other
                    // work, wall time counts the time the threads wait for a core; CPU time
                    // does not, and with one thread it is what the pass costs on an idle core)
};

// Median times of one LLM pass over a chain of `n` tokens after a `prefix`-token context.
PassTime PassSeconds(Engine& engine, int32_t n, int32_t prefix, int runs) {
  ModelRunner& runner = engine.runner();
  KvCacheManager& kv = engine.kv();
  const int32_t vocab = engine.model().config().vocab_size;
  std::vector<double> times, cpu_times;
  std::vector<float> logits(static_cast<size_t>(n) * vocab);
  const SeqId seq = kv.AddSequence();
  std::vector<int32_t> toks(static_cast<size_t>(prefix), 1), pos(static_cast<size_t>(prefix));
  std::iota(pos.begin(), pos.end(), 0);
  if (!kv.Reserve(seq, prefix + n).ok()) return {};
  ForwardBatch pre;
  pre.AddSequence(seq, toks, pos, 0, nullptr);
  pre.batch_invariant = false;
  if (!runner.Forward(pre, kv, logits).ok()) return {};
  std::vector<int32_t> parents(static_cast<size_t>(n));
  std::iota(parents.begin(), parents.end(), -1);
  const TreeMask mask = TreeMask::FromParents(parents);
  std::vector<int32_t> ttoks(static_cast<size_t>(n), 2), tpos(static_cast<size_t>(n));
  std::iota(tpos.begin(), tpos.end(), prefix);
  ForwardBatch batch;
  batch.AddSequence(seq, ttoks, tpos, prefix, &mask);
  batch.logit_rows.resize(static_cast<size_t>(n));
  std::iota(batch.logit_rows.begin(), batch.logit_rows.end(), 0);
  for (int r = 0; r < runs + 1; ++r) {
    const double c0 = ProcessCpuSeconds();
    auto t0 = std::chrono::steady_clock::now();
    if (!runner.Forward(batch, kv, logits).ok()) return {};
    auto t1 = std::chrono::steady_clock::now();
    const double c1 = ProcessCpuSeconds();
    if (r > 0) {
      times.push_back(std::chrono::duration<double>(t1 - t0).count());
      cpu_times.push_back(c1 - c0);
    }
  }
  kv.RemoveSequence(seq);
  return {Median(times), Median(cpu_times)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"specinfer speculative decoding benchmark"};
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2, tokens = 128, runs = 3;
  bool passes_only = false;
  std::vector<int> sizes = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
  app.add_option("--model", model_path, "Model file (a chat model: the workloads are chats)");
  app.add_option("--threads", threads, "CPU threads")->check(CLI::Range(1, 256));
  app.add_option("--tokens", tokens, "Tokens to generate per run")->check(CLI::Range(1, 4096));
  app.add_option("--runs", runs, "Repetitions (the median is reported)")->check(CLI::Range(1, 50));
  bool dequantize = false;
  std::vector<std::string> only;
  app.add_option("--workload", only, "Run only these workloads (edit, summarise, open)");
  app.add_flag("--dequantize", dequantize, "Run the model with its weights converted to float32");
  app.add_flag("--passes-only", passes_only, "Measure the tree-pass costs only (part 1)");
  app.add_option("--sizes", sizes, "Tree sizes for part 1")->check(CLI::Range(1, 512));
  CLI11_PARSE(app, argc, argv);

  EngineOptions o;
  o.model_path = model_path;
  o.num_threads = threads;
  o.dequantize = dequantize;
  o.spec_budget = SpecBudgetMode::kStatic;  // rows name their shape and mode
  auto engine_or = Engine::Create(o);
  if (!engine_or.ok()) {
    std::fprintf(stderr, "error: %s\n", engine_or.status().ToString().c_str());
    return 1;
  }
  Engine& engine = **engine_or;
  o.spec_budget = SpecBudgetMode::kAuto;
  auto adaptive_or = Engine::Create(o);
  if (!adaptive_or.ok()) {
    std::fprintf(stderr, "error: %s\n", adaptive_or.status().ToString().c_str());
    return 1;
  }
  o.spec_budget = SpecBudgetMode::kDynamic;
  auto dynamic_or = Engine::Create(o);
  if (!dynamic_or.ok()) {
    std::fprintf(stderr, "error: %s\n", dynamic_or.status().ToString().c_str());
    return 1;
  }
  const int32_t layers = engine.model().config().n_layers;
  std::printf("model: %s (%d layers%s), %d threads, %d tokens, median of %d runs\n\n",
              model_path.c_str(), layers, dequantize ? ", weights as float32" : "", threads,
              tokens, runs);

  // Weight multiply-adds per token (every layer's projections and the output layer; attention,
  // which depends on the context, not counted), against the integer peak of the cores.
  const ModelConfig& mc = engine.model().config();
  const double kv_dim = static_cast<double>(mc.n_kv_heads) * mc.head_dim;
  const double macs_per_token =
      static_cast<double>(mc.n_layers) *
          (2.0 * mc.dim * mc.q_dim() + 2.0 * mc.dim * kv_dim + 3.0 * mc.dim * mc.hidden_dim) +
      static_cast<double>(mc.vocab_size) * mc.dim;
  const cpu::KernelIsa isa = cpu::GetCpuFeatures().use_avx512_kernels ? cpu::KernelIsa::kAvx512
                                                                      : cpu::KernelIsa::kAvx2;
  const cpu::PeakMacs peak = cpu::MeasurePeakInt8Macs(isa, 0.3);
  std::printf("LLM pass over a tree of n tokens (after 256 tokens of context)\n");
  std::printf("%6s %12s %14s %16s %14s %12s %14s\n", "n", "ms/pass", "x one token",
              "ms per token", "weight GMAC/s", "cpu ms/pass", "cpu x one token");
  const PassTime one = PassSeconds(engine, 1, 256, 10);
  for (int32_t n : sizes) {
    const PassTime p = n == 1 ? one : PassSeconds(engine, n, 256, 10);
    const double s = p.wall;
    std::printf("%6d %12.2f %14.2f %16.2f %14.1f %12.2f %14.2f\n", n, s * 1e3, s / one.wall,
                s * 1e3 / n, n * macs_per_token / s * 1e-9, p.cpu * 1e3, p.cpu / one.cpu);
  }
  if (peak.per_second > 0) {
    std::printf("weight multiply-adds per token: %.1f M; int8 peak (%s, measured on one core): "
                "%.1f GMAC/s per core, %.1f GMAC/s on %d threads\n",
                macs_per_token * 1e-6, peak.instruction, peak.per_second * 1e-9,
                peak.per_second * threads * 1e-9, threads);
  }
  if (passes_only) return 0;

  const std::vector<Workload> workloads = {
      {"edit", std::string("Rewrite the following text, changing 'council' to 'board' and "
                           "keeping everything else the same.\n\n") + kText},
      {"summarise", std::string("Summarise the following text in a few sentences.\n\n") + kText},
      {"open", "Write a short story about a robot who learns to paint."},
  };
  const std::string self = "layers:" + std::to_string(std::max(1, layers / 2));
  const std::vector<Setting> settings = {
      {"incremental", {}, ""},
      {"ngram", {"ngram"}, "1,1"},
      {"ngram", {"ngram"}, "1,1,1,1"},
      {"ngram", {"ngram"}, "1,1,1,1,1,1"},
      {"ngram", {"ngram"}, "1,1,1,1,1,1,1,1"},
      {"ngram", {"ngram"}, "2,1,1,1"},
      {"ngram:1", {"ngram:1"}, "1,1,1,1"},
      {self, {self}, "1,1"},
      {"ngram + " + self, {"ngram", self}, "1,1,1,1"},
      {"ngram (auto)", {"ngram"}, "1,1,1,1", SpecBudgetMode::kAuto},
      {"ngram (auto)", {"ngram"}, "1,1,1,1,1,1,1,1", SpecBudgetMode::kAuto},
      {"ngram + " + self + " (auto)", {"ngram", self}, "1,1,1,1", SpecBudgetMode::kAuto},
      {"ngram (dynamic)", {"ngram"}, "1,1,1,1", SpecBudgetMode::kDynamic},
      {"ngram (dynamic)", {"ngram"}, "1,1,1,1,1,1,1,1", SpecBudgetMode::kDynamic},
      {"ngram + " + self + " (dynamic)", {"ngram", self}, "1,1,1,1", SpecBudgetMode::kDynamic},
      {"ngram + " + self + " (dynamic)", {"ngram", self}, "1,1,1,1,1,1,1,1",
       SpecBudgetMode::kDynamic},
  };

  bool all_equal = true;
  for (const Workload& w : workloads) {
    if (!only.empty() && std::find(only.begin(), only.end(), w.name) == only.end()) continue;
    std::vector<int32_t> stops = engine.default_stop_tokens();
    std::vector<ChatMessage> messages = {{"user", w.prompt}};
    auto prompt = engine.EncodeChat(messages, "", &stops);
    if (!prompt.ok()) {
      std::fprintf(stderr, "error: %s\n", prompt.status().ToString().c_str());
      return 1;
    }
    std::printf("\nworkload '%s' (%zu prompt tokens)\n", w.name, prompt->size());
    std::printf("%-22s %-18s %10s %10s %12s %10s %8s\n", "speculators", "tree", "tok/s",
                "tok/pass", "draft share", "speed-up", "output");
    // Requests per setting; the runs go round-robin over the settings, so that a load that
    // changes during the benchmark (a shared machine) weighs on every setting alike.
    std::vector<GenerateRequest> reqs;
    std::vector<Engine*> engines;
    for (const Setting& s : settings) {
      GenerateRequest req;
      req.prompt_tokens = *prompt;
      req.max_new_tokens = tokens;
      req.sampling.temperature = 0;
      // Generate a fixed number of tokens: an early end of turn would make runs incomparable.
      if (!s.tree.empty()) req.tree_shape = *TreeShape::Parse(s.tree);
      Engine& e = s.mode == SpecBudgetMode::kAuto      ? **adaptive_or
                  : s.mode == SpecBudgetMode::kDynamic ? **dynamic_or
                                                       : engine;
      for (const std::string& d : s.drafts) {
        auto sp = e.GetSpeculator(d);
        if (!sp.ok()) {
          std::fprintf(stderr, "error: %s\n", sp.status().ToString().c_str());
          return 1;
        }
        req.speculators.push_back(*sp);
      }
      reqs.push_back(std::move(req));
      engines.push_back(&e);
    }
    const size_t n = settings.size();
    std::vector<std::vector<double>> rate(n), per_pass(n), draft_share(n);
    std::vector<std::vector<int32_t>> out(n);
    for (int r = 0; r < runs; ++r) {
      for (size_t i = 0; i < n; ++i) {
        auto res = engines[i]->Generate(reqs[i]);
        if (!res.ok()) {
          std::fprintf(stderr, "error: %s\n", res.status().ToString().c_str());
          return 1;
        }
        rate[i].push_back(res->stats.decode_tokens_per_second());
        per_pass[i].push_back(res->stats.tokens_per_pass());
        draft_share[i].push_back(res->stats.spec.draft_seconds / res->stats.decode_seconds);
        out[i] = res->tokens;
      }
    }
    const double base = Median(rate[0]);  // settings[0] is incremental decoding
    for (size_t i = 0; i < n; ++i) {
      const Setting& s = settings[i];
      const double tps = Median(rate[i]);
      const bool equal = out[i] == out[0];
      all_equal = all_equal && equal;
      std::printf("%-22s %-18s %10.1f %10.2f %11.0f%% %9.2fx %8s\n", s.label.c_str(),
                  s.tree.empty() ? "-" : s.tree.c_str(), tps, Median(per_pass[i]),
                  100 * Median(draft_share[i]), tps / base, equal ? "same" : "DIFFERS");
    }
    std::fflush(stdout);
  }
  if (!all_equal) {
    std::fprintf(stderr, "error: a speculative output differs from incremental decoding\n");
    return 1;
  }
  return 0;
}
