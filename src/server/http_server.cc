#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <charconv>
#include <csignal>
#include <ctime>
#include <random>
#include <thread>

#include "server/api_key.h"
#include "server/openai_api.h"

namespace specinfer {

namespace {

constexpr auto kKeepAliveInterval = std::chrono::milliseconds(500);
// How long a non-streaming request is answered as a plain response before its body is held open
// with whitespace keep-alives (see HandleCompletion).
constexpr auto kPlainResponseWait = std::chrono::seconds(2);
constexpr const char* kJson = "application/json";

// "cmpl-" + 24 random hex digits.
std::string NewId(const char* prefix) {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[gen() & 15];
  return id;
}

int64_t UnixNow() { return static_cast<int64_t>(std::time(nullptr)); }

// The metrics label for a path: known routes as they are, anything else "other" (a scanner must
// not create unbounded label values).
std::string EndpointLabel(const std::string& path) {
  for (const char* known :
       {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"})
    if (path == known) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

// Whether the Content-Length header (if any) is over `limit` (or not a number).
bool DeclaredLengthExceeds(const httplib::Request& req, size_t limit) {
  const std::string length = req.get_header_value("Content-Length");
  if (length.empty()) return false;
  unsigned long long n = 0;
  auto [ptr, ec] = std::from_chars(length.data(), length.data() + length.size(), n);
  return ec != std::errc() || ptr != length.data() + length.size() || n > limit;
}

void ReplyError(httplib::Response& res, const ApiError& e) {
  res.status = e.HttpStatus();
  res.set_content(OpenAiErrorBody(e), kJson);
}

// httplib::Server with a deeper listen backlog: cpp-httplib 0.11 listens with a backlog of 5, so a
// burst of connections (dozens of clients starting at once) overflows the accept queue and the
// kernel drops handshakes, which clients see as one-second stalls or failed reads.
class GatewayServer : public httplib::Server {
 public:
  // Call after binding; listen() on a listening socket only updates its backlog.
  bool DeepenBacklog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
};

// The gateway: routes, handlers and the thread that runs httplib's accept loop.
struct HttpFrontend final : public Frontend {
  CompletionService& service;
  HttpServerOptions options;
  GatewayServer server;
  std::thread listener;
  std::atomic<bool> listener_done{false};
  int bound_port = 0;
  const int64_t created = UnixNow();

  HttpFrontend(CompletionService& s, HttpServerOptions o) : service(s), options(std::move(o)) {}
  ~HttpFrontend() override { Stop(); }

  int port() const override { return bound_port; }
  void Stop() override {
    server.stop();
    if (listener.joinable()) listener.join();
  }

  void Routes();
  void HandleCompletion(OpenAiEndpoint endpoint, const std::string& body, httplib::Response& res);
};

void HttpFrontend::Routes() {
  httplib::Server& svr = server;
  const int threads =
      options.threads > 0 ? options.threads : service.queue().options().max_queue + 16;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(options.max_body_bytes);
  svr.set_tcp_nodelay(true);  // stream chunks are small; send each at once
  // httplib's default also sets SO_REUSEPORT, which would let a second daemon bind the same port
  // and silently take half the connections. Keep only SO_REUSEADDR (quick restarts).
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty() || req.path.rfind("/v1/", 0) != 0)
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (BearerKeyMatches(auth, options.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e{StatusCode::kUnauthenticated,
               auth.empty() ? "Missing API key: send 'Authorization: Bearer KEY'"
                            : "Incorrect API key provided",
               "", "invalid_api_key", 0};
    ReplyError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });

  // Errors httplib produces itself (unknown path, body too large, bad request line) get an
  // OpenAI error body too; our own error replies already have one.
  svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.code = res.status >= 500 ? StatusCode::kInternal : StatusCode::kInvalidArgument;
    e.http_status = res.status;
    if (res.status == 404) {
      e.code = StatusCode::kNotFound;
      e.message = "No route for " + req.method + " " + req.path.substr(0, 200);
    } else if (res.status == 413) {
      e.message =
          "Request body exceeds the limit of " + std::to_string(options.max_body_bytes) + " bytes";
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    res.set_content(OpenAiErrorBody(e), kJson);
  });

  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        spdlog::error("HTTP handler failed: {}", what);
        ReplyError(res, ApiError::FromStatus(InternalError("internal error: " + what)));
      });

  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    service.metrics().CountRequest(EndpointLabel(req.path), std::to_string(res.status));
  });

  // Bodies are read through a content reader: whatever the Content-Type says (curl -d sends
  // application/x-www-form-urlencoded, which httplib would otherwise parse as a form and cap at
  // 8 KiB), the body is JSON, bounded by max_body_bytes.
  auto post = [this](OpenAiEndpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader) {
      std::string body;
      bool too_large = false;
      const bool read = reader([&](const char* data, size_t len) {
        if (body.size() + len > options.max_body_bytes) {
          too_large = true;
          return false;
        }
        body.append(data, len);
        return true;
      });
      if (!read) {
        // Over the limit (by Content-Length, which httplib checks first, or while reading a
        // chunked body), or a broken upload. Either way the rest of the body is still unread:
        // close the connection after the reply.
        res.set_header("Connection", "close");
        if (too_large || DeclaredLengthExceeds(req, options.max_body_bytes)) {
          ApiError e = ApiError::Invalid("Request body exceeds the limit of " +
                                         std::to_string(options.max_body_bytes) + " bytes");
          e.http_status = 413;
          return ReplyError(res, e);
        }
        return ReplyError(res, ApiError::Invalid("could not read the request body"));
      }
      HandleCompletion(endpoint, body, res);
    };
  };
  svr.Post("/v1/completions", post(OpenAiEndpoint::kCompletions));
  svr.Post("/v1/chat/completions", post(OpenAiEndpoint::kChat));
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    svr.Get(path, [](const httplib::Request& req, httplib::Response& res) {
      ApiError e = ApiError::Invalid("Method " + req.method + " is not allowed; use POST");
      e.http_status = 405;
      ReplyError(res, e);
    });
  }
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        OpenAiModelList(service.model_name(), created, service.engine().context_length()), kJson);
  });
  svr.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != service.model_name()) {
      ReplyError(res, ApiError{StatusCode::kNotFound,
                               "The model '" + id.substr(0, 200) + "' does not exist", "model",
                               "model_not_found", 0});
      return;
    }
    res.set_content(OpenAiModel(id, created, service.engine().context_length()), kJson);
  });
  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", kJson);
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(service.metrics().Render(service.queue().gauges()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
}

void HttpFrontend::HandleCompletion(OpenAiEndpoint endpoint, const std::string& body,
                                        httplib::Response& res) {
  CompletionRequest request;
  if (ApiError e = ParseOpenAiRequest(endpoint, body, &request); !e.ok()) return ReplyError(res, e);
  auto prepared = std::make_shared<PreparedRequest>();
  std::shared_ptr<ResponseStream> stream;
  if (ApiError e = service.Start(request, prepared.get(), &stream); !e.ok()) {
    if (e.code == StatusCode::kUnavailable) e.error_code = "server_busy";
    return ReplyError(res, e);
  }
  auto writer = std::make_shared<OpenAiResponseWriter>(
      endpoint, service.engine().tokenizer(), *prepared, service.model_name(), request.logprobs,
      NewId(endpoint == OpenAiEndpoint::kChat ? "chatcmpl-" : "cmpl-"), UnixNow());

  CompletionService* service_ptr = &service;
  if (!request.stream) {
    // Most responses are ready within kPlainResponseWait: wait for them and answer with the
    // right status (an error that surfaces now still gets its 4xx/5xx).
    const auto deadline = std::chrono::steady_clock::now() + kPlainResponseWait;
    while (!stream->finished() && std::chrono::steady_clock::now() < deadline) {
      std::optional<StreamEvent> ev = stream->Next(std::chrono::milliseconds(100));
      if (!ev) continue;
      if (ev->type == StreamEvent::Type::kError) {
        service.Cancel(stream);
        return ReplyError(res, ApiError::FromStatus(ev->error));
      }
      writer->Add(*ev);
    }
    if (stream->finished()) {
      res.set_content(writer->Response(), kJson);
      return;
    }
    // A long generation: the status (200) goes out now and the body is held open with a space
    // every kKeepAliveInterval (leading whitespace is valid JSON) until the JSON is ready. A
    // client that went away makes a write fail, which cancels its generation and frees its KV
    // memory; without writes nothing would tell (the HTTP library reports no closed peer). An
    // error from here on can only be the body: {"error": {...}} with status 200.
    res.set_chunked_content_provider(
        kJson,
        [service_ptr, stream, writer](size_t, httplib::DataSink& sink) {
          auto send = [&](std::string_view s) { return sink.write(s.data(), s.size()); };
          auto last_write = std::chrono::steady_clock::now();
          while (!stream->finished()) {
            // A space per interval, whether or not tokens are coming in.
            const auto now = std::chrono::steady_clock::now();
            if (now - last_write >= kKeepAliveInterval) {
              if (!send(" ")) {
                service_ptr->Cancel(stream);  // the client is gone
                return false;
              }
              last_write = now;
            }
            std::optional<StreamEvent> ev = stream->Next(kKeepAliveInterval);
            if (!ev) continue;
            if (ev->type == StreamEvent::Type::kError) {
              service_ptr->Cancel(stream);
              if (!send(OpenAiErrorBody(ApiError::FromStatus(ev->error)))) return false;
              sink.done();
              return true;
            }
            writer->Add(*ev);
          }
          if (!send(writer->Response())) return false;
          sink.done();
          return true;
        },
        [service_ptr, stream](bool) { service_ptr->Cancel(stream); });
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // no proxy buffering of the event stream
  const bool include_usage = request.include_usage;
  res.set_chunked_content_provider(
      "text/event-stream",
      [service_ptr, stream, writer, include_usage](size_t, httplib::DataSink& sink) {
        auto send = [&](std::string_view s) { return sink.write(s.data(), s.size()); };
        auto abandon = [&] {  // the client is gone
          service_ptr->Cancel(stream);
          return false;
        };
        for (const std::string& chunk : writer->StreamStart())
          if (!send(SseData(chunk))) return abandon();
        while (!stream->finished()) {
          std::optional<StreamEvent> ev = stream->Next(kKeepAliveInterval);
          if (!ev) {
            if (!stream->finished() && !send(kSseKeepAlive)) return abandon();
            continue;
          }
          if (ev->type == StreamEvent::Type::kError) {
            service_ptr->Cancel(stream);
            if (!send(SseData(OpenAiErrorBody(ApiError::FromStatus(ev->error))))) return false;
            break;
          }
          for (const std::string& chunk : writer->StreamChunks(*ev))
            if (!send(SseData(chunk))) return abandon();
        }
        if (include_usage && stream->finished() && !send(SseData(writer->UsageChunk())))
          return abandon();
        if (!send(kSseDone)) return abandon();
        sink.done();
        return true;
      },
      // Runs however the response ends; cancels whatever did not finish (e.g. headers failed).
      [service_ptr, stream](bool) { service_ptr->Cancel(stream); });
}

}  // namespace

StatusOr<std::unique_ptr<Frontend>> StartHttpServer(CompletionService& service,
                                                    HttpServerOptions options) {
  // A write to a socket the peer closed must fail with EPIPE, not kill the daemon.
  std::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<HttpFrontend>(service, std::move(options));
  impl->Routes();
  const std::string& host = impl->options.host;
  if (impl->options.port == 0) {
    impl->bound_port = impl->server.bind_to_any_port(host);
    if (impl->bound_port <= 0) return UnavailableError("cannot bind an HTTP port on " + host);
  } else {
    if (!impl->server.bind_to_port(host, impl->options.port))
      return UnavailableError("cannot bind HTTP " + host + ":" +
                              std::to_string(impl->options.port));
    impl->bound_port = impl->options.port;
  }
  if (!impl->server.DeepenBacklog(SOMAXCONN))
    spdlog::warn("could not deepen the HTTP listen backlog; bursts of connections may stall");
  // The socket listens already; connections wait in the backlog until the loop runs.
  HttpFrontend* raw = impl.get();
  impl->listener = std::thread([raw] {
    raw->server.listen_after_bind();
    raw->listener_done = true;
  });
  // stop() is a no-op before the loop runs, so Stop() must not be able to come earlier.
  while (!impl->server.is_running() && !impl->listener_done)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!impl->server.is_running()) {
    impl->listener.join();
    return UnavailableError("the HTTP server failed to start on " + host);
  }
  return std::unique_ptr<Frontend>(std::move(impl));
}

}  // namespace specinfer
