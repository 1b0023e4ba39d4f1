// The OpenAI-compatible HTTP gateway (cpp-httplib):
//
//   POST /v1/completions        text completion; stream: true -> server-sent events
//   POST /v1/chat/completions   chat (the model's template applied); stream: true -> SSE
//   GET  /v1/models, /v1/models/{id}
//   GET  /health                200 {"status": "ok"} while serving
//   GET  /metrics               Prometheus text format (server/metrics.h)
//
// Streams are `data: {json}\n\n` chunks ending with `data: [DONE]\n\n`; a failure after the
// stream started is sent as `data: {"error": {...}}` before [DONE]. While a streamed request
// waits (queued, or logprobs pending) an SSE comment is sent every half second, which also
// detects clients that went away.
//
// Errors are OpenAI error objects (server/openai_api.h) with the status of their code: 400 bad
// request (malformed JSON, wrong types, out-of-range values, invalid UTF-8, prompt too long), 401
// missing or wrong API key, 404 unknown model or path, 413 body over the limit, 503 queue full.
// With an API key, every /v1/ path needs "Authorization: Bearer KEY"; /health and /metrics stay
// open (for probes and scrapers).
//
// Cancellation: a streaming client that disconnects is noticed at the next write (a token or a
// keep-alive), and its generation is cancelled (KV freed) at once. A non-streaming request
// cannot observe its connection with cpp-httplib 0.11 (no connection state reaches handlers;
// Request::is_connection_closed arrived in 0.18) and runs to its max_tokens.
//
// httplib.h is included by http_server.cc only.
//
// Thread safety: see server/frontend.h; requests run on the server's own thread pool.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/completion_service.h"
#include "server/frontend.h"
#include "specinfer/status.h"

namespace specinfer {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: an ephemeral port (see Frontend::port)
  std::string api_key;  // non-empty: required on /v1/ paths
  size_t max_body_bytes = 4u << 20;
  // Handler threads. A streaming response occupies one for its whole duration, so there should be
  // more than the request queue holds (else waiting connections never see "server busy").
  // 0: max_queue + 16.
  int threads = 0;
};

// Binds and starts serving in the background. Unavailable if the address cannot be bound.
// `service` must outlive the returned frontend.
StatusOr<std::unique_ptr<Frontend>> StartHttpServer(CompletionService& service,
                                                    HttpServerOptions options);

}  // namespace specinfer
