// The in-process stand-in for NCCL: a num_stages x tp_size group whose ranks are threads of one
// process, each with its own device (backend/cuda/device_collective.h's contract). It exists so
// that the sharded CUDA runner, its shard math and its failure paths run on the CPU emulator of
// tests/cuda_emu in CI; on real GPUs of one host it works too (copies between devices through
// unified addressing; pipeline messages staged through host memory), but slowly: NCCL is the
// production path.
//
// How: every operation first waits for its own stream (so its input is ready), then
//   - AllGather: the TP ranks of a stage meet at a barrier with their input pointers, each copies
//     every rank's share into its `out`, and they meet again before anyone may reuse its input;
//   - SendToNextStage copies the data into a host message queued for (stage + 1, same tp rank);
//     RecvFromPrevStage takes the oldest message of its queue (so a sender never waits for its
//     receiver, as with NCCL's buffered sends of small messages).
// Operations return when their copies are done (Synchronize has nothing left to wait for).
// CUDA graphs: on a capturing stream an operation is recorded as a host function
// (cudaLaunchHostFunc) that does the same at every launch of the graph, copying with memcpy,
// since a host function may not call CUDA; so it is capturable() only where the host addresses
// device memory (the emulator: there a TP x PP share's passes run from graphs as they would over
// NCCL), not on a GPU's cudaMalloc memory (graphs stay off there; NCCL captures natively).
// Failures: every wait is bounded by the group's timeout; a timeout or an Abort fails the WHOLE
// group, so every rank's next (or current) wait returns that error at once.
//
// Thread safety: the group and its rank handles may be used from any threads; each rank's handle
// by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/cuda/device_collective.h"

namespace specinfer::cuda {

class ThreadCollectiveGroup {
 public:
  // A group of num_stages x tp_size ranks; every wait lasts at most `timeout`.
  static StatusOr<std::shared_ptr<ThreadCollectiveGroup>> Create(int32_t num_stages,
                                                                 int32_t tp_size,
                                                                 std::chrono::milliseconds timeout);
  ~ThreadCollectiveGroup();

  // The handle of rank (stage, tp_rank), for the thread that runs that rank (it keeps the group
  // alive). InvalidArgument outside the layout.
  StatusOr<std::unique_ptr<DeviceCollective>> Rank(int32_t stage, int32_t tp_rank);

  // Fails the group (as a rank's Abort does).
  void Abort(const Status& why);

  // Ranks of one process that meet by `name` (e.g. an id exchanged through a rendezvous store):
  // the first caller creates the group of `layout`'s shape, the others join it. The name is
  // forgotten when the last handle of its group is gone. InvalidArgument if the group of that
  // name has another shape or this rank's place is taken.
  static StatusOr<std::unique_ptr<DeviceCollective>> JoinNamed(const std::string& name,
                                                               const CollectiveLayout& layout,
                                                               std::chrono::milliseconds timeout);

  struct State;

 private:
  explicit ThreadCollectiveGroup(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace specinfer::cuda
