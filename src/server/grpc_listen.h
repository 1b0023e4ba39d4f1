// Binding and starting a gRPC server: the one place that sets the options every specinfer gRPC
// server shares (the public API in grpc_server.cc, the LLM and SSM workers in src/dist), and the
// channel options of the clients that reach the workers.
//
// grpc++ headers are needed by callers anyway (they own the services); this header adds no
// generated code.
//
// Thread safety: BindGrpcServer may be called from any thread; the returned server is the
// caller's.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "specinfer/status.h"

namespace specinfer {

struct GrpcListenOptions {
  std::string address;                   // "host:port" or "[v6 host]:port"; port 0: ephemeral
  int64_t max_receive_bytes = 64 << 20;  // largest request message accepted
};

struct BoundGrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (the one chosen when the address asked for port 0)
};

// Builds and starts an insecure server for `services` (not owned; they must outlive it) on
// options.address. SO_REUSEPORT is off: gRPC turns it on by default, which would let a second
// daemon share the port silently instead of failing to start. Outgoing messages are unlimited.
// Unavailable "cannot bind ADDRESS" when the address cannot be bound.
StatusOr<BoundGrpcServer> BindGrpcServer(std::span<grpc::Service* const> services,
                                            const GrpcListenOptions& options);

// Channel options for a client of LLM or SSM workers: messages unlimited in size (a MoveKv or a
// batch's logits can be large), and a worker that comes back is reconnected within a second (gRPC's
// default backoff grows to minutes). Each connection attempt may take up to 5 s: gRPC derives that
// timeout from GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, so setting that to 100 ms (as both clients
// once did) failed the first registration on a loaded machine ("connection attempt timed out
// before receiving SETTINGS frame").
grpc::ChannelArguments WorkerChannelArguments();

}  // namespace specinfer
