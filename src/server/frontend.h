// A network frontend of the daemon: the OpenAI-compatible HTTP gateway (StartHttpServer,
// http_server.h) or the gRPC service (StartGrpcServer, grpc_server.h). Each takes requests to one
// CompletionService; this interface is what its owner (InferenceServer) controls once it runs.
//
// Thread safety: port/Stop from one controlling thread; requests run on the frontend's own
// threads.
#pragma once

namespace specinfer {

class Frontend {
 public:
  virtual ~Frontend() = default;  // implementations Stop() first
  // The bound port (the one chosen when the options asked for port 0).
  virtual int port() const = 0;
  // Stops accepting and waits for running requests (their streams must end: shut the request
  // queue down first; gRPC cancels them after a short grace period). Idempotent.
  virtual void Stop() = 0;
};

}  // namespace specinfer
