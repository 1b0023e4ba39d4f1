// The gRPC service specinfer.v1.SpecInfer (proto/specinfer.proto) on the synchronous gRPC server.
//
// Generate converts its request into a CompletionRequest and goes through the same
// CompletionService checks and RequestQueue as the HTTP gateway; every event becomes one
// GenerateResponse. The handler polls ServerContext::IsCancelled between events, so a client that
// cancels or disconnects stops its generation (and frees its KV memory) at once.
//
// The generated protobuf/gRPC headers are included by grpc_server.cc only.
//
// Thread safety: see server/frontend.h; RPCs run on gRPC's threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/completion_service.h"
#include "server/frontend.h"
#include "specinfer/status.h"

namespace specinfer {

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  int port = 50051;     // 0: an ephemeral port (see Frontend::port)
  std::string api_key;  // non-empty: metadata "authorization: Bearer KEY" required
  size_t max_message_bytes = 4u << 20;
};

// Binds and starts serving. Unavailable if the address cannot be bound. `service` must outlive
// the returned frontend.
StatusOr<std::unique_ptr<Frontend>> StartGrpcServer(CompletionService& service,
                                                    GrpcServerOptions options);

}  // namespace specinfer
