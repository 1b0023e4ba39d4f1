// The request manager's side of a TP x PP group of LLM workers (dist/llm_worker.h): a
// ModelRunner whose forward passes run on the group, so the engine core (EngineCore, Sequence) and
// the speculators drive a distributed LLM exactly as they drive CpuModelRunner, and greedy output
// is the same token for token (the workers' logits are bit-identical, see
// backend/cpu/shard_runner.h).
//
// Traffic per pass: the batch's token ids, positions, per-sequence ranges, block tables and
// tree-mask bits go to every worker (a few bytes per token); logits rows come back from the
// last stage (4 * vocab bytes per logits row, split over its TP ranks). Hidden states never go
// through gRPC: they move between workers over Gloo.
//
// Faults: every call has a deadline. A worker that is down, restarted, or whose collective
// failed makes Forward return UNAVAILABLE (or DATA_LOSS, below) naming it, e.g.
//   "LLM worker 127.0.0.1:5001 (stage 1, tp 0) unavailable: ...";
// the group is then marked broken. Every later call (and Probe) first probes the workers and,
// once all answer with the expected identity, re-forms the group under a new epoch. KV entries
// written before a re-formation are gone: a sequence that had KV in an older epoch gets
// DATA_LOSS "KV lost: ..." from Forward/MoveKv instead of silently running on missing entries,
// while sequences started after the re-formation run normally.
//
// Use: the manager keeps the model's config (and tokenizer) itself, drives the runner with a
// KvCacheManager(num_kv_blocks(), kv_block_size()) and an EngineCore, and may call Probe()
// periodically (e.g. from its health loop) so a returned worker is taken back before the next
// request arrives. LlmGroupBackend makes the group a backend of the engine.
//
// Thread safety: all methods may be called from any thread; calls are serialised internally.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"

namespace specinfer {

struct LlmGroupOptions {
  // host:port, stage-major: worker (stage s, tp rank r) is workers[s * tp_size + r].
  std::vector<std::string> workers;
  int32_t tp_size = 1, num_stages = 1;
  // KV blocks the manager may use; 0: the smallest capacity any worker reports (more than that
  // is refused).
  int32_t kv_blocks = 0;
  std::chrono::milliseconds rpc_timeout{30000};        // Forward / MoveKv deadline
  std::chrono::milliseconds collective_timeout{10000};  // workers' Gloo waits and Join
  std::chrono::milliseconds probe_timeout{2000};        // Register / Health while probing
};

// The group as a backend (backend/registry.h) for EngineOptions::custom_backend, named
// "llm-group": its factory Connect()s with kv_blocks = RunnerOptions::num_kv_blocks and the
// vocabulary fingerprint of RunnerOptions::tokenizer (required). It reads no weights.
Backend LlmGroupBackend(const LlmGroupOptions& options);

class RemoteLlmRunner final : public ModelRunner {
 public:
  // Registers every worker and forms the group. `model_for_config` is the deployment's model
  // (its config and shape; its weights are not used here). Refuses, naming the worker, one that
  // cannot be reached (UNAVAILABLE), or whose model shape, vocabulary fingerprint or place in
  // the group differs (FAILED_PRECONDITION).
  static StatusOr<std::unique_ptr<RemoteLlmRunner>> Connect(
      const LlmGroupOptions& options, std::shared_ptr<const Model> model_for_config,
      uint64_t expected_vocab_fingerprint);
  ~RemoteLlmRunner() override;  // releases the workers' group (best effort)

  const Model& model() const override { return *model_; }
  std::string name() const override;  // "llm-group tp=2 pp=2"
  Status Forward(const ForwardBatch& batch, const KvCacheManager& kv,
                 std::span<float> logits) override;
  // The last stage's workers find the argmax rows' argmax over their columns (on their device):
  // one id and one value per row and rank cross the network instead of the rows' logits.
  // Distribution rows go to the workers where returns_distributions(): the last stage's worker
  // answers what each distribution keeps instead of the rows' logits.
  Status ForwardArgmax(const ForwardBatch& batch, const KvCacheManager& kv, std::span<float> logits,
                       std::span<int32_t> argmax, DistRows* dists = nullptr) override;
  // Sampled draws cross as distribution rows where the workers return those, and the token is
  // drawn here at the draw's u (SampleFromProbs: the token the host would draw from the row's
  // logits); elsewhere sampled sequences without a tree get logits rows.
  bool draws_tokens() const override { return returns_dists_.load(); }
  // Whether the last stage's workers compute distribution rows where their logits are
  // (LlmWorkerInfo::returns_distributions: CPU and GPU shares; with TP > 1 they all-gather those
  // rows' columns first, and tp rank 0 answers them); else sampled trees get logits rows.
  bool returns_distributions() const override { return returns_dists_.load(); }
  // The most any worker asks for (LlmWorkerInfo::warmup_passes: GPU shares with CUDA graphs).
  int32_t warmup_passes() const override { return warmup_passes_.load(); }
  Status MoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                std::span<const int32_t> dst) override;
  int32_t num_kv_blocks() const override { return kv_blocks_; }
  // Bumped as soon as the group is found broken (a worker down, restarted, or a collective
  // failed): KV written before that is lost even if the same workers come back, so
  // the engine core fails the sequences that hold some (Sequence::CheckKvEpoch) before they
  // share a pass with new ones.
  uint64_t kv_epoch() const override { return kv_epoch_.load(); }
  // The workers' block size (the KvCacheManager driving this runner must use it).
  int32_t kv_block_size() const override { return kv_block_size_; }

  // The group epoch now (changes on every re-formation).
  uint64_t epoch() const;
  // Probes every worker; re-forms the group if it is broken (or a worker restarted) and all
  // answer. OK when the group is ready to serve.
  Status Probe();

  struct Traffic {
    int64_t passes = 0;
    int64_t request_bytes = 0;   // serialised Forward requests, all workers
    int64_t response_bytes = 0;  // serialised Forward responses, all workers
    double worker_compute_seconds = 0;     // summed over passes, slowest worker of each
    double worker_collective_seconds = 0;  // likewise
  };
  Traffic traffic() const;

  struct Worker;  // defined in llm_client.cc

 private:
  RemoteLlmRunner(const LlmGroupOptions& options, std::shared_ptr<const Model> model,
                  uint64_t fingerprint);
  Status Pass(const ForwardBatch& batch, const KvCacheManager& kv, std::span<float> logits,
              std::span<int32_t> argmax, DistRows* dists = nullptr);
  Status RegisterAll(bool first);  // requires mu_
  Status Reform();                 // requires mu_
  Status CheckKvEpochs(const ForwardBatch& batch, const KvCacheManager& kv);  // requires mu_
  // DataLoss unless the blocks holding positions [0, end) of `seq` were written this epoch.
  Status CheckBlocksWritten(const KvCacheManager& kv, SeqId seq, int32_t end);  // requires mu_
  // Records that positions [begin, end) of `seq` were written this epoch.
  void MarkBlocksWritten(const KvCacheManager& kv, SeqId seq, int32_t begin,
                         int32_t end);  // requires mu_
  void MarkBroken();                                                           // requires mu_

  const LlmGroupOptions options_;
  std::shared_ptr<const Model> model_;
  const uint64_t fingerprint_;
  int32_t kv_blocks_ = 0, kv_block_size_ = 0;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Worker>> workers_;
  uint64_t epoch_ = 0;
  bool broken_ = true;
  bool joined_ = false;  // a group was formed by this runner (released on destruction)
  std::atomic<uint64_t> kv_epoch_{0};
  std::atomic<bool> returns_dists_{false};  // as the workers last registered
  std::atomic<int32_t> warmup_passes_{0};     // likewise
  // Group epoch in which each physical KV block was last written (0: never; epochs start at 1).
  // Kept per block, not per sequence: with prefix caching (kv/kv_cache.h) a sequence reads
  // blocks other sequences wrote, and a block may be in several block tables at once.
  std::vector<uint64_t> block_epoch_;
  Traffic traffic_;
  std::vector<ArgmaxShare> argmax_shares_;  // per pass: the ranks' argmax shares, combined
};

}  // namespace specinfer
