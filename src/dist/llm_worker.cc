#include "dist/llm_worker.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/shard_runner.h"
#include "backend/forward_check.h"
#include "dist/collective.h"
#include "dist/llm_wire.h"
#include "dist/model_identity.h"
#include "dist/worker_shard.h"
#include "model/loader.h"
#include "proto/llm_worker.grpc.pb.h"
#include "server/grpc_listen.h"
#include "spec/token_tree.h"

namespace specinfer {

namespace {

using Clock = std::chrono::steady_clock;
namespace pb = ::specinfer::worker;

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

// Returns the Status of `expr` as a grpc::Status from a handler if it is not OK.
#define SI_RETURN_GRPC(expr)                 \
  do {                                       \
    ::specinfer::Status si_s_ = (expr);      \
    if (!si_s_.ok()) return ToGrpc(si_s_);   \
  } while (0)

std::string HostOf(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host;
}

std::string MachineHostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

class LlmWorkerServer::Impl final : public pb::LlmWorker::Service {
 public:
  Impl(const LlmWorkerOptions& options, std::unique_ptr<WorkerShard> runner,
       uint64_t fingerprint)
      : options_(options), runner_(std::move(runner)), fingerprint_(fingerprint) {
    std::random_device rd;
    boot_id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    if (boot_id_ == 0) boot_id_ = 1;
    collective_host_ = options.collective_host;
    if (collective_host_.empty()) {
      collective_host_ = HostOf(options.listen);
      if (collective_host_.empty() || collective_host_ == "0.0.0.0" || collective_host_ == "::")
        collective_host_ = MachineHostname();
    }
  }

  Status Listen() {
    grpc::Service* const services[] = {this};
    auto started = BindGrpcServer(services, {.address = options_.listen});
    if (!started.ok()) return started.status().WithContext("LLM worker");
    server_ = std::move(started->server);
    port_ = started->port;
    {
      std::lock_guard lock(address_mu_);
      address_ = HostOf(options_.listen) + ":" + std::to_string(port_);
    }
    const ShardRange l = runner_->layers();
    spdlog::info("LLM worker (stage {}/{}, tp {}/{}, layers [{}, {}), {}) serving on {}",
                 options_.stage, options_.num_stages, options_.tp_rank, options_.tp_size,
                 l.begin, l.end(), runner_->name(), address());
    return Status::Ok();
  }

  void Shutdown() {
    if (shut_down_.exchange(true)) return;
    draining_ = true;
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    std::lock_guard lock(mu_);
    runner_->Leave();  // peers blocked on us see the connections drop
    in_group_ = false;
  }
  void Wait() { server_->Wait(); }
  int port() const { return port_; }
  std::string address() const {
    std::lock_guard lock(address_mu_);
    return address_;
  }

  // --- service ---
  grpc::Status Register(grpc::ServerContext*, const pb::LlmRegisterRequest* req,
                        pb::LlmWorkerInfo* info) override {
    FillInfo(info);
    const std::string shape = ModelShapeString(runner_->model().config());
    if (req->model_shape() != shape)
      return ToGrpc(FailedPreconditionError("worker serves model \"" + shape +
                                            "\", the deployment expects \"" + req->model_shape() +
                                            "\""));
    if (req->vocab_size() != runner_->model().config().vocab_size ||
        req->vocab_fingerprint() != fingerprint_)
      return ToGrpc(FailedPreconditionError(
          "worker's vocabulary (fingerprint " + std::to_string(fingerprint_) +
          ") differs from the deployment's (" + std::to_string(req->vocab_fingerprint()) + ")"));
    if (req->stage() != options_.stage || req->num_stages() != options_.num_stages ||
        req->tp_rank() != options_.tp_rank || req->tp_size() != options_.tp_size)
      return ToGrpc(FailedPreconditionError(
          "worker is stage " + std::to_string(options_.stage) + "/" +
          std::to_string(options_.num_stages) + ", tp " + std::to_string(options_.tp_rank) + "/" +
          std::to_string(options_.tp_size) + "; the deployment expects stage " +
          std::to_string(req->stage()) + "/" + std::to_string(req->num_stages()) + ", tp " +
          std::to_string(req->tp_rank()) + "/" + std::to_string(req->tp_size())));
    return grpc::Status::OK;
  }

  grpc::Status Health(grpc::ServerContext*, const pb::LlmHealthRequest*,
                      pb::LlmHealthResponse* resp) override {
    resp->set_serving(!draining_);
    resp->set_draining(draining_);
    resp->set_boot_id(boot_id_);
    resp->set_epoch(epoch_);
    resp->set_in_group(in_group_);
    return grpc::Status::OK;
  }

  grpc::Status Join(grpc::ServerContext*, const pb::LlmJoinRequest* req,
                    pb::LlmJoinResponse* resp) override {
    if (draining_) return ToGrpc(UnavailableError("LLM worker is draining"));
    if (req->epoch() == 0) return ToGrpc(InvalidArgumentError("join: epoch must be > 0"));
    if (req->num_stages() != options_.num_stages || req->tp_size() != options_.tp_size ||
        req->workers_size() != options_.num_stages * options_.tp_size)
      return ToGrpc(InvalidArgumentError("join: group layout differs from this worker's"));
    if (req->rendezvous().empty()) return ToGrpc(InvalidArgumentError("join: no rendezvous"));
    const auto timeout = std::chrono::milliseconds(
        req->collective_timeout_ms() > 0 ? std::min<uint32_t>(req->collective_timeout_ms(), 600000)
                                         : 30000);
    std::lock_guard lock(mu_);
    runner_->Leave();
    in_group_ = false;
    auto store = MakeGrpcRendezvousStore(req->rendezvous(), timeout);
    const Status joined = runner_->Join(*store, collective_host_, req->epoch(), timeout);
    if (!joined.ok()) {
      spdlog::warn("LLM worker {}: join epoch {} failed: {}", address(), req->epoch(),
                   joined.ToString());
      return ToGrpc(joined);
    }
    epoch_ = req->epoch();
    in_group_ = true;
    resp->set_epoch(req->epoch());
    return grpc::Status::OK;
  }

  grpc::Status Forward(grpc::ServerContext*, const pb::LlmForwardRequest* req,
                       pb::LlmForwardResponse* resp) override {
    if (draining_) return ToGrpc(UnavailableError("LLM worker is draining"));
    ForwardBatch batch;
    std::vector<TreeMask> masks;
    std::vector<std::span<const int32_t>> tables;
    Status valid = ParseForwardRequest(*req, WireLimits(), batch, masks, tables);
    if (!valid.ok()) return ToGrpc(valid.WithContext("LLM worker " + address()));

    std::lock_guard lock(mu_);
    SI_RETURN_GRPC(CheckEpoch(req->epoch()));
    const auto t0 = Clock::now();
    std::vector<float> logits;
    std::vector<ArgmaxShare> argmax;
    DistRows dists;
    const bool last = runner_->last_stage();
    if (last) {
      logits.resize(batch.logit_rows.size() * runner_->vocab().count);
      argmax.resize(batch.argmax_rows.size());
    }
    Status s = runner_->Forward(batch, tables, logits, argmax, last ? &dists : nullptr);
    const double collective = runner_->TakeCollectiveSeconds();
    if (!s.ok()) {
      if (s.code() == StatusCode::kAborted) {
        spdlog::warn("LLM worker {}: {}; leaving group epoch {}", address(), s.message(),
                     epoch_.load());
        runner_->Leave();
        in_group_ = false;
      }
      return ToGrpc(s.WithContext("LLM worker " + address()));
    }
    resp->set_compute_seconds(std::chrono::duration<double>(Clock::now() - t0).count() -
                              collective);
    resp->set_collective_seconds(collective);
    if (runner_->last_stage()) {
      resp->set_vocab_begin(static_cast<int32_t>(runner_->vocab().begin));
      resp->set_vocab_count(static_cast<int32_t>(runner_->vocab().count));
      resp->set_rows(static_cast<int32_t>(batch.logit_rows.size()));
      resp->set_logits(reinterpret_cast<const char*>(logits.data()),
                       logits.size() * sizeof(float));
      for (const ArgmaxShare& a : argmax) {
        resp->add_argmax_values(a.value);
        resp->add_argmax_ids(a.id);
      }
      if (!batch.dist_rows.empty() && options_.tp_rank == 0) {  // every rank has them whole
        std::vector<int32_t> kept;
        std::vector<uint32_t> words;
        dists.Pack(kept, words);
        resp->mutable_dist_kept()->Add(kept.begin(), kept.end());
        resp->set_dist_packed(reinterpret_cast<const char*>(words.data()), words.size() * 4);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status MoveKv(grpc::ServerContext*, const pb::LlmMoveKvRequest* req,
                      pb::LlmMoveKvResponse*) override {
    if (draining_) return ToGrpc(UnavailableError("LLM worker is draining"));
    Status valid = CheckMoveKvRequest(*req, WireLimits());
    if (!valid.ok()) return ToGrpc(valid.WithContext("LLM worker " + address()));
    std::lock_guard lock(mu_);
    SI_RETURN_GRPC(CheckEpoch(req->epoch()));
    auto span = [](const google::protobuf::RepeatedField<int32_t>& f) {
      return std::span<const int32_t>(f.data(), static_cast<size_t>(f.size()));
    };
    SI_RETURN_GRPC(runner_->MoveKv(span(req->block_table()), span(req->src()), span(req->dst())));
    return grpc::Status::OK;
  }

  grpc::Status Release(grpc::ServerContext*, const pb::LlmReleaseRequest*,
                       pb::LlmReleaseResponse*) override {
    std::lock_guard lock(mu_);
    runner_->Leave();
    in_group_ = false;
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext*, const pb::LlmDrainRequest*,
                     pb::LlmDrainResponse*) override {
    draining_ = true;
    std::lock_guard lock(mu_);  // the call in flight, if any, has finished
    runner_->Leave();
    in_group_ = false;
    return grpc::Status::OK;
  }

  grpc::Status StoreSet(grpc::ServerContext*, const pb::LlmStoreSetRequest* req,
                        pb::LlmStoreSetResponse*) override {
    return ToGrpc(store_.Set(req->key(), req->value()));
  }

  grpc::Status StoreGet(grpc::ServerContext*, const pb::LlmStoreGetRequest* req,
                        pb::LlmStoreGetResponse* resp) override {
    auto v = store_.Get(req->key(),
                        std::chrono::milliseconds(std::min<uint32_t>(req->wait_ms(), 600000)));
    if (!v.ok()) return ToGrpc(v.status());
    resp->set_value(std::move(*v));
    return grpc::Status::OK;
  }

 private:

  // Requires mu_.
  Status CheckEpoch(uint64_t epoch) const {
    if (!runner_->in_group() || epoch != epoch_)
      return FailedPreconditionError("LLM worker " + address() + " is not in group epoch " +
                                     std::to_string(epoch) + " (it is " +
                                     (runner_->in_group() ? "in epoch " + std::to_string(epoch_.load())
                                             : std::string("in no group")) +
                                     ")");
    return Status::Ok();
  }

  void FillInfo(pb::LlmWorkerInfo* info) const {
    const ModelConfig& c = runner_->model().config();
    info->set_model_shape(ModelShapeString(c));
    info->set_vocab_size(c.vocab_size);
    info->set_vocab_fingerprint(fingerprint_);
    info->set_stage(options_.stage);
    info->set_num_stages(options_.num_stages);
    info->set_tp_rank(options_.tp_rank);
    info->set_tp_size(options_.tp_size);
    info->set_layer_begin(static_cast<int32_t>(runner_->layers().begin));
    info->set_layer_end(static_cast<int32_t>(runner_->layers().end()));
    info->set_kv_blocks(runner_->num_kv_blocks());
    info->set_kv_block_size(runner_->kv_block_size());
    info->set_context_length(c.max_seq_len);
    info->set_boot_id(boot_id_);
    info->set_epoch(epoch_);
    info->set_in_group(in_group_);
    info->set_returns_distributions(runner_->last_stage() && runner_->returns_distributions());
    info->set_warmup_passes(runner_->warmup_passes());
  }

  LlmWireLimits WireLimits() const {
    return {.forward = {runner_->model().config().vocab_size, runner_->num_kv_blocks(),
                        runner_->kv_block_size()},
            .logits_vocab = runner_->vocab().count,
            .last_stage = runner_->last_stage()};
  }

  const LlmWorkerOptions options_;
  std::unique_ptr<WorkerShard> runner_;  // the share and its group
  const uint64_t fingerprint_;
  uint64_t boot_id_ = 0;
  std::string collective_host_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  // Set once the server has bound its port, which is after it starts serving: an RPC that
  // arrives at once (a restarted worker on its old port) reads it concurrently (TSan).
  mutable std::mutex address_mu_;
  std::string address_;  // guarded by address_mu_
  RendezvousTable store_;
  std::atomic<bool> draining_{false}, shut_down_{false}, in_group_{false};
  std::atomic<uint64_t> epoch_{0};
  std::mutex mu_;  // one Forward/MoveKv/Join at a time; guards runner_'s group
};

LlmWorkerServer::LlmWorkerServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LlmWorkerServer::~LlmWorkerServer() { Shutdown(); }

StatusOr<std::unique_ptr<LlmWorkerServer>> LlmWorkerServer::Start(const LlmWorkerOptions& o) {
  ServingLoadOptions lo;  // no prefault: the shard reads only its own layers' pages
  lo.tokenizer_path = o.tokenizer_path;
  lo.context_length = o.context_length;
  lo.dequantize = o.dequantize;
  SI_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelForServing(o.model_path, lo));
  const uint64_t fingerprint = VocabFingerprint(*loaded.tokenizer);
  return Start(o, std::shared_ptr<const Model>(std::move(loaded.model)), fingerprint);
}

StatusOr<std::unique_ptr<LlmWorkerServer>> LlmWorkerServer::Start(
    const LlmWorkerOptions& o, std::shared_ptr<const Model> model, uint64_t fingerprint) {
  if (o.kv_block_size <= 0 || o.max_sequences <= 0)
    return InvalidArgumentError("kv block size and max sequences must be positive");
  const CollectiveLayout layout{o.stage, o.num_stages, o.tp_rank, o.tp_size};
  const int32_t blocks =
      KvBlocksPerSequence(model->config().max_seq_len, o.kv_block_size) * o.max_sequences;
  WorkerShardOptions ro;
  ro.num_threads = o.num_threads;
  ro.num_kv_blocks = blocks;
  ro.kv_block_size = o.kv_block_size;
  ro.device = o.device;
  ro.cuda_graphs = o.cuda_graphs;
  SI_ASSIGN_OR_RETURN(auto runner, CreateWorkerShard(o.backend, std::move(model), layout, ro));
  auto impl = std::make_unique<Impl>(o, std::move(runner), fingerprint);
  SI_RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<LlmWorkerServer>(new LlmWorkerServer(std::move(impl)));
}

int LlmWorkerServer::port() const { return impl_->port(); }
std::string LlmWorkerServer::address() const { return impl_->address(); }
void LlmWorkerServer::Wait() { impl_->Wait(); }
void LlmWorkerServer::Shutdown() { impl_->Shutdown(); }

}  // namespace specinfer
