#include "dist/ssm_worker.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include "dist/model_identity.h"
#include "dist/ssm_wire.h"
#include "model/loader.h"
#include "proto/ssm_worker.grpc.pb.h"
#include "server/grpc_listen.h"
#include "spec/speculator.h"

namespace specinfer {

namespace {

using Clock = std::chrono::steady_clock;

grpc::Status ToGrpc(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

class SsmWorkerService final : public worker::SsmWorker::Service {
 public:
  SsmWorkerService(SsmWorkerOptions options, std::shared_ptr<const Model> model,
                   std::unique_ptr<Tokenizer> tokenizer, std::unique_ptr<Speculator> speculator)
      : o_(std::move(options)),
        model_(std::move(model)),
        tokenizer_(std::move(tokenizer)),
        speculator_(std::move(speculator)),
        fingerprint_(VocabFingerprint(*tokenizer_)) {}

  void set_address(std::string address) {
    std::lock_guard lock(name_mu_);
    name_ = o_.label + " " + address;
  }
  std::string name() const {
    std::lock_guard lock(name_mu_);
    return name_;
  }

  grpc::Status Info(grpc::ServerContext*, const worker::InfoRequest*,
                    worker::InfoResponse* out) override {
    out->set_worker(o_.label);
    out->set_model_shape(ModelShapeString(model_->config()));
    out->set_vocab_size(model_->config().vocab_size);
    out->set_vocab_fingerprint(fingerprint_);
    out->add_speculators(speculator_->name());
    out->set_max_sessions(o_.max_sessions);
    out->set_context_length(model_->config().max_seq_len);
    return grpc::Status::OK;
  }

  grpc::Status Health(grpc::ServerContext*, const worker::HealthRequest*,
                      worker::HealthResponse* out) override {
    // Without the lock: a long Speculate call must not make the worker look dead.
    out->set_state(draining_.load() ? worker::HealthResponse::DRAINING
                                    : worker::HealthResponse::SERVING);
    out->set_sessions(num_sessions_.load());
    return grpc::Status::OK;
  }

  grpc::Status Speculate(grpc::ServerContext*, const worker::SpeculateRequest* req,
                         worker::SpeculateResponse* out) override {
    const int32_t vocab = model_->config().vocab_size;
    const int32_t context = model_->config().max_seq_len;
    if (req->items_size() > kMaxSpeculateItems)
      return ToGrpc(InvalidArgumentError("more than " + std::to_string(kMaxSpeculateItems) +
                                         " items"));
    // Validate everything before touching any session.
    for (int i = 0; i < req->items_size(); ++i) {
      const auto& item = req->items(i);
      Status s = ValidateSpeculateItem(item, vocab, context);
      if (s.ok() && !item.speculator().empty() && item.speculator() != speculator_->name())
        s = InvalidArgumentError("speculator '" + item.speculator() + "' is not offered here (" +
                                 speculator_->name() + ")");
      if (!s.ok()) {
        spdlog::warn("{}: Speculate item {} rejected: {}", name(), i, s.ToString());
        return ToGrpc(InvalidArgumentError("item " + std::to_string(i) + ": " + s.message()));
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    // The items' trees come from batched proposals (Speculator::ProposeBatch: a model draft
    // runs one pass per tree level for all of them). An item whose session is already waiting
    // in the batch first flushes it, so a session's items are served in order, each after the
    // tokens of the one before.
    std::vector<Pending> pending;
    pending.reserve(static_cast<size_t>(req->items_size()));  // contexts point into it
    auto flush = [&] {
      if (pending.empty()) return;
      std::vector<DraftSession*> sessions;
      std::vector<DraftContext> contexts;
      for (Pending& p : pending) {
        DraftContext ctx;
        ctx.tokens = p.session->tokens;
        ctx.shape = &p.shape;
        ctx.max_depth = p.max_depth;
        ctx.sampling = &p.sampling;
        ctx.rng = &p.rng;
        ctx.speculator_index = p.speculator_index;
        sessions.push_back(p.session->session.get());
        contexts.push_back(ctx);
      }
      std::vector<StatusOr<TokenTree>> trees = speculator_->ProposeBatch(sessions, contexts);
      for (size_t k = 0; k < pending.size(); ++k) {
        worker::SpeculateResult* result = out->mutable_results(pending[k].index);
        const Status st = k < trees.size() ? trees[k].status()
                                           : InternalError("ProposeBatch returned too few trees");
        if (!st.ok()) {
          // The session's state is unknown now: drop it (the manager resends everything).
          spdlog::warn("{}: session '{}' failed to propose: {}", name(), pending[k].key,
                       st.ToString());
          sessions_.erase(pending[k].key);
          result->set_outcome(worker::SpeculateResult::RESYNC);
          continue;
        }
        result->set_outcome(worker::SpeculateResult::OK);
        TreeToProto(*trees[k], result->mutable_tree());
      }
      pending.clear();
    };
    for (int i = 0; i < req->items_size(); ++i) {
      const auto& item = req->items(i);
      worker::SpeculateResult* result = out->add_results();
      for (const Pending& p : pending) {
        if (p.key == item.session()) {
          flush();
          break;
        }
      }
      auto it = sessions_.find(item.session());
      if (it == sessions_.end()) {
        if (item.base() != 0) {
          result->set_outcome(worker::SpeculateResult::RESYNC);
          continue;
        }
        if (draining_ || !MakeRoom(now)) {
          result->set_outcome(worker::SpeculateResult::BUSY);
          continue;
        }
        auto session = speculator_->StartSession();
        if (!session.ok()) {
          spdlog::warn("{}: no session for '{}': {}", name(), item.session(),
                       session.status().ToString());
          result->set_outcome(worker::SpeculateResult::BUSY);
          continue;
        }
        it = sessions_.emplace(item.session(), Session{std::move(*session), {}, now}).first;
        spdlog::debug("{}: session '{}' opened ({} open)", name(), item.session(),
                      sessions_.size());
      }
      Session& s = it->second;
      s.last_used = now;
      // base 0 restates the whole sequence (after a replica switch or a RESYNC): the draft's
      // cache keeps whatever prefix it shares with it.
      if (item.base() == 0) s.tokens.clear();
      if (item.base() != s.tokens.size()) {
        result->set_outcome(worker::SpeculateResult::RESYNC);
        continue;
      }
      s.tokens.insert(s.tokens.end(), item.tokens().begin(), item.tokens().end());
      pending.push_back(Pending{item.session(), i, &s,
                                TreeShape{{item.widths().begin(), item.widths().end()}},
                                item.max_depth(), SamplingFromProto(item.sampling()),
                                Rng(item.seed()), item.speculator_index()});
    }
    flush();
    num_sessions_ = static_cast<int32_t>(sessions_.size());
    return grpc::Status::OK;
  }

  grpc::Status Release(grpc::ServerContext*, const worker::ReleaseRequest* req,
                       worker::ReleaseResponse*) override {
    if (req->sessions_size() > kMaxSpeculateItems)
      return ToGrpc(InvalidArgumentError("too many sessions in one Release"));
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& key : req->sessions()) sessions_.erase(key);
    num_sessions_ = static_cast<int32_t>(sessions_.size());
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext*, const worker::DrainRequest*,
                     worker::DrainResponse* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!draining_) spdlog::info("{}: draining ({} sessions open)", name(), sessions_.size());
    draining_ = true;
    out->set_sessions(static_cast<int32_t>(sessions_.size()));
    return grpc::Status::OK;
  }

 private:
  struct Session {
    std::unique_ptr<DraftSession> session;
    std::vector<int32_t> tokens;  // committed tokens received so far
    Clock::time_point last_used;
  };

  // An item waiting for the batched proposal of its call.
  struct Pending {
    std::string key;
    int index;         // of the item (and its result)
    Session* session;  // sessions_ never moves its elements
    TreeShape shape;
    int32_t max_depth;
    SamplingParams sampling;
    Rng rng;
    int32_t speculator_index;
  };

  // Frees idle sessions; true if there is room for one more.
  bool MakeRoom(Clock::time_point now) {
    if (static_cast<int32_t>(sessions_.size()) < o_.max_sessions) return true;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (now - it->second.last_used > o_.idle_timeout) {
        spdlog::info("{}: session '{}' idle, reclaimed", name(), it->first);
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
    return static_cast<int32_t>(sessions_.size()) < o_.max_sessions;
  }

  const SsmWorkerOptions o_;
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Speculator> speculator_;
  const uint64_t fingerprint_;
  // Set once the server has bound its port, which is after it starts serving: an RPC that
  // arrives at once reads it concurrently.
  mutable std::mutex name_mu_;
  std::string name_;  // guarded by name_mu_

  std::mutex mu_;
  std::map<std::string, Session> sessions_;  // guarded by mu_
  std::atomic<int32_t> num_sessions_{0};     // sessions_.size() after the last change
  std::atomic<bool> draining_{false};
};

}  // namespace

struct SsmWorkerServer::Impl {
  std::unique_ptr<SsmWorkerService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::mutex mu;
  bool stopped = false;
};

SsmWorkerServer::SsmWorkerServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SsmWorkerServer::~SsmWorkerServer() { Shutdown(); }

StatusOr<std::unique_ptr<SsmWorkerServer>> SsmWorkerServer::Start(const SsmWorkerOptions& o) {
  if (o.max_sessions < 1) return InvalidArgumentError("max_sessions must be >= 1");
  if (o.context_length < 0) return InvalidArgumentError("context length must be >= 0");
  if (o.device < 0) return InvalidArgumentError("device must be >= 0");
  SI_RETURN_IF_ERROR(ParseDraftSpec(o.speculator).status());
  const size_t colon = o.listen.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return InvalidArgumentError("listen address '" + o.listen + "' is not host:port");
  const std::string host = o.listen.substr(0, colon);

  ServingLoadOptions lo;
  lo.tokenizer_path = o.tokenizer_path;
  lo.context_length = o.context_length;
  lo.dequantize = o.dequantize;
  SI_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelForServing(o.model_path, lo));
  std::shared_ptr<const Model> shared(std::move(loaded.model));
  SpeculatorOptions so;
  so.max_sequences = o.max_sessions;
  so.kv_block_size = o.kv_block_size;
  so.backend = o.backend;
  so.device = o.device;
  so.num_threads = o.num_threads;
  so.llm_tokenizer = loaded.tokenizer.get();
  SI_ASSIGN_OR_RETURN(std::unique_ptr<Speculator> spec, CreateSpeculator(o.speculator, shared, so));

  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<SsmWorkerService>(o, shared, std::move(loaded.tokenizer),
                                                     std::move(spec));
  grpc::Service* const services[] = {impl->service.get()};
  auto started = BindGrpcServer(services, {.address = o.listen});
  if (!started.ok()) return started.status().WithContext(o.label);
  impl->server = std::move(started->server);
  impl->port = started->port;
  impl->service->set_address(host + ":" + std::to_string(impl->port));
  spdlog::info("{}: serving speculator {} on {} ({}, up to {} sessions, drafts on {})",
               impl->service->name(), o.speculator, o.model_path,
               ModelShapeString(shared->config()), o.max_sessions,
               o.backend == "cpu" ? o.backend : o.backend + ":" + std::to_string(o.device));
  return std::unique_ptr<SsmWorkerServer>(new SsmWorkerServer(std::move(impl)));
}

int SsmWorkerServer::port() const { return impl_->port; }
std::string SsmWorkerServer::label() const { return impl_->service->name(); }

void SsmWorkerServer::Wait() {
  if (impl_->server) impl_->server->Wait();
}

void SsmWorkerServer::Shutdown() {
  if (!impl_) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped || !impl_->server) return;
  impl_->stopped = true;
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
}

}  // namespace specinfer
