// A small HTTP client for the server tests and the load program: POSTs a JSON body and reads the
// response as it arrives, splitting server-sent events, optionally hanging up after a number of
// events (a client that disconnects mid-stream).
#pragma once

#include <httplib.h>

#include <chrono>
#include <string>
#include <vector>

namespace specinfer::testing {

struct HttpReply {
  int status = 0;                     // 0: no response (see `error`)
  std::string error;                  // the client's error, if any
  bool aborted = false;               // we hung up early
  std::string body;                   // the raw body
  std::vector<std::string> events;    // SSE `data:` payloads, in order ("[DONE]" included)
  std::vector<double> event_seconds;  // arrival time of each event, from the request's start
};

// Splits complete SSE events off the front of `buf` and appends their data payloads.
inline void TakeSseEvents(std::string& buf, std::vector<std::string>* events) {
  for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
    std::string event = buf.substr(0, end);
    buf.erase(0, end + 2);
    std::string data;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      std::string line = event.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if (line.rfind("data: ", 0) == 0) {
        if (!data.empty()) data += '\n';
        data.append(line, 6);
      }
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
    if (!data.empty()) events->push_back(std::move(data));  // comments (":...") carry no data
  }
}

// POSTs `body` to http://host:port`path`. With `stop_after_events` > 0 the connection is closed
// once that many SSE events have arrived.
inline HttpReply Post(const std::string& host, int port, const std::string& path,
                      const std::string& body, int stop_after_events = 0,
                      const httplib::Headers& headers = {}) {
  HttpReply reply;
  httplib::Client cli(host, port);
  cli.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.set_header("Content-Type", "application/json");
  req.body = body;
  const auto t0 = std::chrono::steady_clock::now();
  std::string buf;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    reply.body.append(data, len);
    buf.append(data, len);
    const size_t before = reply.events.size();
    TakeSseEvents(buf, &reply.events);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = before; i < reply.events.size(); ++i) reply.event_seconds.push_back(t);
    if (stop_after_events > 0 && static_cast<int>(reply.events.size()) >= stop_after_events) {
      reply.aborted = true;
      return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  cli.send(req, res, error);
  reply.status = res.status > 0 ? res.status : 0;
  if (error != httplib::Error::Success) reply.error = httplib::to_string(error);
  if (reply.body.empty()) reply.body = res.body;
  return reply;
}

}  // namespace specinfer::testing
