#include "dist/collective.h"

#include <grpcpp/grpcpp.h>

#include <gloo/allgatherv.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <csignal>
#include <charconv>
#include <mutex>
#include <exception>

#include "proto/llm_worker.grpc.pb.h"

namespace specinfer {

namespace {

using Clock = std::chrono::steady_clock;

// The epoch N of a key "e<N>/...", or 0.
uint64_t KeyEpoch(const std::string& key) {
  if (key.size() < 3 || key[0] != 'e') return 0;
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(key.data() + 1, key.data() + key.size(), v);
  if (ec != std::errc() || p == key.data() + key.size() || *p != '/') return 0;
  return v;
}

class GrpcRendezvousStore final : public gloo::rendezvous::Store {
 public:
  GrpcRendezvousStore(const std::string& address, std::chrono::milliseconds timeout)
      : address_(address),
        timeout_(timeout),
        stub_(worker::LlmWorker::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    worker::LlmStoreSetRequest req;
    req.set_key(key);
    req.set_value(std::string(data.begin(), data.end()));
    worker::LlmStoreSetResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
    ctx.set_wait_for_ready(true);  // the store's worker may still be starting
    Check(stub_->StoreSet(&ctx, req, &resp), "set", key);
  }

  std::vector<char> get(const std::string& key) override {
    std::string v = Get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + (timeout.count() > 0 ? timeout : timeout_);
    for (const std::string& key : keys) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      Get(key, std::max(left, std::chrono::milliseconds(1)));
    }
  }

 private:
  std::string Get(const std::string& key, std::chrono::milliseconds wait) {
    worker::LlmStoreGetRequest req;
    req.set_key(key);
    req.set_wait_ms(static_cast<uint32_t>(wait.count()));
    worker::LlmStoreGetResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(2));
    ctx.set_wait_for_ready(true);
    Check(stub_->StoreGet(&ctx, req, &resp), "get", key);
    return resp.value();
  }

  void Check(const grpc::Status& s, const char* op, const std::string& key) const {
    if (!s.ok()) {
      throw gloo::IoException("rendezvous store " + address_ + ": " + op + " " + key + ": " +
                              s.error_message());
    }
  }

  std::string address_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<worker::LlmWorker::Stub> stub_;
};

Status Aborted(const std::string& what, const std::exception& e) {
  return Status(StatusCode::kAborted, what + ": " + e.what());
}

}  // namespace

Status RendezvousTable::Set(const std::string& key, std::string value) {
  if (key.empty() || key.size() > 256) return InvalidArgumentError("store key of bad length");
  if (value.size() > kMaxValueBytes) return InvalidArgumentError("store value too large");
  std::lock_guard lock(mu_);
  const uint64_t epoch = KeyEpoch(key);
  if (epoch > newest_epoch_) {
    newest_epoch_ = epoch;
    for (auto it = values_.begin(); it != values_.end();)
      it = KeyEpoch(it->first) < epoch ? values_.erase(it) : std::next(it);
  }
  if (values_.size() >= kMaxKeys && !values_.count(key))
    return ResourceExhaustedError("rendezvous store full");
  values_[key] = std::move(value);
  cv_.notify_all();
  return Status::Ok();
}

StatusOr<std::string> RendezvousTable::Get(const std::string& key,
                                           std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) != 0; }))
    return Status(StatusCode::kDeadlineExceeded, "rendezvous key " + key + " did not appear");
  return values_[key];
}

std::unique_ptr<gloo::rendezvous::Store> MakeGrpcRendezvousStore(
    const std::string& address, std::chrono::milliseconds timeout) {
  return std::make_unique<GrpcRendezvousStore>(address, timeout);
}

StatusOr<std::unique_ptr<CollectiveGroup>> CollectiveGroup::Form(
    gloo::rendezvous::Store& store, const std::string& hostname, const CollectiveLayout& layout,
    uint64_t epoch, std::chrono::milliseconds timeout) {
  if (layout.tp_size < 1 || layout.num_stages < 1 || layout.tp_rank < 0 ||
      layout.tp_rank >= layout.tp_size || layout.stage < 0 || layout.stage >= layout.num_stages)
    return InvalidArgumentError("collective layout out of range");
  // A write to a peer that just died must fail with EPIPE, not kill the process.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { std::signal(SIGPIPE, SIG_IGN); });
  std::unique_ptr<CollectiveGroup> g(new CollectiveGroup());
  g->layout_ = layout;
  g->timeout_ = timeout;
  std::string base = "e";  // (built step by step: GCC 12 warns falsely on "e" + string)
  base += std::to_string(epoch);
  base += '/';
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    g->device_ = gloo::transport::tcp::CreateDevice(attr);
    if (layout.tp_size > 1) {
      gloo::rendezvous::PrefixStore prefixed(base + "tp" + std::to_string(layout.stage), store);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(layout.tp_rank, layout.tp_size);
      ctx->setTimeout(timeout);
      ctx->connectFullMesh(prefixed, g->device_);
      g->tp_ = std::move(ctx);
    }
    if (layout.num_stages > 1) {
      gloo::rendezvous::PrefixStore prefixed(base + "pp" + std::to_string(layout.tp_rank), store);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(layout.stage, layout.num_stages);
      ctx->setTimeout(timeout);
      ctx->connectFullMesh(prefixed, g->device_);
      g->pp_ = std::move(ctx);
    }
  } catch (const std::exception& e) {
    return Aborted("forming the Gloo group of epoch " + std::to_string(epoch), e);
  }
  return g;
}

CollectiveGroup::~CollectiveGroup() {
  // Closing the pairs wakes peers blocked on us (they see the connection drop).
  try {
    if (tp_) tp_->closeConnections();
    if (pp_) pp_->closeConnections();
  } catch (const std::exception&) {
  }
}

Status CollectiveGroup::AllGather(const float* in, float* out, std::span<const size_t> counts) {
  if (counts.size() != static_cast<size_t>(layout_.tp_size))
    return InternalError("all-gather counts do not match the TP group");
  const auto t0 = Clock::now();
  if (!tp_) {
    std::copy_n(in, counts[0], out);
    return Status::Ok();
  }
  try {
    gloo::AllgathervOptions opts(tp_);
    opts.setInput(const_cast<float*>(in), counts[layout_.tp_rank]);
    opts.setOutput(out, std::vector<size_t>(counts.begin(), counts.end()));
    opts.setTimeout(timeout_);
    gloo::allgatherv(opts);
  } catch (const std::exception& e) {
    return Aborted("TP all-gather (stage " + std::to_string(layout_.stage) + ")", e);
  }
  seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  return Status::Ok();
}

Status CollectiveGroup::SendToNextStage(const float* data, size_t count) {
  if (!pp_ || layout_.stage + 1 >= layout_.num_stages)
    return InternalError("no next pipeline stage");
  const auto t0 = Clock::now();
  try {
    auto buf = pp_->createUnboundBuffer(const_cast<float*>(data), count * sizeof(float));
    buf->send(layout_.stage + 1, /*slot=*/1);
    if (!buf->waitSend(timeout_)) return Status(StatusCode::kAborted, "pipeline send aborted");
  } catch (const std::exception& e) {
    return Aborted("pipeline send to stage " + std::to_string(layout_.stage + 1), e);
  }
  seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  return Status::Ok();
}

Status CollectiveGroup::RecvFromPrevStage(float* data, size_t count) {
  if (!pp_ || layout_.stage == 0) return InternalError("no previous pipeline stage");
  const auto t0 = Clock::now();
  try {
    auto buf = pp_->createUnboundBuffer(data, count * sizeof(float));
    buf->recv(layout_.stage - 1, /*slot=*/1);
    if (!buf->waitRecv(timeout_)) return Status(StatusCode::kAborted, "pipeline receive aborted");
  } catch (const std::exception& e) {
    return Aborted("pipeline receive from stage " + std::to_string(layout_.stage - 1), e);
  }
  seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  return Status::Ok();
}

double CollectiveGroup::TakeSeconds() {
  const double s = seconds_;
  seconds_ = 0;
  return s;
}

}  // namespace specinfer
