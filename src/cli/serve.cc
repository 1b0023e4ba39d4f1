#include "cli/serve.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/stop_signal.h"
#include "server/inference_server.h"

namespace specinfer {

void AddServeOptions(CLI::App* cmd, ServeArgs& a) {
  // The engine options as `generate` has them.
  cmd->add_option("-m,--model", a.engine.model_path, "Model file (GGUF, llama2.c .bin) or HF dir")
      ->required();
  cmd->add_option("--tokenizer", a.engine.tokenizer_path,
                  "Tokenizer file (llama2.c tokenizer.bin); default: the model's own");
  cmd->add_option("-t,--threads", a.engine.num_threads, "CPU threads (0: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("-c,--context", a.engine.context_length,
                  "Context length (0: the model's own; may only shrink it)")
      ->check(CLI::Range(0, 1 << 24));

  cmd->add_option("--host", a.host, "Address to bind (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", a.port, "HTTP port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--grpc-port", a.grpc_port, "gRPC port (0: no gRPC service)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--served-model-name", a.served_model_name,
                  "Model name in the API (default: the model file's stem)");
  cmd->add_option("--api-key", a.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/ and gRPC calls")
      ->envname("SPECINFER_API_KEY");
  cmd->add_option("--chat-template", a.chat_template,
                  "Chat template override: chatml, llama2, llama3 or gemma (default: the model's own)");
  // Request defaults (llama.cpp's --temp, --top-p, --top-k, --n-predict; vLLM's generation config).
  // The last one given wins, so scripts/serve.sh's defaults for its model can be overridden.
  cmd->add_option("--temperature", a.defaults.temperature,
                  "Temperature of requests that give none (0: greedy; OpenAI's default 1)")
      ->check(CLI::Range(0.0f, 2.0f))
      ->take_last();
  cmd->add_option("--top-p", a.defaults.top_p, "top_p of requests that give none (default 1: off)")
      ->check(CLI::Range(0.0f, 1.0f))
      ->take_last();
  cmd->add_option("--top-k", a.defaults.top_k, "top_k of requests that give none (0 or -1: off)")
      ->check(CLI::Range(-1, 1 << 30))
      ->take_last();
  cmd->add_option("--max-tokens", a.defaults.max_tokens,
                  "New tokens for requests that give no max_tokens, at most what the context "
                  "holds (default: 16 for /v1/completions, to the context for chat and gRPC)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->take_last();
  cmd->add_option("--max-batch", a.max_batch,
                  "Sequences generated at once (continuous batching); the KV cache holds this "
                  "many full contexts")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", a.max_batch_tokens,
                  "Tokens per LLM pass: token trees first, prompt chunks fill the rest")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--max-queue", a.max_queue,
                  "Sequences that may wait for the engine; more get 503 'server busy'")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-body-bytes", a.max_body_bytes, "Largest request body (413 beyond)")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 30));
  cmd->add_option("--draft", a.engine.drafts,
                  "Speculator loaded at start (repeatable): ngram[:N], layers:K, model:PATH; "
                  "the default for requests that enable speculation (else ngram)");
  cmd->add_option("--tree", a.tree, "Default token-tree shape of speculative requests")
      ->capture_default_str();
  cmd->add_option("--spec-budget", a.spec_budget,
                  "auto: each step cuts trees to the depth that maximises measured throughput "
                  "(0: plain decoding); static: always the full tree shape; dynamic: trees "
                  "grown by draft confidence to a node budget chosen per step")
      ->check(CLI::IsMember({"auto", "static", "dynamic"}))
      ->capture_default_str();
  cmd->add_flag("--dequantize", a.engine.dequantize,
                "Convert the weights to float32 at load (full precision; 4 bytes per weight)");
  cmd->add_option("--backend", a.engine.backend, "Where the model runs: cpu, or cuda (GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--draft-backend", a.engine.draft_backends,
                  "Where model: and layers: drafts run: cpu (sharing the model's threads), or "
                  "cuda (GPU 0); one for every draft, or one per --draft in order (e.g. "
                  "cuda,cpu). Default: cpu")
      ->delimiter(',')
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag_callback(
      "--enforce-eager", [&a] { a.engine.cuda_graphs = false; },
      "cuda: launch every pass kernel by kernel instead of replaying decode and tree passes "
      "from CUDA graphs");
  cmd->add_option("--http-threads", a.http_threads, "HTTP handler threads (0: max-queue + 16)")
      ->check(CLI::Range(0, 4096));
  cmd->add_flag("--no-prefix-cache", a.no_prefix_cache,
                "Turn automatic prefix caching off: every prompt is prefilled in full instead of "
                "reusing the KV blocks of earlier prompts' common prefixes");
}

int RunServe(const ServeArgs& a) {
  // Before any thread starts (see common/stop_signal.h).
  InstallStopSignalHandlers();

  InferenceServerOptions o;
  o.engine = a.engine;
  if (::isatty(STDERR_FILENO)) {
    o.engine.load_progress = [last = -1](double frac) mutable {
      const int pct = static_cast<int>(frac * 100);
      if (pct == last) return;
      last = pct;
      std::fprintf(stderr, "\rloading model: %3d%%%s", pct, pct == 100 ? "\n" : "");
      std::fflush(stderr);
    };
  }
  o.served_model_name = a.served_model_name;
  o.chat_template = a.chat_template;
  o.defaults = a.defaults;
  o.queue.max_queue = a.max_queue;
  o.queue.batch.max_sequences = a.max_batch;
  o.queue.batch.max_batch_tokens = a.max_batch_tokens;
  o.queue.batch.prefix_cache = !a.no_prefix_cache;
  ParseSpecBudgetMode(a.spec_budget, &o.queue.batch.spec_budget);  // checked by CLI11
  auto tree = TreeShape::Parse(a.tree);
  if (!tree.ok()) {
    std::fprintf(stderr, "error: %s\n", tree.status().ToString().c_str());
    return 1;
  }
  o.queue.default_tree = *tree;
  o.http.host = a.host;
  o.http.port = a.port;
  o.http.api_key = a.api_key;
  o.http.max_body_bytes = static_cast<size_t>(a.max_body_bytes);
  o.http.threads = a.http_threads;
  o.enable_grpc = a.grpc_port != 0;
  o.grpc.host = a.host;
  o.grpc.port = a.grpc_port;
  o.grpc.api_key = a.api_key;

  auto server_or = InferenceServer::Start(std::move(o));
  if (!server_or.ok()) {
    std::fprintf(stderr, "error: %s\n", server_or.status().ToString().c_str());
    return 1;
  }
  InferenceServer& server = **server_or;
  std::string grpc = server.grpc_port() ? a.host + ":" + std::to_string(server.grpc_port()) : "off";
  std::printf("listening http=%s:%d grpc=%s model=%s\n", a.host.c_str(), server.http_port(),
              grpc.c_str(), server.model_name().c_str());
  std::fflush(stdout);
  spdlog::warn("serving '{}' on http://{}:{} (gRPC {}){}", server.model_name(), a.host,
               server.http_port(), grpc, a.api_key.empty() ? "" : " with an API key");

  const int sig = WaitForStopSignal();
  spdlog::warn("signal {}: shutting down", sig);
  server.Shutdown();
  return 0;
}

}  // namespace specinfer
