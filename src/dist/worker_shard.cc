#include "dist/worker_shard.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "common/thread_pool.h"
#include "dist/collective.h"
#include "sampling/dist_rows.h"
#include "sampling/sampler.h"

namespace specinfer {

namespace {

// The CPU share: CpuShardRunner, its group over Gloo.
class CpuWorkerShard final : public WorkerShard {
 public:
  explicit CpuWorkerShard(std::unique_ptr<CpuShardRunner> runner) : runner_(std::move(runner)) {}

  const Model& model() const override { return runner_->model(); }
  ShardRange layers() const override { return runner_->layers(); }
  ShardRange vocab() const override { return runner_->vocab(); }
  bool last_stage() const override { return runner_->last_stage(); }
  int32_t num_kv_blocks() const override { return runner_->num_kv_blocks(); }
  int32_t kv_block_size() const override { return runner_->kv_block_size(); }
  std::string name() const override { return "cpu"; }

  Status Join(gloo::rendezvous::Store& store, const std::string& host, uint64_t epoch,
              std::chrono::milliseconds timeout) override {
    group_.reset();
    SI_ASSIGN_OR_RETURN(group_,
                        CollectiveGroup::Form(store, host, runner_->layout(), epoch, timeout));
    return Status::Ok();
  }
  void Leave() override { group_.reset(); }
  bool in_group() const override { return group_ != nullptr; }

  Status Forward(const ForwardBatch& batch, std::span<const std::span<const int32_t>> tables,
                 std::span<float> logits, std::span<ArgmaxShare> argmax, DistRows* dists) override {
    auto forward = [&](const ForwardBatch& b, std::span<float> out) {
      return runner_->Forward(b, tables, group_.get(), out);
    };
    // Only the last stage has logits; the others run the batch as it is.
    if (!runner_->last_stage() || (batch.argmax_rows.empty() && batch.dist_rows.empty()))
      return forward(batch, logits);
    const ShardRange cols = runner_->vocab();
    if (!batch.dist_rows.empty() && dists == nullptr)
      return InvalidArgumentError("a batch with distribution rows needs a DistRows to fill");
    // The distribution rows' logits columns are left in scratch_ after the logits and argmax
    // rows'.
    SI_RETURN_IF_ERROR(ForwardArgmaxOnHost(batch, static_cast<int32_t>(cols.begin),
                                           static_cast<int32_t>(cols.count), scratch_, logits,
                                           argmax, forward));
    const size_t a = batch.argmax_rows.size(), d = batch.dist_rows.size();
    if (d == 0) return Status::Ok();
    // A rank's columns make no distribution: the stage's ranks gather those rows whole first.
    const int32_t vocab = runner_->model().config().vocab_size;
    rows_.resize(d * static_cast<size_t>(vocab));
    const size_t first = (batch.logit_rows.size() + a) * static_cast<size_t>(cols.count);
    SI_RETURN_IF_ERROR(runner_->GatherVocabRows(group_.get(), scratch_.data() + first,
                                                static_cast<int64_t>(d), rows_.data()));
    dists->Reset(vocab);
    if (runner_->layout().tp_rank != 0) return Status::Ok();  // rank 0 answers them
    // The rows' distributions in place on the runner's threads (each row costs a softmax over
    // the vocabulary and top-p's partial sort), then added in order.
    runner_->pool()->ParallelFor(
        static_cast<int64_t>(d),
        [&](int64_t begin, int64_t end) {
          std::vector<float> probs;
          for (int64_t i = begin; i < end; ++i) {
            const std::span<float> row(rows_.data() + i * vocab, static_cast<size_t>(vocab));
            ComputeProbs(row, batch.dist_settings[static_cast<size_t>(i)].params(), probs);
            std::copy(probs.begin(), probs.end(), row.begin());
          }
        },
        1);
    for (size_t i = 0; i < d; ++i)
      dists->AddDense(std::span<const float>(rows_.data() + i * vocab, static_cast<size_t>(vocab)));
    return Status::Ok();
  }
  // A last-stage share turns distribution rows into distributions here, so that what each keeps
  // crosses the network instead of the rows' logits (with TP > 1 after gathering the rows).
  bool returns_distributions() const override { return runner_->last_stage(); }
  Status MoveKv(std::span<const int32_t> table, std::span<const int32_t> src,
                std::span<const int32_t> dst) override {
    runner_->MoveKv(table, src, dst);
    return Status::Ok();
  }
  double TakeCollectiveSeconds() override { return group_ ? group_->TakeSeconds() : 0.0; }

 private:
  std::unique_ptr<CpuShardRunner> runner_;
  std::unique_ptr<CollectiveGroup> group_;
  std::vector<float> scratch_;  // the argmax (and distribution) rows' logits columns
  std::vector<float> rows_;     // distribution rows' whole logits, then their probabilities
};

StatusOr<std::unique_ptr<WorkerShard>> CreateCpuShard(std::shared_ptr<const Model> model,
                                                      const CollectiveLayout& layout,
                                                      const WorkerShardOptions& o) {
  CpuRunnerOptions ro;
  ro.num_threads = o.num_threads;
  ro.num_kv_blocks = o.num_kv_blocks;
  ro.kv_block_size = o.kv_block_size;
  SI_ASSIGN_OR_RETURN(auto runner, CpuShardRunner::Create(std::move(model), layout, ro));
  return std::unique_ptr<WorkerShard>(new CpuWorkerShard(std::move(runner)));
}

struct Registry {
  std::mutex mu;
  std::map<std::string, WorkerShardFactory> factories{{"cpu", CreateCpuShard}};
};
Registry& TheRegistry() {
  static Registry r;
  return r;
}

}  // namespace

void RegisterWorkerShardBackend(const std::string& name, WorkerShardFactory factory) {
  Registry& r = TheRegistry();
  std::lock_guard lock(r.mu);
  r.factories[name] = std::move(factory);
}

StatusOr<std::unique_ptr<WorkerShard>> CreateWorkerShard(const std::string& name,
                                                         std::shared_ptr<const Model> model,
                                                         const CollectiveLayout& layout,
                                                         const WorkerShardOptions& options) {
  WorkerShardFactory factory;
  {
    Registry& r = TheRegistry();
    std::lock_guard lock(r.mu);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      std::string known;
      for (const auto& [n, f] : r.factories) known += (known.empty() ? "" : ", ") + n;
      return NotFoundError("LLM workers have no backend '" + name + "' in this program (" + known +
                           ")");
    }
    factory = it->second;
  }
  return factory(std::move(model), layout, options);
}

}  // namespace specinfer
