// specinfer command-line entry point.
//
//   specinfer generate --model PATH [--tokenizer PATH] --prompt TEXT --max-tokens N
//                      [--temperature T] [--top-k K] [--top-p P] [--seed S] [--json]
//                      [--chat [--chat-template chatml|llama2|llama3|gemma] [--system TEXT]]
//                      [--draft ngram[:N]|layers:K|model:PATH ...] [--tree 1,1,3,1]
//                      [--backend cpu|cuda] [--draft-backend cpu|cuda[,...]] [--enforce-eager]
//   specinfer serve ...                       (cli/serve.h)
//   specinfer cluster --config FILE [--role all|manager]     (cli/cluster.h: distributed serving)
//   specinfer worker --config FILE --role ssm|llm --index N
//
// Each --draft adds a speculator; their token trees are merged and verified by the model in one
// pass per step (greedy output is the same as without drafts, sampled output has the same
// distribution). --json reports the speculation statistics.
// With --chat the prompt is a user message (after an optional system message), rendered with the
// model's chat template (or the named override) and encoded with special tokens parsed; generation
// also stops at the template's end-of-turn token.
//
// Standard output carries only the generated continuation (streamed as it is produced), or with
// --json one JSON object. Logs and errors go to standard error; failures exit non-zero.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include <unistd.h>

#include "cli/cluster.h"
#include "cli/serve.h"
#include "engine/chat_template.h"
#include "engine/engine.h"

// The backends this program adds to the core's "cpu" (backend/registry.h), for every command
// (generate, serve, cluster and its workers): the one place that knows whether the build has
// the CUDA library.
#if defined(SPECINFER_WITH_CUDA)
#include "backend/cuda/cuda_backend.h"
#include "dist/cuda/cuda_worker_shard.h"
static void RegisterBackends() {
  specinfer::cuda::RegisterCudaBackend();
  specinfer::RegisterCudaWorkerShard();  // LLM workers with backend: cuda
}
#else
static void RegisterBackends() {}
#endif

namespace specinfer {
namespace {

struct GenerateArgs {
  EngineOptions engine;
  std::string prompt;
  int32_t max_tokens = 256;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  int64_t seed = -1;
  bool json = false;
  bool chat = false;
  std::string chat_template;  // empty: the model's own
  std::string system;
  std::string tree = std::string(kDefaultTreeShape);  // SpecInfer's example expansion
  std::string spec_budget = "auto";                   // engine/spec_controller.h
};

void AddEngineOptions(CLI::App* cmd, EngineOptions& o) {
  cmd->add_option("-m,--model", o.model_path, "Model file (GGUF or llama2.c .bin)")->required();
  cmd->add_option("--tokenizer", o.tokenizer_path,
                  "Tokenizer file (llama2.c tokenizer.bin); default: the model's own, or "
                  "tokenizer.bin beside a llama2.c model");
  cmd->add_option("-t,--threads", o.num_threads, "CPU threads (0: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("-c,--context", o.context_length,
                  "Context length (0: the model's own; may only shrink it)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_flag("--dequantize", o.dequantize,
                "Convert the weights to float32 at load (full precision; 4 bytes per weight)");
  cmd->add_option("--backend", o.backend, "Where the model runs: cpu, or cuda (GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--draft-backend", o.draft_backends,
                  "Where model: and layers: drafts run: cpu (sharing the model's threads), or "
                  "cuda (GPU 0); one for every draft, or one per --draft in order (e.g. "
                  "cuda,cpu). Default: cpu")
      ->delimiter(',')
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag_callback(
      "--enforce-eager", [&o] { o.cuda_graphs = false; },
      "cuda: launch every pass kernel by kernel instead of replaying decode and tree passes "
      "from CUDA graphs");
}

// --system and --prompt as a conversation.
std::vector<ChatMessage> ChatMessages(const GenerateArgs& a) {
  std::vector<ChatMessage> messages;
  if (!a.system.empty()) messages.push_back({"system", a.system});
  messages.push_back({"user", a.prompt});
  return messages;
}

int RunGenerate(const GenerateArgs& a) {
  if (!a.chat_template.empty()) {
    // Reject an unknown name before the (slow) model load.
    auto named = ChatTemplate::Named(a.chat_template);
    if (!named.ok()) {
      std::fprintf(stderr, "error: %s\n", named.status().ToString().c_str());
      return 1;
    }
  }
  EngineOptions engine_options = a.engine;
  ParseSpecBudgetMode(a.spec_budget, &engine_options.spec_budget);  // checked by CLI11
  if (::isatty(STDERR_FILENO)) {
    // A percentage on the terminal while the weights are paged in (large models take a while).
    engine_options.load_progress = [last = -1](double frac) mutable {
      const int pct = static_cast<int>(frac * 100);
      if (pct == last) return;
      last = pct;
      std::fprintf(stderr, "\rloading model: %3d%%%s", pct, pct == 100 ? "\n" : "");
      std::fflush(stderr);
    };
  }
  auto engine_or = Engine::Create(engine_options);
  if (!engine_or.ok()) {
    std::fprintf(stderr, "error: %s\n", engine_or.status().ToString().c_str());
    return 1;
  }
  Engine& engine = **engine_or;
  std::vector<int32_t> stop_tokens = engine.default_stop_tokens();
  auto prompt_or =
      a.chat ? engine.EncodeChat(ChatMessages(a), a.chat_template, &stop_tokens)
             : engine.EncodePrompt(a.prompt);
  if (!prompt_or.ok()) {
    std::fprintf(stderr, "error: %s\n", prompt_or.status().ToString().c_str());
    return 1;
  }

  GenerateRequest req;
  auto shape_or = TreeShape::Parse(a.tree);
  if (!shape_or.ok()) {
    std::fprintf(stderr, "error: %s\n", shape_or.status().ToString().c_str());
    return 1;
  }
  req.tree_shape = *shape_or;
  req.speculators = engine.speculators();
  req.prompt_tokens = std::move(prompt_or).value();
  req.max_new_tokens = a.max_tokens;
  req.sampling.temperature = a.temperature;
  req.sampling.top_k = a.top_k;
  req.sampling.top_p = a.top_p;
  req.sampling.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}();
  req.stop_tokens = stop_tokens;
  req.callback_logits = false;  // on_token prints text only

  const Tokenizer& tok = engine.tokenizer();
  Utf8StreamDecoder decoder;
  std::string text;
  int32_t prev = req.prompt_tokens.back();
  auto on_token = [&](int32_t id, std::span<const float>) {
    bool is_stop = std::find(req.stop_tokens.begin(), req.stop_tokens.end(), id) !=
                   req.stop_tokens.end();
    std::string piece = is_stop ? std::string() : decoder.Push(tok.TokenBytes(prev, id));
    prev = id;
    text += piece;
    if (!a.json && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  auto result_or = engine.Generate(req, on_token);
  if (!result_or.ok()) {
    if (!a.json) std::fputc('\n', stdout);
    std::fprintf(stderr, "error: %s\n", result_or.status().ToString().c_str());
    return 1;
  }
  std::string tail = decoder.Flush();
  text += tail;
  const GenerateResult& r = *result_or;
  if (a.json) {
    nlohmann::json j;
    j["text"] = text;
    j["tokens"] = r.tokens;
    j["prompt_tokens"] = req.prompt_tokens;
    j["finish_reason"] = FinishReasonName(r.finish_reason);
    j["seed"] = req.sampling.seed;
    j["timing"] = {
        {"prefill_seconds", r.stats.prefill_seconds},
        {"decode_seconds", r.stats.decode_seconds},
        {"prefill_tokens_per_second", r.stats.prefill_tokens_per_second()},
        {"decode_tokens_per_second", r.stats.decode_tokens_per_second()},
        {"forward_passes", r.stats.forward_passes},
    };
    const SpeculationStats& sp = r.stats.spec;
    nlohmann::json by_spec = nlohmann::json::array();
    for (size_t i = 0; i < sp.speculator_names.size(); ++i)
      by_spec.push_back({{"name", sp.speculator_names[i]},
                         {"proposed_tokens", sp.proposed_by[i]},
                         {"accepted_tokens", sp.accepted_by[i]}});
    j["speculation"] = {
        {"tree", req.speculators.empty() ? "" : req.tree_shape.ToString()},
        {"llm_passes", r.stats.decode_passes},
        {"tokens_per_pass", r.stats.tokens_per_pass()},
        {"accepted_tokens", sp.accepted_tokens},
        {"tree_tokens", sp.tree_nodes},
        {"proposed_at_depth", sp.proposed_at_depth},
        {"accepted_at_depth", sp.accepted_at_depth},
        {"speculators", by_spec},
        {"draft_seconds", sp.draft_seconds},
        {"verify_seconds", sp.verify_seconds},
    };
    // Invalid UTF-8 cannot occur in `text` (the stream decoder replaces it), so dump never throws.
    std::cout << j.dump() << std::endl;
  } else {
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::fputc('\n', stdout);
  }
  spdlog::info("{} prompt tokens, {} generated; prefill {:.1f} tok/s, decode {:.1f} tok/s, "
               "{:.2f} tokens per LLM pass",
               r.stats.prompt_tokens, r.stats.generated_tokens,
               r.stats.prefill_tokens_per_second(), r.stats.decode_tokens_per_second(),
               r.stats.tokens_per_pass());
  return 0;
}

}  // namespace
}  // namespace specinfer

int main(int argc, char** argv) {
  using namespace specinfer;
  auto logger = spdlog::stderr_color_mt("specinfer");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::warn);
  RegisterBackends();

  CLI::App app{"specinfer: LLM serving with tree-based speculative inference"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  GenerateArgs gen;
  CLI::App* generate = app.add_subcommand("generate", "Generate a continuation of a prompt");
  AddEngineOptions(generate, gen.engine);
  generate->add_option("-p,--prompt", gen.prompt, "Prompt text (empty: BOS alone)");
  generate->add_option("-n,--max-tokens", gen.max_tokens, "Maximum number of new tokens")
      ->check(CLI::Range(0, 1 << 24));
  generate->add_option("--temperature", gen.temperature, "Sampling temperature (0: greedy)")
      ->check(CLI::Range(0.0f, 100.0f));
  generate->add_option("--top-k", gen.top_k, "Keep the K most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--top-p", gen.top_p, "Nucleus sampling mass (1: off)")
      ->check(CLI::Range(0.0f, 1.0f));
  generate->add_option("--seed", gen.seed, "Random seed (default: random)");
  generate->add_flag("--json", gen.json, "Print one JSON object with text, tokens and timings");
  CLI::Option* chat_flag = generate->add_flag(
      "--chat", gen.chat, "Treat --prompt as a user message and apply the model's chat template");
  generate->add_option("--chat-template", gen.chat_template,
                       "Chat template override with --chat: chatml, llama2, llama3 or gemma")
      ->needs(chat_flag);
  generate->add_option("--system", gen.system, "System message with --chat")->needs(chat_flag);
  generate->add_option("--draft", gen.engine.drafts,
                       "Speculator (repeatable): ngram[:N] (prompt lookup), layers:K (the "
                       "model's first K layers), model:PATH (a draft model sharing the "
                       "vocabulary)");
  generate->add_option("--tree", gen.tree,
                       "Token tree expansion <k1,...,km>: children per node at each depth")
      ->capture_default_str();
  generate->add_option("--spec-budget", gen.spec_budget,
                       "auto: each step cuts the tree to the depth that maximises measured "
                       "throughput (0: plain decoding); static: always the full tree shape; "
                       "dynamic: trees grown by draft confidence to a node budget chosen per step")
      ->check(CLI::IsMember({"auto", "static", "dynamic"}))
      ->capture_default_str();

  ServeArgs serve_args;
  CLI::App* serve =
      app.add_subcommand("serve", "Serve the model: OpenAI-compatible HTTP API and gRPC");
  AddServeOptions(serve, serve_args);

  ClusterArgs cluster_args, worker_args;
  CLI::App* cluster = AddClusterCommand(app, cluster_args);
  CLI::App* worker = AddWorkerCommand(app, worker_args);

  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (generate->parsed()) return RunGenerate(gen);
  if (serve->parsed()) return RunServe(serve_args);
  if (cluster->parsed()) return RunClusterCommand(cluster_args, argv[0]);
  if (worker->parsed()) return RunWorkerCommand(worker_args);
  return 2;
}
