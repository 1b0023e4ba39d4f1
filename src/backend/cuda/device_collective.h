// What a GPU runner that holds one share of a model needs from its peers: backend/collective.h's
// three collectives, on DEVICE buffers, ordered on a CUDA stream. Two implementations:
//   - NcclCollective (backend/cuda/nccl/nccl_collective.h, built where libnccl is found): one
//     process per GPU, the NCCL unique ids exchanged through a key-value rendezvous store;
//   - ThreadCollectiveGroup (backend/cuda/thread_collective.h, always built): ranks as threads of
//     one process, copies through the CUDA runtime; it is what runs the multi-GPU code on the CPU
//     emulator of tests/cuda_emu (and works, slowly, on real GPUs of one host).
//
// Contract, for every implementation:
//   - An operation is ENQUEUED on `stream` after the work already there (it reads its input when
//     that work is done) and work enqueued after it sees its output. Whether it has finished when
//     the call returns is up to the implementation: call Synchronize before reading on the host.
//   - Every rank of the group makes the same sequence of calls with the same counts.
//   - CUDA graphs: where capturable(), an operation issued while `stream` captures a graph is
//     recorded into it instead of run; it runs at every launch of the graph, in its place there,
//     on the buffers it was recorded with, and its errors show at the next Synchronize. As with
//     NCCL, whether an operation is captured must be the same on every rank that takes part in
//     it (a graph launch is a collective call of those ranks).
//   - Waits are bounded: a peer that fails, calls Abort or never arrives turns into an error
//     Status (Aborted, or DeadlineExceeded after the group's timeout) on the others, never a
//     hang. After any error the group is unusable (its peers' progress is unknown): destroy it
//     and form a new one.
//
// Thread safety: one rank's object is used by one thread at a time; Abort may be called from any
// thread. This header has no CUDA types (CUstream_st* is what cudaStream_t points to).
#pragma once

#include <cstddef>
#include <span>

#include "backend/collective.h"
#include "specinfer/status.h"

struct CUstream_st;

namespace specinfer::cuda {

class DeviceCollective {
 public:
  virtual ~DeviceCollective() = default;

  virtual const CollectiveLayout& layout() const = 0;

  // TP all-gather: `out` receives every TP rank's `in` in rank order, counts[r] floats from rank
  // r (counts.size() == tp_size; this rank sends counts[tp_rank] floats from `in`).
  virtual Status AllGather(const float* in, float* out, std::span<const size_t> counts,
                           CUstream_st* stream) = 0;
  // Pipeline: `count` floats to the same tp rank of the next stage / from the previous one.
  virtual Status SendToNextStage(const float* data, size_t count, CUstream_st* stream) = 0;
  virtual Status RecvFromPrevStage(float* data, size_t count, CUstream_st* stream) = 0;

  // Whether operations can be recorded into a CUDA graph (see the contract above). Called
  // outside any capture (an implementation may probe the device).
  virtual bool capturable() = 0;

  // Waits until everything enqueued on `stream` (these collectives included) has run, at most
  // the group's timeout.
  virtual Status Synchronize(CUstream_st* stream) = 0;

  // Fails the group with `why`: peers waiting in (or later entering) a collective return an error
  // instead of waiting for this rank. A runner calls it when its pass fails part-way.
  virtual void Abort(const Status& why) = 0;
};

}  // namespace specinfer::cuda
