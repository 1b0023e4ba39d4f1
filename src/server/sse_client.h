// A small HTTP client for the OpenAI gateway's streams, used by the serving benchmark
// (src/bench/bench_serving.cc), the server tests and the load program: POSTs a JSON body and reads
// the response as it arrives, splitting server-sent events, optionally hanging up after a number
// of events (a client that disconnects mid-stream).
//
// httplib.h stays in the .cc (as with the server).
//
// Thread safety: free functions; each PostSse call uses its own connection.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace specinfer {

struct SseReply {
  int status = 0;                     // 0: no response (see `error`)
  std::string error;                  // the client's error, if any
  bool aborted = false;               // we hung up early
  std::string body;                   // the raw body
  std::vector<std::string> events;    // SSE `data:` payloads, in order ("[DONE]" included)
  std::vector<double> event_seconds;  // arrival time of each event, from the request's start
};

// Splits complete SSE events off the front of `buf` and appends their data payloads (events
// without data, such as ": keep-alive" comments, add none).
void TakeSseEvents(std::string& buf, std::vector<std::string>* events);

// POSTs `body` (JSON) to http://host:port`path` with `headers` added, reading for up to 60 s
// between bytes. With `stop_after_events` > 0 the connection is closed once that many SSE events
// have arrived.
SseReply PostSse(const std::string& host, int port, const std::string& path,
                 const std::string& body, int stop_after_events = 0,
                 const std::vector<std::pair<std::string, std::string>>& headers = {});

}  // namespace specinfer
