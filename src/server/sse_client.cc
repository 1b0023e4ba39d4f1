#include "server/sse_client.h"

#include <httplib.h>

#include <chrono>

namespace specinfer {

void TakeSseEvents(std::string& buf, std::vector<std::string>* events) {
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

SseReply PostSse(const std::string& host, int port, const std::string& path,
                 const std::string& body, int stop_after_events,
                 const std::vector<std::pair<std::string, std::string>>& headers) {
  SseReply reply;
  httplib::Client cli(host, port);
  cli.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  for (const auto& [name, value] : headers) req.headers.emplace(name, value);
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

}  // namespace specinfer
