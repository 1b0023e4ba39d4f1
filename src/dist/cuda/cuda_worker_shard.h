// The "cuda" backend of LLM workers (dist/worker_shard.h): the worker's share of the model on one
// GPU (backend/cuda/cuda_runner.h, TP x PP split as the CPU's) and its group:
//   - in builds with NCCL (SPECINFER_WITH_NCCL): NcclCollective (backend/cuda/nccl/), its unique
//     ids exchanged through the worker's rendezvous store (the same Store Gloo uses, keys
//     "e<epoch>/nccl/..."): one process per GPU, on one host or several;
//   - in the CUDA emulator's builds: the in-process ThreadCollectiveGroup, met by a name that
//     rank (0, 0) publishes in the store under "e<epoch>/cuda-group": it joins only workers that
//     are threads of one process (tests);
//   - a GPU build without NCCL refuses a share of tp or pp above 1 at start (FAILED_PRECONDITION);
//     one whole-model worker (1 x 1) needs no collective.
// A pass that fails leaves the group (the runner has aborted it, so the peers fail too) and is
// answered ABORTED: the manager re-forms the group under a new epoch.
// Collective time is not measured separately (TakeCollectiveSeconds is 0: it is part of the
// compute time).
//
// Thread safety: as WorkerShard.
#pragma once

namespace specinfer {

// Registers the "cuda" worker backend (programs built with the CUDA backend call it once).
void RegisterCudaWorkerShard();

}  // namespace specinfer
