#include "dist/ssm_client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "dist/ssm_wire.h"
#include "proto/ssm_worker.grpc.pb.h"
#include "server/grpc_listen.h"
#include "spec/spec_grammar.h"

namespace specinfer {

namespace {

using Clock = std::chrono::system_clock;

std::string GrpcError(const grpc::Status& s) {
  return std::to_string(static_cast<int>(s.error_code())) + " " + s.error_message();
}

}  // namespace

struct RemoteSpeculator::Impl {
  struct Replica {
    std::string address, label;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<worker::SsmWorker::Stub> stub;
    ReplicaState state = ReplicaState::kDown;  // guarded by mu
    int32_t sessions = 0;                      // guarded by mu
    int32_t context = 0;                       // guarded by mu: its context length (Info)
    std::string refusal;                       // guarded by mu: why it is refused
    std::string who() const { return label + " " + address; }
  };

  RemoteSpeculatorOptions o;
  std::string name;
  std::vector<std::unique_ptr<Replica>> replicas;
  std::string client_id;
  std::atomic<uint64_t> next_session{0};

  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;  // guarded by mu
  std::thread prober;

  // Info on replica r: ok and matching -> live; mismatch -> refused; unreachable -> down.
  // Logs state changes only.
  void Probe(size_t r) {
    Replica& rep = *replicas[r];
    grpc::ClientContext ctx;
    ctx.set_deadline(Clock::now() + std::min(o.rpc_timeout, std::chrono::milliseconds(2000)));
    worker::InfoRequest req;
    worker::InfoResponse info;
    const grpc::Status s = rep.stub->Info(&ctx, req, &info);
    std::lock_guard<std::mutex> lock(mu);
    const ReplicaState before = rep.state;
    if (!s.ok()) {
      rep.state = ReplicaState::kDown;
      if (before == ReplicaState::kLive)
        spdlog::warn("{}: unreachable ({}); marked down", rep.who(), GrpcError(s));
      return;
    }
    std::string why;
    if (info.vocab_size() != o.vocab_size) {
      why = "vocabulary of " + std::to_string(info.vocab_size()) + " tokens, the LLM's has " +
            std::to_string(o.vocab_size);
    } else if (info.vocab_fingerprint() != o.vocab_fingerprint) {
      why = fmt::format("vocabulary fingerprint {:016x} differs from the LLM's {:016x}",
                        info.vocab_fingerprint(), o.vocab_fingerprint);
    } else if (!name.empty()) {
      bool offers = false;
      for (const std::string& sp : info.speculators()) offers |= sp == name;
      if (!offers) why = "does not offer speculator '" + name + "'";
    } else if (info.speculators_size() == 0) {
      why = "offers no speculator";
    }
    if (!why.empty()) {
      rep.state = ReplicaState::kRefused;
      if (before != ReplicaState::kRefused || rep.refusal != why)
        spdlog::error("{}: refused at registration: {} (model {})", rep.who(), why,
                      info.model_shape());
      rep.refusal = why;
      return;
    }
    if (name.empty()) name = info.speculators(0);
    rep.context = info.context_length();
    rep.state = ReplicaState::kLive;
    if (before != ReplicaState::kLive)
      spdlog::info("{}: registered, speculator {} ({}, {} sessions max)", rep.who(), name,
                   info.model_shape(), info.max_sessions());
  }

  // Health of a live replica: one that does not answer is marked down before a request's
  // Speculate call has to find out.
  void CheckHealth(size_t r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Clock::now() + std::min(o.rpc_timeout, std::chrono::milliseconds(2000)));
    worker::HealthRequest req;
    worker::HealthResponse resp;
    const grpc::Status s = replicas[r]->stub->Health(&ctx, req, &resp);
    if (!s.ok()) MarkDown(r, "health check failed (" + GrpcError(s) + ")");
  }

  void MarkDown(size_t r, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    Replica& rep = *replicas[r];
    if (rep.state == ReplicaState::kLive)
      spdlog::warn("{}: {}; marked down, its sessions move to other replicas", rep.who(), why);
    rep.state = ReplicaState::kDown;
  }

  // The live replica with the fewest sessions, or -1; takes a session slot on it.
  int Pick() {
    std::lock_guard<std::mutex> lock(mu);
    int best = -1;
    for (size_t r = 0; r < replicas.size(); ++r) {
      if (replicas[r]->state != ReplicaState::kLive) continue;
      if (best < 0 || replicas[r]->sessions < replicas[static_cast<size_t>(best)]->sessions)
        best = static_cast<int>(r);
    }
    if (best >= 0) ++replicas[static_cast<size_t>(best)]->sessions;
    return best;
  }
  void Unpin(int r) {
    if (r < 0) return;
    std::lock_guard<std::mutex> lock(mu);
    --replicas[static_cast<size_t>(r)]->sessions;
  }
  // The context of replica r (a longer sequence is not sent: its draft could not place it).
  int32_t Context(int r) const {
    std::lock_guard<std::mutex> lock(mu);
    return replicas[static_cast<size_t>(r)]->context;
  }
  bool Live(int r) const {
    std::lock_guard<std::mutex> lock(mu);
    return replicas[static_cast<size_t>(r)]->state == ReplicaState::kLive;
  }

  void ProbeLoop() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      cv.wait_for(lock, o.probe_interval, [&] { return stopping; });
      if (stopping) break;
      lock.unlock();
      for (size_t r = 0; r < replicas.size(); ++r) {
        bool live;
        {
          std::lock_guard<std::mutex> l(mu);
          live = replicas[r]->state == ReplicaState::kLive;
        }
        if (live) CheckHealth(r);
        else Probe(r);
      }
      lock.lock();
    }
  }
};

namespace {

class RemoteDraftSession final : public DraftSession {
 public:
  RemoteDraftSession(RemoteSpeculator::Impl& owner, std::string key)
      : owner_(owner), key_(std::move(key)) {}
  bool BelongsTo(const RemoteSpeculator::Impl& owner) const { return &owner_ == &owner; }

  ~RemoteDraftSession() override {
    if (pending_) pending_->done_future.wait();  // the call owns its buffers until it ends
    if (replica_ < 0) return;
    if (owner_.Live(replica_)) {
      // Frees the worker's KV entries now (the worker would reclaim them when idle anyway).
      grpc::ClientContext ctx;
      ctx.set_deadline(Clock::now() + std::chrono::milliseconds(200));
      worker::ReleaseRequest req;
      req.add_sessions(key_);
      worker::ReleaseResponse resp;
      const grpc::Status s =
          owner_.replicas[static_cast<size_t>(replica_)]->stub->Release(&ctx, req, &resp);
      if (!s.ok())
        spdlog::debug("{}: Release of '{}' failed: {}",
                      owner_.replicas[static_cast<size_t>(replica_)]->who(), key_, GrpcError(s));
    }
    owner_.Unpin(replica_);
  }

  // Sends this step's Speculate call without waiting, so the calls of every sequence in a step
  // (and the replicas serving them) overlap; Propose collects the answer.
  void Begin(const DraftContext& ctx) override {
    RemoteDraftSession* self = this;
    StartCalls(owner_, std::span(&self, 1), std::span(&ctx, 1));
  }

  // The call of one step, shared by the sessions whose items it carries (one per replica).
  struct Call {
    grpc::ClientContext ctx;
    worker::SpeculateRequest req;
    worker::SpeculateResponse resp;
    grpc::Status status;
    std::promise<void> done;
    std::shared_future<void> done_future;
    int replica = -1;
  };

  // Begin of each sessions[i] with contexts[i] (sessions of `owner`, each once): one Speculate
  // call per replica carrying the items of all its sessions, sent without waiting.
  static void StartCalls(RemoteSpeculator::Impl& owner,
                         std::span<RemoteDraftSession* const> sessions,
                         std::span<const DraftContext> contexts) {
    std::vector<std::shared_ptr<Call>> calls(owner.replicas.size());
    for (size_t i = 0; i < sessions.size() && i < contexts.size(); ++i) {
      RemoteDraftSession& s = *sessions[i];
      const DraftContext& ctx = contexts[i];
      s.DropPending();
      const int32_t max_depth = std::min(ctx.max_depth, ctx.shape->depth());
      if (max_depth <= 0) continue;
      const uint64_t seed = ctx.sampling->greedy() ? 0 : DrawSpeculationSeed(*ctx.rng);
      if (!s.Ready(ctx.tokens.size())) {
        s.pending_seed_ = seed;  // Propose decodes plainly or retries with the same seed
        s.has_seed_ = true;
        continue;
      }
      std::shared_ptr<Call>& call = calls[static_cast<size_t>(s.replica_)];
      if (!call) {
        call = std::make_shared<Call>();
        call->replica = s.replica_;
      }
      s.pending_item_ = call->req.items_size();
      s.BuildRequest(ctx, max_depth, seed, &call->req);
      s.pending_ = call;
      s.pending_n_ = ctx.tokens.size();
      s.pending_call_seed_ = seed;
    }
    for (std::shared_ptr<Call>& call : calls) {
      if (!call) continue;
      call->ctx.set_deadline(Clock::now() + owner.o.rpc_timeout);
      call->done_future = call->done.get_future().share();
      auto& rep = *owner.replicas[static_cast<size_t>(call->replica)];
      rep.stub->async()->Speculate(&call->ctx, &call->req, &call->resp,
                                   [call](grpc::Status status) {
                                     call->status = std::move(status);
                                     call->done.set_value();
                                   });
    }
  }

  StatusOr<TokenTree> Propose(const DraftContext& ctx) override {
    const int32_t root = ctx.tokens.back();
    const int32_t max_depth = std::min(ctx.max_depth, ctx.shape->depth());
    const size_t n = ctx.tokens.size();
    if (max_depth <= 0) {
      DropPending();
      return TokenTree(root);
    }
    // Sampled expansion draws on the worker from a seed drawn here, from the request's stream
    // (once per step: in Begin when there was one).
    uint64_t seed = 0;
    if (pending_ && pending_n_ == n) {
      seed = pending_call_seed_;
      std::shared_ptr<Call> call = std::move(pending_);
      call->done_future.wait();
      TokenTree tree(root);
      if (Handle(call->status, call->resp, pending_item_, call->req.items_size(), root,
                 max_depth, n, &tree) == Outcome::kTree)
        return tree;
    } else if (has_seed_) {
      seed = pending_seed_;
    } else if (!ctx.sampling->greedy()) {
      seed = DrawSpeculationSeed(*ctx.rng);
    }
    DropPending();
    has_seed_ = false;
    // Each replica once at most, plus resends after a RESYNC.
    for (size_t attempt = 0; attempt < owner_.replicas.size() + 2; ++attempt) {
      if (!Ready(n)) return TokenTree(root);
      worker::SpeculateRequest req;
      BuildRequest(ctx, max_depth, seed, &req);
      grpc::ClientContext cctx;
      cctx.set_deadline(Clock::now() + owner_.o.rpc_timeout);
      worker::SpeculateResponse resp;
      const grpc::Status s =
          owner_.replicas[static_cast<size_t>(replica_)]->stub->Speculate(&cctx, req, &resp);
      TokenTree tree(root);
      switch (Handle(s, resp, 0, 1, root, max_depth, n, &tree)) {
        case Outcome::kTree: return tree;
        case Outcome::kPlain: return TokenTree(root);
        case Outcome::kRetry: continue;
      }
    }
    return TokenTree(root);
  }

 private:
  enum class Outcome { kTree, kPlain, kRetry };

  // Pins the session to a live replica (resending everything after a switch). False when no
  // replica is live or the sequence is past its context: this step decodes plainly.
  bool Ready(size_t n) {
    if (replica_ >= 0 && !owner_.Live(replica_)) Switch();
    if (replica_ < 0) {
      replica_ = owner_.Pick();
      held_ = 0;
    }
    if (replica_ < 0) {
      if (!plain_logged_)
        spdlog::warn("speculator {}: no live replica for session '{}'; plain decoding",
                     owner_.name, key_);
      plain_logged_ = true;
      return false;
    }
    plain_logged_ = false;
    // Past the worker's context (a draft with a shorter one): nothing to guess there.
    return static_cast<int64_t>(n) < owner_.Context(replica_);
  }

  void BuildRequest(const DraftContext& ctx, int32_t max_depth, uint64_t seed,
                    worker::SpeculateRequest* req) {
    worker::SpeculateItem* item = req->add_items();
    item->set_session(key_);
    item->set_speculator(owner_.name);
    if (held_ > ctx.tokens.size()) held_ = 0;
    item->set_base(static_cast<uint32_t>(held_));
    item->mutable_tokens()->Add(ctx.tokens.begin() + static_cast<std::ptrdiff_t>(held_),
                                ctx.tokens.end());
    item->mutable_widths()->Add(ctx.shape->widths.begin(), ctx.shape->widths.end());
    item->set_max_depth(max_depth);
    SamplingToProto(*ctx.sampling, item->mutable_sampling());
    item->set_seed(seed);
    item->set_speculator_index(ctx.speculator_index);
  }

  // Item `item` of an answer of the pinned replica to a call of `items` items: a tree, plain
  // decoding this step, or try again (after a RESYNC, or on another replica after a failure).
  Outcome Handle(const grpc::Status& s, const worker::SpeculateResponse& resp, int item,
                 int items, int32_t root, int32_t max_depth, size_t n, TokenTree* tree) {
    if (replica_ < 0) return Outcome::kRetry;
    const size_t r = static_cast<size_t>(replica_);
    if (!s.ok()) {
      owner_.MarkDown(r, "Speculate failed (" + GrpcError(s) + ")");
      Switch();
      return Outcome::kRetry;
    }
    if (resp.results_size() != items) {
      owner_.MarkDown(r, "malformed answer: " + std::to_string(resp.results_size()) +
                             " results for " + std::to_string(items) + " items");
      Switch();
      return Outcome::kRetry;
    }
    const auto& result = resp.results(item);
    switch (result.outcome()) {
      case worker::SpeculateResult::OK: {
        auto t = TreeFromProto(result.tree(), owner_.o.vocab_size, root, max_depth);
        if (!t.ok()) {
          owner_.MarkDown(r, "malformed answer (" + t.status().message() + ")");
          Switch();
          return Outcome::kRetry;
        }
        held_ = n;
        *tree = std::move(*t);
        return Outcome::kTree;
      }
      case worker::SpeculateResult::RESYNC:
        held_ = 0;
        return Outcome::kRetry;
      case worker::SpeculateResult::BUSY:
        // No room there now: this step without it; the next step asks again.
        held_ = 0;
        return Outcome::kPlain;
      default:
        owner_.MarkDown(r, "malformed answer (unknown outcome)");
        Switch();
        return Outcome::kRetry;
    }
  }

  // Forgets an answer that will not be used; the worker may have taken its tokens, so the next
  // call restates the whole sequence.
  void DropPending() {
    if (!pending_) return;
    pending_->done_future.wait();
    pending_.reset();
    held_ = 0;
  }

  // Leaves the current replica; the next attempt picks another and resends everything.
  void Switch() {
    owner_.Unpin(replica_);
    replica_ = -1;
    held_ = 0;
  }

  RemoteSpeculator::Impl& owner_;
  const std::string key_;
  int replica_ = -1;
  size_t held_ = 0;  // committed tokens the replica's session holds
  bool plain_logged_ = false;
  std::shared_ptr<Call> pending_;  // the call Begin sent, not yet collected
  int pending_item_ = 0;           // this session's item in it
  size_t pending_n_ = 0;           // the committed tokens it was sent for
  uint64_t pending_call_seed_ = 0; // the seed it carries
  uint64_t pending_seed_ = 0;      // a seed Begin drew without sending a call
  bool has_seed_ = false;
};

}  // namespace

RemoteSpeculator::RemoteSpeculator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemoteSpeculator::~RemoteSpeculator() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->prober.joinable()) impl_->prober.join();
}

StatusOr<std::unique_ptr<RemoteSpeculator>> RemoteSpeculator::Connect(
    RemoteSpeculatorOptions o) {
  if (o.replicas.empty()) return InvalidArgumentError("a remote speculator needs replicas");
  if (o.vocab_size <= 0) return InvalidArgumentError("remote speculator: vocab size unknown");
  if (!o.name.empty()) SI_RETURN_IF_ERROR(ParseDraftSpec(o.name).status());
  auto impl = std::make_unique<Impl>();
  impl->name = o.name;
  std::random_device rd;
  impl->client_id = fmt::format("{:08x}{:08x}", rd(), rd());
  for (size_t r = 0; r < o.replicas.size(); ++r) {
    auto rep = std::make_unique<Impl::Replica>();
    rep->address = o.replicas[r];
    rep->label = r < o.labels.size() ? o.labels[r] : "ssm[" + std::to_string(r) + "]";
    const grpc::ChannelArguments args = WorkerChannelArguments();
    rep->channel =
        grpc::CreateCustomChannel(rep->address, grpc::InsecureChannelCredentials(), args);
    rep->stub = worker::SsmWorker::NewStub(rep->channel);
    impl->replicas.push_back(std::move(rep));
  }
  impl->o = std::move(o);
  for (size_t r = 0; r < impl->replicas.size(); ++r) impl->Probe(r);
  int refused = 0, live = 0;
  std::string reasons;
  for (const auto& rep : impl->replicas) {
    if (rep->state == ReplicaState::kRefused) {
      ++refused;
      reasons += "; " + rep->who() + ": " + rep->refusal;
    }
    if (rep->state == ReplicaState::kLive) ++live;
  }
  if (refused == static_cast<int>(impl->replicas.size()))
    return InvalidArgumentError("every SSM replica was refused" + reasons);
  if (impl->name.empty()) {
    // None answered yet: the name must come from the configuration.
    return UnavailableError("no SSM replica answered and no speculator name was configured");
  }
  if (live == 0)
    spdlog::warn("speculator {}: no replica reachable yet; plain decoding until one is",
                 impl->name);
  Impl* raw = impl.get();
  impl->prober = std::thread([raw] { raw->ProbeLoop(); });
  return std::unique_ptr<RemoteSpeculator>(new RemoteSpeculator(std::move(impl)));
}

const std::string& RemoteSpeculator::name() const { return impl_->name; }

void RemoteSpeculator::BeginBatch(std::span<DraftSession* const> sessions,
                                  std::span<const DraftContext> contexts) {
  std::vector<RemoteDraftSession*> own;
  std::vector<DraftContext> own_contexts;
  for (size_t i = 0; i < sessions.size() && i < contexts.size(); ++i) {
    auto* r = dynamic_cast<RemoteDraftSession*>(sessions[i]);
    if (r == nullptr || !r->BelongsTo(*impl_) ||
        std::find(own.begin(), own.end(), r) != own.end()) {
      sessions[i]->Begin(contexts[i]);  // not one of ours, or again: on its own
      continue;
    }
    own.push_back(r);
    own_contexts.push_back(contexts[i]);
  }
  RemoteDraftSession::StartCalls(*impl_, own, own_contexts);
}

StatusOr<std::unique_ptr<DraftSession>> RemoteSpeculator::StartSession() {
  const uint64_t id = impl_->next_session.fetch_add(1);
  return std::unique_ptr<DraftSession>(
      new RemoteDraftSession(*impl_, impl_->client_id + "-" + std::to_string(id)));
}

std::vector<RemoteSpeculator::ReplicaState> RemoteSpeculator::replica_states() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<ReplicaState> out;
  for (const auto& r : impl_->replicas) out.push_back(r->state);
  return out;
}

std::vector<int32_t> RemoteSpeculator::replica_sessions() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<int32_t> out;
  for (const auto& r : impl_->replicas) out.push_back(r->sessions);
  return out;
}

int32_t RemoteSpeculator::live_replicas() const {
  int32_t n = 0;
  for (ReplicaState s : replica_states()) n += s == ReplicaState::kLive;
  return n;
}

void RemoteSpeculator::ProbeNow() {
  const auto states = replica_states();
  for (size_t r = 0; r < states.size(); ++r)
    if (states[r] != ReplicaState::kLive) impl_->Probe(r);
}

void RemoteSpeculator::DrainAll() {
  const auto states = replica_states();
  for (size_t r = 0; r < states.size(); ++r) {
    if (states[r] != ReplicaState::kLive) continue;
    grpc::ClientContext ctx;
    ctx.set_deadline(Clock::now() + std::chrono::seconds(2));
    worker::DrainRequest req;
    worker::DrainResponse resp;
    const grpc::Status s = impl_->replicas[r]->stub->Drain(&ctx, req, &resp);
    if (s.ok())
      spdlog::info("{}: drained ({} sessions still open)", impl_->replicas[r]->who(),
                   resp.sessions());
    else
      spdlog::warn("{}: Drain failed: {}", impl_->replicas[r]->who(), GrpcError(s));
  }
}

}  // namespace specinfer
