#include "dist/cuda/cuda_worker_shard.h"

#include <gloo/rendezvous/store.h>

#include <random>

#include "backend/cuda/cuda_runner.h"
#include "dist/worker_shard.h"
#if defined(SPECINFER_WITH_NCCL)
#include "backend/cuda/nccl/nccl_collective.h"
#else
#include "backend/cuda/thread_collective.h"
#endif

namespace specinfer {

namespace {

using cuda::CudaModelRunner;

// The worker's gloo Store as the NCCL id exchange's key-value store. The Store interface throws
// (GrpcRendezvousStore: gloo::IoException); errors become ABORTED, as Gloo's own do.
class StoreKv final
#if defined(SPECINFER_WITH_NCCL)
    : public cuda::RendezvousKv
#endif
{
 public:
  explicit StoreKv(gloo::rendezvous::Store& store) : store_(store) {}
  Status Set(const std::string& key, const std::string& value) {
    try {
      store_.set(key, std::vector<char>(value.begin(), value.end()));
      return Status::Ok();
    } catch (const std::exception& e) {
      return Status(StatusCode::kAborted, "rendezvous set " + key + ": " + e.what());
    }
  }
  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) {
    try {
      store_.wait({key}, timeout);
      const std::vector<char> v = store_.get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return Status(StatusCode::kAborted, "rendezvous get " + key + ": " + e.what());
    }
  }

 private:
  gloo::rendezvous::Store& store_;
};

class CudaWorkerShard final : public WorkerShard {
 public:
  CudaWorkerShard(std::unique_ptr<CudaModelRunner> runner, int32_t device)
      : runner_(std::move(runner)), device_(device) {}

  const Model& model() const override { return runner_->model(); }
  ShardRange layers() const override { return runner_->layers(); }
  ShardRange vocab() const override { return runner_->vocab(); }
  bool last_stage() const override { return runner_->last_stage(); }
  int32_t num_kv_blocks() const override { return runner_->num_kv_blocks(); }
  int32_t kv_block_size() const override { return runner_->kv_block_size(); }
  std::string name() const override { return runner_->name(); }

  Status Join(gloo::rendezvous::Store& store, const std::string& /*host*/, uint64_t epoch,
              std::chrono::milliseconds timeout) override {
    Leave();
    const CollectiveLayout& l = runner_->layout();
    if (l.tp_size == 1 && l.num_stages == 1) {  // the whole model: no peers
      joined_ = true;
      return Status::Ok();
    }
    StoreKv kv(store);
#if defined(SPECINFER_WITH_NCCL)
    SI_ASSIGN_OR_RETURN(group_, cuda::NcclCollective::Create(kv, l, epoch, device_, timeout));
#else
    std::string key = "e";  // (not "e" + ...: GCC 12 warns falsely about that, -Wrestrict)
    key += std::to_string(epoch) + "/cuda-group";
    std::string name;
    if (l.stage == 0 && l.tp_rank == 0) {
      std::random_device rd;
      name = key + "/" + std::to_string(rd()) + "-" + std::to_string(rd());
      SI_RETURN_IF_ERROR(kv.Set(key, name));
    } else {
      SI_ASSIGN_OR_RETURN(name, kv.Get(key, timeout));
    }
    SI_ASSIGN_OR_RETURN(group_, cuda::ThreadCollectiveGroup::JoinNamed(name, l, timeout));
#endif
    SI_RETURN_IF_ERROR(runner_->SetCollective(group_));
    joined_ = true;
    return Status::Ok();
  }

  void Leave() override {
    if (group_) group_->Abort(CancelledError("the worker left the group"));
    (void)runner_->SetCollective(nullptr);
    group_.reset();
    joined_ = false;
  }
  bool in_group() const override { return joined_; }

  Status Forward(const ForwardBatch& batch, std::span<const std::span<const int32_t>> tables,
                 std::span<float> logits, std::span<ArgmaxShare> argmax, DistRows* dists) override {
    if (!joined_) return FailedPreconditionError("not in a group");
    Status s = runner_->ForwardWithTables(batch, tables, logits, argmax, dists);
    if (!s.ok() && group_) {  // the runner has aborted the group: the peers fail too
      Leave();
      return Status(StatusCode::kAborted, s.ToString());
    }
    return s;
  }
  Status MoveKv(std::span<const int32_t> table, std::span<const int32_t> src,
                std::span<const int32_t> dst) override {
    return runner_->MoveKvWithTable(table, src, dst);
  }
  double TakeCollectiveSeconds() override { return 0.0; }
  bool returns_distributions() const override { return runner_->last_stage(); }
  int32_t warmup_passes() const override { return runner_->warmup_passes(); }

 private:
  std::unique_ptr<CudaModelRunner> runner_;
  int32_t device_ = 0;
  std::shared_ptr<cuda::DeviceCollective> group_;  // null with a 1 x 1 layout
  bool joined_ = false;
};

StatusOr<std::unique_ptr<WorkerShard>> CreateCudaShard(std::shared_ptr<const Model> model,
                                                       const CollectiveLayout& layout,
                                                       const WorkerShardOptions& o) {
#if !defined(SPECINFER_WITH_NCCL) && !defined(SPECINFER_CUDA_EMULATION)
  // Worker processes could not form a group (the in-process collective joins threads only).
  if (layout.tp_size > 1 || layout.num_stages > 1)
    return FailedPreconditionError(
        "LLM workers on GPUs need NCCL for tp or pp above 1; this program was built without it");
#endif
  cuda::CudaRunnerOptions ro;
  ro.device = o.device;
  ro.num_kv_blocks = o.num_kv_blocks;
  ro.kv_block_size = o.kv_block_size;
  ro.layout = layout;
  ro.cuda_graphs = o.cuda_graphs;
  SI_ASSIGN_OR_RETURN(auto runner, CudaModelRunner::Create(std::move(model), ro));
  return std::unique_ptr<WorkerShard>(new CudaWorkerShard(std::move(runner), o.device));
}

}  // namespace

void RegisterCudaWorkerShard() { RegisterWorkerShardBackend("cuda", CreateCudaShard); }

}  // namespace specinfer
