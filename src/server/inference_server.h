// The serving daemon assembled: Engine -> RequestQueue (its engine core and output processor) ->
// CompletionService -> HTTP gateway and gRPC service, with shared metrics. `specinfer serve` runs
// one; the tests start one in-process on ephemeral ports.
//
// Shutdown order matters: the request queue goes first (queued requests fail with UNAVAILABLE, the
// running one is cancelled, every stream gets its final event), then the frontends, whose
// handlers can then finish, then the engine.
//
// Thread safety: Start/Shutdown from one controlling thread; accessors from any thread.
#pragma once

#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/completion_service.h"
#include "server/grpc_server.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/request_queue.h"

namespace specinfer {

struct InferenceServerOptions {
  EngineOptions engine;           // used by the Start overload that loads the model
  std::string served_model_name;  // "": the model file's stem
  std::string chat_template;      // default chat template override ("": the model's own)
  GenerationDefaults defaults;    // for requests that leave sampling or max_tokens out
  RequestQueueOptions queue;
  HttpServerOptions http;
  bool enable_grpc = true;
  GrpcServerOptions grpc;
};

class InferenceServer {
 public:
  // Loads the model of options.engine, then starts serving.
  static StatusOr<std::unique_ptr<InferenceServer>> Start(InferenceServerOptions options);
  // Serves an engine that is already loaded.
  static StatusOr<std::unique_ptr<InferenceServer>> Start(std::unique_ptr<Engine> engine,
                                                          InferenceServerOptions options);
  ~InferenceServer();  // Shutdown()

  void Shutdown();

  int http_port() const { return http_ ? http_->port() : 0; }
  int grpc_port() const { return grpc_ ? grpc_->port() : 0; }  // 0: gRPC disabled
  const std::string& model_name() const { return service_->model_name(); }
  RequestQueue& queue() { return *queue_; }
  ServerMetrics& metrics() { return *metrics_; }
  CompletionService& service() { return *service_; }

 private:
  InferenceServer() = default;

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<RequestQueue> queue_;
  std::unique_ptr<CompletionService> service_;
  std::unique_ptr<Frontend> http_;  // StartHttpServer
  std::unique_ptr<Frontend> grpc_;  // StartGrpcServer; null when gRPC is disabled
};

// The default served model name for a model path: the file's stem ("SmolLM2-135M-Instruct.Q4_1"
// for ".../SmolLM2-135M-Instruct.Q4_1.gguf"), or the directory's name for a model directory.
std::string DefaultServedModelName(const std::string& model_path);

}  // namespace specinfer
