#include "backend/cuda/cuda_backend.h"

#include "backend/cuda/cuda_runner.h"
#include "backend/registry.h"

namespace specinfer::cuda {

void RegisterCudaBackend() {
  Backend b;
  b.name = "cuda";
  b.create = [](std::shared_ptr<const Model> model,
                const RunnerOptions& o) -> StatusOr<std::unique_ptr<ModelRunner>> {
    CudaRunnerOptions co;
    co.device = o.device;
    co.num_kv_blocks = o.num_kv_blocks;
    co.kv_block_size = o.kv_block_size;
    co.cuda_graphs = o.cuda_graphs;
    SI_ASSIGN_OR_RETURN(auto r, CudaModelRunner::Create(std::move(model), co));
    return std::unique_ptr<ModelRunner>(std::move(r));
  };
  RegisterBackend(std::move(b));
}

}  // namespace specinfer::cuda
