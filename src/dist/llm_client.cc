#include "dist/llm_client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>

#include "backend/cpu/shard_runner.h"
#include "backend/forward_check.h"
#include "dist/collective.h"
#include "dist/model_identity.h"
#include "proto/llm_worker.grpc.pb.h"
#include "sampling/sampler.h"
#include "server/grpc_listen.h"

namespace specinfer {

namespace pb = ::specinfer::worker;

struct RemoteLlmRunner::Worker {
  std::string address;
  int32_t stage = 0, tp_rank = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::LlmWorker::Stub> stub;
  uint64_t boot_id = 0;

  std::string Name() const {
    return "LLM worker " + address + " (stage " + std::to_string(stage) + ", tp " +
           std::to_string(tp_rank) + ")";
  }
};

namespace {

using SysClock = std::chrono::system_clock;
using Worker = RemoteLlmRunner::Worker;

Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(s.error_code()), s.error_message());
}

// Sends one call to every worker at once and waits for all answers. `call` starts the async
// call: call(stub->async(), ctx, &request_for_worker_i, &resps[i], done).
template <typename Resp, typename Call>
std::vector<grpc::Status> CallAll(const std::vector<std::unique_ptr<Worker>>& workers,
                                  std::vector<Resp>& resps, std::chrono::milliseconds timeout,
                                  Call call) {
  const size_t n = workers.size();
  resps.assign(n, Resp());
  std::vector<grpc::Status> statuses(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs(n);
  std::mutex mu;
  std::condition_variable cv;
  size_t left = n;
  const auto deadline = SysClock::now() + timeout;
  for (size_t i = 0; i < n; ++i) {
    ctxs[i] = std::make_unique<grpc::ClientContext>();
    ctxs[i]->set_deadline(deadline);
    call(i, workers[i]->stub->async(), ctxs[i].get(), &resps[i],
         [&, i](grpc::Status s) {
           std::lock_guard lock(mu);
           statuses[i] = std::move(s);
           if (--left == 0) cv.notify_all();
         });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return left == 0; });
  return statuses;
}

// How bad a worker's failure is, for picking the one to report: the cause (a worker that is
// down) before its effects (peers whose collectives failed).
int Severity(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN: return 0;
    case grpc::StatusCode::FAILED_PRECONDITION: return 1;  // restarted: not in the group
    case grpc::StatusCode::INVALID_ARGUMENT: return 3;
    case grpc::StatusCode::ABORTED: return 4;  // a collective with a failed peer
    default: return 2;
  }
}

}  // namespace

RemoteLlmRunner::RemoteLlmRunner(const LlmGroupOptions& options,
                                 std::shared_ptr<const Model> model, uint64_t fingerprint)
    : options_(options), model_(std::move(model)), fingerprint_(fingerprint) {}

RemoteLlmRunner::~RemoteLlmRunner() {
  std::lock_guard lock(mu_);
  if (!joined_) return;  // a Connect that failed early leaves the workers as they were
  std::vector<pb::LlmReleaseResponse> resps;
  pb::LlmReleaseRequest req;
  CallAll(workers_, resps, options_.probe_timeout,
          [&](size_t, auto* async, grpc::ClientContext* ctx, auto* resp, auto done) {
            async->Release(ctx, &req, resp, std::move(done));
          });
}

Backend LlmGroupBackend(const LlmGroupOptions& options) {
  Backend b;
  b.name = "llm-group";
  b.reads_weights = false;
  b.create = [options](std::shared_ptr<const Model> model,
                       const RunnerOptions& ro) -> StatusOr<std::unique_ptr<ModelRunner>> {
    if (ro.tokenizer == nullptr)
      return InvalidArgumentError("LLM group: the workers' vocabulary needs the tokenizer");
    LlmGroupOptions o = options;
    o.kv_blocks = ro.num_kv_blocks;
    const uint64_t fingerprint = VocabFingerprint(*ro.tokenizer);
    SI_ASSIGN_OR_RETURN(auto runner, RemoteLlmRunner::Connect(o, std::move(model), fingerprint));
    return std::unique_ptr<ModelRunner>(std::move(runner));
  };
  return b;
}

StatusOr<std::unique_ptr<RemoteLlmRunner>> RemoteLlmRunner::Connect(
    const LlmGroupOptions& o, std::shared_ptr<const Model> model, uint64_t fingerprint) {
  if (!model) return InvalidArgumentError("LLM group: no model configuration");
  if (o.tp_size < 1 || o.num_stages < 1 ||
      o.workers.size() != static_cast<size_t>(o.tp_size) * o.num_stages)
    return InvalidArgumentError("LLM group: " + std::to_string(o.workers.size()) +
                                " workers for tp " + std::to_string(o.tp_size) + " x pp " +
                                std::to_string(o.num_stages));
  SI_RETURN_IF_ERROR(CheckShardable(model->config(), {0, o.num_stages, 0, o.tp_size}));
  std::unique_ptr<RemoteLlmRunner> r(new RemoteLlmRunner(o, std::move(model), fingerprint));
  const grpc::ChannelArguments args = WorkerChannelArguments();
  for (size_t i = 0; i < o.workers.size(); ++i) {
    auto w = std::make_unique<Worker>();
    w->address = o.workers[i];
    w->stage = static_cast<int32_t>(i) / o.tp_size;
    w->tp_rank = static_cast<int32_t>(i) % o.tp_size;
    w->channel = grpc::CreateCustomChannel(w->address, grpc::InsecureChannelCredentials(), args);
    w->stub = pb::LlmWorker::NewStub(w->channel);
    r->workers_.push_back(std::move(w));
  }
  std::lock_guard lock(r->mu_);
  SI_RETURN_IF_ERROR(r->RegisterAll(/*first=*/true));
  SI_RETURN_IF_ERROR(r->Reform());
  spdlog::info("LLM group of {} workers (tp {} x pp {}) ready, epoch {}, {} KV blocks of {}",
               r->workers_.size(), o.tp_size, o.num_stages, r->epoch_, r->kv_blocks_,
               r->kv_block_size_);
  return r;
}

std::string RemoteLlmRunner::name() const {
  return "llm-group tp=" + std::to_string(options_.tp_size) +
         " pp=" + std::to_string(options_.num_stages);
}

uint64_t RemoteLlmRunner::epoch() const {
  std::lock_guard lock(mu_);
  return epoch_;
}

RemoteLlmRunner::Traffic RemoteLlmRunner::traffic() const {
  std::lock_guard lock(mu_);
  return traffic_;
}

Status RemoteLlmRunner::RegisterAll(bool first) {
  const ModelConfig& c = model_->config();
  std::vector<pb::LlmWorkerInfo> infos;
  auto statuses = CallAll(
      workers_, infos, first ? options_.rpc_timeout : options_.probe_timeout,
      [&](size_t i, auto* async, grpc::ClientContext* ctx, auto* resp, auto done) {
        auto req = std::make_shared<pb::LlmRegisterRequest>();
        req->set_model_shape(ModelShapeString(c));
        req->set_vocab_size(c.vocab_size);
        req->set_vocab_fingerprint(fingerprint_);
        req->set_stage(workers_[i]->stage);
        req->set_num_stages(options_.num_stages);
        req->set_tp_rank(workers_[i]->tp_rank);
        req->set_tp_size(options_.tp_size);
        async->Register(ctx, req.get(), resp,
                        [req, done = std::move(done)](grpc::Status s) { done(std::move(s)); });
      });
  for (size_t i = 0; i < workers_.size(); ++i) {
    const grpc::Status& s = statuses[i];
    if (s.ok()) continue;
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
      return FailedPreconditionError(workers_[i]->Name() + " refused: " + s.error_message());
    return UnavailableError(workers_[i]->Name() + " unavailable: " + s.error_message());
  }
  // The workers checked the identity; check what they answered too (a worker of another build
  // might not have).
  int32_t blocks = INT32_MAX, block_size = infos[0].kv_block_size();
  int32_t next_layer = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const pb::LlmWorkerInfo& info = infos[i];
    const Worker& w = *workers_[i];
    if (info.model_shape() != ModelShapeString(c) || info.vocab_fingerprint() != fingerprint_)
      return FailedPreconditionError(w.Name() + " refused: it serves \"" + info.model_shape() +
                                     "\" with vocabulary fingerprint " +
                                     std::to_string(info.vocab_fingerprint()));
    if (info.stage() != w.stage || info.tp_rank() != w.tp_rank ||
        info.num_stages() != options_.num_stages || info.tp_size() != options_.tp_size)
      return FailedPreconditionError(w.Name() + " refused: it holds another place in the group");
    if (info.kv_block_size() != block_size)
      return FailedPreconditionError(w.Name() + " refused: KV block size " +
                                     std::to_string(info.kv_block_size()) + " differs from " +
                                     std::to_string(block_size));
    if (w.tp_rank == 0) {
      if (info.layer_begin() != next_layer)
        return FailedPreconditionError(w.Name() + " refused: its layers do not follow stage " +
                                       std::to_string(w.stage - 1) + "'s");
      next_layer = info.layer_end();
    }
    blocks = std::min(blocks, info.kv_blocks());
    if (!first && w.boot_id != info.boot_id())
      spdlog::warn("{} restarted since the group formed (its KV is gone)", w.Name());
  }
  if (next_layer != c.n_layers)
    return FailedPreconditionError("LLM group's stages cover " + std::to_string(next_layer) +
                                   " of the model's " + std::to_string(c.n_layers) + " layers");
  if (first) {
    if (options_.kv_blocks > blocks)
      return InvalidArgumentError("LLM group: " + std::to_string(options_.kv_blocks) +
                                  " KV blocks asked for, the smallest worker holds " +
                                  std::to_string(blocks));
    kv_blocks_ = options_.kv_blocks > 0 ? options_.kv_blocks : blocks;
    kv_block_size_ = block_size;
  } else if (blocks < kv_blocks_ || block_size != kv_block_size_) {
    return FailedPreconditionError("LLM group: a worker came back with a smaller KV capacity");
  }
  bool dists = true;
  int32_t warmup = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    warmup = std::max(warmup, infos[i].warmup_passes());
    workers_[i]->boot_id = infos[i].boot_id();
    epoch_ = std::max<uint64_t>(epoch_, infos[i].epoch());
    if (workers_[i]->stage == options_.num_stages - 1)
      dists = dists && infos[i].returns_distributions();
  }
  returns_dists_ = dists;
  warmup_passes_ = std::clamp(warmup, 0, 8);
  return Status::Ok();
}

Status RemoteLlmRunner::Reform() {
  const uint64_t epoch = epoch_ + 1;
  std::vector<pb::LlmJoinResponse> resps;
  pb::LlmJoinRequest req;
  req.set_epoch(epoch);
  for (const auto& w : workers_) req.add_workers(w->address);
  req.set_num_stages(options_.num_stages);
  req.set_tp_size(options_.tp_size);
  req.set_rendezvous(workers_[0]->address);
  req.set_collective_timeout_ms(static_cast<uint32_t>(options_.collective_timeout.count()));
  epoch_ = epoch;  // a failed attempt burns its epoch: the next one starts clean
  auto statuses = CallAll(workers_, resps, options_.collective_timeout + options_.probe_timeout,
                          [&](size_t, auto* async, grpc::ClientContext* ctx, auto* resp,
                              auto done) { async->Join(ctx, &req, resp, std::move(done)); });
  for (size_t i = 0; i < workers_.size(); ++i)
    if (!statuses[i].ok())
      return UnavailableError(workers_[i]->Name() + " could not join the group (epoch " +
                              std::to_string(epoch) + "): " + statuses[i].error_message());
  broken_ = false;
  joined_ = true;
  return Status::Ok();
}

void RemoteLlmRunner::MarkBroken() {
  if (!broken_) ++kv_epoch_;
  broken_ = true;
}

Status RemoteLlmRunner::Probe() {
  std::lock_guard lock(mu_);
  if (!broken_) {
    std::vector<pb::LlmHealthResponse> resps;
    pb::LlmHealthRequest req;
    auto statuses = CallAll(workers_, resps, options_.probe_timeout,
                            [&](size_t, auto* async, grpc::ClientContext* ctx, auto* resp,
                                auto done) { async->Health(ctx, &req, resp, std::move(done)); });
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (!statuses[i].ok()) {
        MarkBroken();
        return UnavailableError(workers_[i]->Name() + " unavailable: " +
                                statuses[i].error_message());
      }
      if (resps[i].boot_id() != workers_[i]->boot_id || !resps[i].in_group() ||
          resps[i].epoch() != epoch_)
        MarkBroken();
    }
    if (!broken_) return Status::Ok();
  }
  SI_RETURN_IF_ERROR(RegisterAll(/*first=*/false));
  return Reform();
}

Status RemoteLlmRunner::CheckBlocksWritten(const KvCacheManager& kv, SeqId seq, int32_t end) {
  const auto table = kv.BlockTable(seq);
  const size_t used = std::min(table.size(), (static_cast<size_t>(std::max(end, 0)) +
                                              kv_block_size_ - 1) / kv_block_size_);
  for (size_t i = 0; i < used; ++i) {
    const int32_t b = table[i];
    if (b < 0 || static_cast<size_t>(b) >= block_epoch_.size() || block_epoch_[b] != epoch_)
      return DataLossError("KV lost: an LLM worker restarted or the group was re-formed (now "
                           "epoch " + std::to_string(epoch_) + ") since the KV entries of "
                           "sequence " + std::to_string(seq) + " were written; it must start "
                           "over");
  }
  return Status::Ok();
}

void RemoteLlmRunner::MarkBlocksWritten(const KvCacheManager& kv, SeqId seq, int32_t begin,
                                        int32_t end) {
  if (end <= begin) return;
  const auto table = kv.BlockTable(seq);
  const size_t last = std::min(table.size(), (static_cast<size_t>(end) + kv_block_size_ - 1) /
                                                 kv_block_size_);
  if (block_epoch_.size() < static_cast<size_t>(kv_blocks_))
    block_epoch_.resize(static_cast<size_t>(kv_blocks_), 0);
  for (size_t i = static_cast<size_t>(begin) / kv_block_size_; i < last; ++i)
    if (table[i] >= 0 && static_cast<size_t>(table[i]) < block_epoch_.size())
      block_epoch_[table[i]] = epoch_;
}

Status RemoteLlmRunner::CheckKvEpochs(const ForwardBatch& batch, const KvCacheManager& kv) {
  for (const BatchSequence& s : batch.seqs) {
    if (s.kv_prefix + s.masked_kv == 0) continue;  // needs no earlier entries
    SI_RETURN_IF_ERROR(CheckBlocksWritten(kv, s.seq, s.kv_prefix + s.masked_kv));
  }
  return Status::Ok();
}

Status RemoteLlmRunner::Forward(const ForwardBatch& batch, const KvCacheManager& kv,
                                std::span<float> logits) {
  return Pass(batch, kv, logits, {});
}

Status RemoteLlmRunner::ForwardArgmax(const ForwardBatch& batch, const KvCacheManager& kv,
                                      std::span<float> logits, std::span<int32_t> argmax,
                                      DistRows* dists) {
  const bool take_dists = returns_dists_.load();
  if ((!batch.dist_rows.empty() || batch.has_draws()) && !take_dists)
    return InvalidArgumentError(
        "this LLM group does not return distributions (returns_distributions), so it takes "
        "neither distribution rows nor sampled draws");
  if (!batch.has_draws()) return Pass(batch, kv, logits, argmax, dists);
  if (argmax.size() < batch.argmax_rows.size())
    return InvalidArgumentError("argmax buffer too small");
  SI_RETURN_IF_ERROR(batch.Validate(model_->config().vocab_size));
  // A sampled draw crosses as a distribution row (after the batch's own): the token is drawn
  // here at its u from what the row keeps, as the host would from the row's logits.
  ForwardBatch pass = batch;  // the masks it points to stay the caller's
  pass.argmax_rows.clear();
  pass.draws.clear();
  std::vector<size_t> greedy, sampled;  // indices into batch.argmax_rows
  for (size_t i = 0; i < batch.argmax_rows.size(); ++i) {
    if (batch.draws[i].greedy()) {
      greedy.push_back(i);
      pass.argmax_rows.push_back(batch.argmax_rows[i]);
    } else {
      sampled.push_back(i);
      pass.AddDistRow(batch.argmax_rows[i], batch.draws[i]);
    }
  }
  DistRows all;
  std::vector<int32_t> ids(greedy.size());
  SI_RETURN_IF_ERROR(Pass(pass, kv, logits, ids, &all));
  for (size_t j = 0; j < greedy.size(); ++j) argmax[greedy[j]] = ids[j];
  const auto own = static_cast<int32_t>(batch.dist_rows.size());
  std::vector<float> probs;
  for (size_t j = 0; j < sampled.size(); ++j) {
    all.Expand(own + static_cast<int32_t>(j), probs);
    argmax[sampled[j]] = SampleFromProbs(probs, batch.draws[sampled[j]].u);
  }
  if (dists != nullptr) {
    all.Truncate(own);
    *dists = std::move(all);
  }
  return Status::Ok();
}

Status RemoteLlmRunner::Pass(const ForwardBatch& batch, const KvCacheManager& kv,
                             std::span<float> logits, std::span<int32_t> argmax, DistRows* dists) {
  const ModelConfig& c = model_->config();
  std::lock_guard lock(mu_);
  SI_RETURN_IF_ERROR(CheckForward(batch, kv,
                                  ForwardLimits{c.vocab_size, kv_blocks_, kv_block_size_},
                                  logits.size(), argmax.size(), dists != nullptr));
  if (dists != nullptr) dists->Reset(c.vocab_size);
  if (batch.size() == 0) return Status::Ok();
  const size_t m = batch.logit_rows.size();
  if (broken_) {
    SI_RETURN_IF_ERROR(RegisterAll(/*first=*/false));
    SI_RETURN_IF_ERROR(Reform());
    spdlog::info("LLM group re-formed, epoch {}", epoch_);
  }
  SI_RETURN_IF_ERROR(CheckKvEpochs(batch, kv));

  pb::LlmForwardRequest req;
  req.set_epoch(epoch_);
  req.mutable_tokens()->Add(batch.tokens.begin(), batch.tokens.end());
  req.mutable_positions()->Add(batch.positions.begin(), batch.positions.end());
  req.mutable_logit_rows()->Add(batch.logit_rows.begin(), batch.logit_rows.end());
  req.mutable_argmax_rows()->Add(batch.argmax_rows.begin(), batch.argmax_rows.end());
  req.mutable_dist_rows()->Add(batch.dist_rows.begin(), batch.dist_rows.end());
  for (const TokenDraw& d : batch.dist_settings) {
    pb::LlmSampling* ps = req.add_dist_settings();
    ps->set_temperature(d.temperature);
    ps->set_top_k(d.top_k);
    ps->set_top_p(d.top_p);
  }
  req.set_batch_invariant(batch.batch_invariant);
  req.set_kv_block_size(kv_block_size_);
  for (const BatchSequence& s : batch.seqs) {
    pb::LlmSequence* ps = req.add_seqs();
    ps->set_seq(s.seq);
    ps->set_token_begin(s.token_begin);
    ps->set_token_count(s.token_count);
    ps->set_kv_prefix(s.kv_prefix);
    ps->set_masked_kv(s.masked_kv);
    const auto table = kv.BlockTable(s.seq);
    const size_t used = (static_cast<size_t>(s.kv_end()) + kv_block_size_ - 1) / kv_block_size_;
    ps->mutable_block_table()->Add(table.begin(), table.begin() + std::min(used, table.size()));
    if (s.mask) {
      ps->set_has_mask(true);
      ps->set_mask_cols(s.mask->num_cols);
      ps->mutable_mask_bits()->Add(s.mask->bits.begin(), s.mask->bits.end());
    }
  }

  std::vector<pb::LlmForwardResponse> resps;
  auto statuses = CallAll(workers_, resps, options_.rpc_timeout,
                          [&](size_t, auto* async, grpc::ClientContext* ctx, auto* resp,
                              auto done) { async->Forward(ctx, &req, resp, std::move(done)); });
  int worst = -1;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (statuses[i].ok()) continue;
    if (statuses[i].error_code() != grpc::StatusCode::INVALID_ARGUMENT) MarkBroken();
    if (worst < 0 ||
        Severity(statuses[i].error_code()) < Severity(statuses[worst].error_code()))
      worst = static_cast<int>(i);
  }
  if (worst >= 0) {
    const Worker& w = *workers_[worst];
    const grpc::Status& s = statuses[worst];
    switch (Severity(s.error_code())) {
      case 0: return UnavailableError(w.Name() + " unavailable: " + s.error_message());
      case 1: {
        bool had_kv = false;
        for (const BatchSequence& bs : batch.seqs) had_kv |= bs.kv_prefix + bs.masked_kv > 0;
        const std::string msg = w.Name() + " restarted or left the group: " + s.error_message();
        return had_kv ? DataLossError("KV lost: " + msg) : UnavailableError(msg);
      }
      case 3: return FromGrpc(s);
      case 4: return UnavailableError("LLM group failed (" + w.Name() + "): " + s.error_message());
      default: return FromGrpc(s).WithContext(w.Name());
    }
  }

  // Assemble the logits columns of the last stage's TP ranks, and combine their argmax shares.
  const int32_t vocab = c.vocab_size;
  const size_t a = batch.argmax_rows.size();
  argmax_shares_.assign(a, ArgmaxShare{});
  double compute = 0, collective = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const pb::LlmForwardResponse& r = resps[i];
    traffic_.response_bytes += static_cast<int64_t>(r.ByteSizeLong());
    compute = std::max(compute, r.compute_seconds());
    collective = std::max(collective, r.collective_seconds());
    if (workers_[i]->stage != options_.num_stages - 1) continue;
    const ShardRange want = SplitEvenly(vocab, options_.tp_size, workers_[i]->tp_rank);
    if (r.vocab_begin() != want.begin || r.vocab_count() != want.count ||
        r.rows() != static_cast<int32_t>(m) ||
        r.logits().size() != m * static_cast<size_t>(want.count) * sizeof(float)) {
      MarkBroken();
      return InternalError(workers_[i]->Name() + " answered logits of the wrong shape");
    }
    if (r.argmax_ids_size() != static_cast<int>(a) ||
        r.argmax_values_size() != static_cast<int>(a)) {
      MarkBroken();
      return InternalError(workers_[i]->Name() + " answered the wrong number of argmax rows");
    }
    const char* src = r.logits().data();
    for (size_t row = 0; row < m; ++row)
      std::memcpy(&logits[row * vocab + want.begin], src + row * want.count * sizeof(float),
                  want.count * sizeof(float));
    for (size_t row = 0; row < a; ++row) {
      const int32_t id = r.argmax_ids(static_cast<int>(row));
      if (id < want.begin || id >= want.end()) {
        MarkBroken();
        return InternalError(workers_[i]->Name() + " answered an argmax outside its columns");
      }
      argmax_shares_[row].Combine(ArgmaxShare{r.argmax_values(static_cast<int>(row)), id});
    }
    if (!batch.dist_rows.empty() && workers_[i]->tp_rank == 0) {  // the ranks' rows are one
      const std::string& packed = r.dist_packed();
      Status got =
          r.dist_kept_size() == static_cast<int>(batch.dist_rows.size()) && packed.size() % 4 == 0
              ? Status::Ok()
              : InvalidArgumentError("wrong number of distribution rows");
      std::vector<uint32_t> words(packed.size() / 4);
      if (got.ok()) {
        std::memcpy(words.data(), packed.data(), packed.size());
        got = dists->AddPacked(
            std::span<const int32_t>(r.dist_kept().data(), static_cast<size_t>(r.dist_kept_size())),
            words);
      }
      if (!got.ok()) {
        MarkBroken();
        return InternalError(workers_[i]->Name() +
                             " answered malformed distribution rows: " + got.message());
      }
    }
  }
  for (size_t row = 0; row < a; ++row) argmax[row] = argmax_shares_[row].id;
  ++traffic_.passes;
  traffic_.request_bytes += static_cast<int64_t>(req.ByteSizeLong() * workers_.size());
  traffic_.worker_compute_seconds += compute;
  traffic_.worker_collective_seconds += collective;
  for (const BatchSequence& s : batch.seqs)
    MarkBlocksWritten(kv, s.seq, s.kv_prefix + s.masked_kv, s.kv_end());
  return Status::Ok();
}

Status RemoteLlmRunner::MoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                               std::span<const int32_t> dst) {
  SI_RETURN_IF_ERROR(CheckMoveKv(kv, seq, src, dst));
  const int32_t len = kv.Length(seq);
  bool any = false;
  for (size_t i = 0; i < src.size(); ++i) any |= src[i] != dst[i];
  if (!any) return Status::Ok();
  std::lock_guard lock(mu_);
  if (broken_) return UnavailableError("LLM group is down (re-forming on the next pass)");
  // The entries moved must have been written this epoch (by this sequence or, with prefix
  // caching, by another one that shared the block).
  int32_t src_end = 0;
  for (int32_t p : src) src_end = std::max(src_end, p + 1);
  SI_RETURN_IF_ERROR(CheckBlocksWritten(kv, seq, src_end));
  pb::LlmMoveKvRequest req;
  req.set_epoch(epoch_);
  req.set_seq(seq);
  const auto table = kv.BlockTable(seq);
  req.mutable_block_table()->Add(table.begin(), table.end());
  req.set_length(len);
  req.mutable_src()->Add(src.begin(), src.end());
  req.mutable_dst()->Add(dst.begin(), dst.end());
  req.set_kv_block_size(kv_block_size_);
  std::vector<pb::LlmMoveKvResponse> resps;
  auto statuses = CallAll(workers_, resps, options_.rpc_timeout,
                          [&](size_t, auto* async, grpc::ClientContext* ctx, auto* resp,
                              auto done) { async->MoveKv(ctx, &req, resp, std::move(done)); });
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (statuses[i].ok()) continue;
    // A worker that did not move its share leaves the group's KV inconsistent.
    MarkBroken();
    return UnavailableError(workers_[i]->Name() + " failed to move KV entries: " +
                            statuses[i].error_message());
  }
  for (int32_t p : dst) MarkBlocksWritten(kv, seq, p, p + 1);
  return Status::Ok();
}

}  // namespace specinfer
