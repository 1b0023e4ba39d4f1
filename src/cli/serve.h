// `specinfer serve`: the serving daemon (OpenAI-compatible HTTP gateway and gRPC service) on one
// model, until SIGINT or SIGTERM.
//
//   specinfer serve --model PATH [--tokenizer PATH] [--threads N] [--context N]
//                   [--host 127.0.0.1] [--port 8000] [--grpc-port 50051 (0: off)]
//                   [--served-model-name NAME] [--api-key KEY | $SPECINFER_API_KEY]
//                   [--max-queue 64] [--max-body-bytes 4194304] [--http-threads N]
//                   [--chat-template chatml|llama2|llama3|gemma]
//                   [--temperature T] [--top-p P] [--top-k K] [--max-tokens N]
//                   (defaults for requests that leave the field out)
//
// Once both ports listen it prints one line on standard output:
//   listening http=HOST:PORT grpc=HOST:PORT model=NAME
// (with --port 0 / --grpc-port ... the ports the system chose), then logs to standard error.
#pragma once

#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "server/generation_defaults.h"
#include "spec/spec_grammar.h"

namespace CLI {
class App;
}

namespace specinfer {

struct ServeArgs {
  EngineOptions engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  int grpc_port = 50051;          // 0: no gRPC service
  std::string served_model_name;  // "": the model file's stem
  std::string api_key;
  std::string chat_template;
  GenerationDefaults defaults;  // what requests that leave a sampling field or max_tokens out get
  int max_batch = 4;
  int max_batch_tokens = 512;
  int max_queue = 64;
  int64_t max_body_bytes = 4 << 20;
  int http_threads = 0;  // 0: max_queue + 16
  bool no_prefix_cache = false;  // turns automatic prefix caching off (kv/kv_cache.h)
  // Token-tree shape of speculative requests that give none.
  std::string tree = std::string(kDefaultTreeShape);
  // "auto": adaptive tree depth per step (engine/spec_controller.h); "static": the full shape.
  std::string spec_budget = "auto";
};

// Adds the serve options to `cmd`: the `serve` subcommand of `specinfer`, or the top-level app
// of a program that only serves.
void AddServeOptions(CLI::App* cmd, ServeArgs& args);

// Runs the daemon until SIGINT/SIGTERM: 0 after a clean shutdown, 1 if it cannot start (the
// reason on standard error).
int RunServe(const ServeArgs& args);

}  // namespace specinfer
