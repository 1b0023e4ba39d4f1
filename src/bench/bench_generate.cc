// Prefill and decode throughput of the CPU backend, at several thread counts.
//
//   bench_generate --model tests/data/stories260K/stories260K.bin
//   bench_generate --preset stories110M          # random weights of that shape
//
// For each thread count: `--runs` repetitions of (prefill `--prompt` tokens in one pass, then
// decode `--decode` tokens one at a time, greedy); prints the median tokens per second of each
// phase and the speed-up over the first thread count.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/cpu_runner.h"
#include "bench/bench_util.h"
#include "engine/generator.h"
#include "model/loader.h"
#include "model/random_model.h"

using specinfer::bench::Median;

int main(int argc, char** argv) {
  using namespace specinfer;
  CLI::App app{"specinfer CPU prefill/decode benchmark"};
  std::string model_path, preset;
  std::vector<int> threads = {1, 2};
  int prompt = 128, decode = 128, runs = 5;
  app.add_option("--model", model_path, "Model file");
  app.add_option("--preset", preset, "Random weights: stories15M, stories110M, smollm2-135m");
  app.add_option("--threads", threads, "Thread counts to measure")->expected(1, 16);
  app.add_option("--prompt", prompt, "Prompt tokens")->check(CLI::Range(1, 1 << 16));
  app.add_option("--decode", decode, "Decoded tokens")->check(CLI::Range(1, 1 << 16));
  app.add_option("--runs", runs, "Repetitions (the median is reported)")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);

  StatusOr<std::unique_ptr<Model>> loaded =
      !model_path.empty() ? LoadModel(model_path)
                          : [&]() -> StatusOr<std::unique_ptr<Model>> {
        SI_ASSIGN_OR_RETURN(ModelConfig c, PresetConfig(preset.empty() ? "stories15M" : preset));
        return MakeRandomModel(c, 1);
      }();
  if (!loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<Model> model(std::move(loaded).value());
  const ModelConfig& c = model->config();
  if (prompt + decode > c.max_seq_len) {
    std::fprintf(stderr, "error: prompt + decode (%d) exceeds the context (%d)\n",
                 prompt + decode, c.max_seq_len);
    return 1;
  }
  std::printf("model: %s\n  %s, %.1f MiB of weights\n", model->source().c_str(),
              c.ToString().c_str(), model->WeightBytes() / 1048576.0);
  std::printf("prompt %d tokens, decode %d tokens, median of %d runs\n\n", prompt, decode, runs);
  std::printf("%8s %16s %16s %12s %12s\n", "threads", "prefill tok/s", "decode tok/s",
              "prefill x", "decode x");

  std::mt19937 rng(5);
  std::vector<int32_t> tokens(prompt);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  double base_prefill = 0, base_decode = 0;
  for (int t : threads) {
    CpuRunnerOptions o;
    o.num_threads = t;
    o.kv_block_size = 16;
    o.num_kv_blocks = (prompt + decode + 15) / 16 + 1;
    auto runner = CpuModelRunner::Create(model, o);
    if (!runner.ok()) {
      std::fprintf(stderr, "error: %s\n", runner.status().ToString().c_str());
      return 1;
    }
    KvCacheManager kv(o.num_kv_blocks, o.kv_block_size);
    Generator gen(**runner, kv);
    GenerateRequest req;
    req.prompt_tokens = tokens;
    req.max_new_tokens = decode;
    req.sampling.temperature = 0;
    req.prefill_chunk = prompt;
    std::vector<double> pre, dec;
    for (int r = 0; r < runs + 1; ++r) {
      auto res = gen.Generate(req);
      if (!res.ok()) {
        std::fprintf(stderr, "error: %s\n", res.status().ToString().c_str());
        return 1;
      }
      if (r == 0) continue;  // warm-up
      pre.push_back(res->stats.prefill_tokens_per_second());
      dec.push_back(res->stats.decode_tokens_per_second());
    }
    double p = Median(pre), d = Median(dec);
    if (base_prefill == 0) base_prefill = p, base_decode = d;
    std::printf("%8d %16.1f %16.1f %12.2f %12.2f\n", t, p, d, p / base_prefill, d / base_decode);
  }
  return 0;
}
