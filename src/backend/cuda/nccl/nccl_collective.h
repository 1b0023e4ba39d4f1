// The NCCL implementation of backend/cuda/device_collective.h: one process (or thread) per GPU.
// Built only where CMake finds libnccl (SPECINFER_WITH_NCCL); the emulator's builds use
// backend/cuda/thread_collective.h instead.
//
// Like dist/collective.h's Gloo group, a rank at (stage s, tp rank r) of a num_stages x tp_size
// group holds two communicators:
//   - its TP group: the tp_size ranks of stage s (NCCL rank r), for all-gathers, done as one
//     grouped ncclBroadcast per rank so that the shares may differ in size (all-gather-v);
//   - its pipeline link: the num_stages ranks of tp rank r (NCCL rank s), for ncclSend/ncclRecv
//     of a stage's activations to (s + 1, r).
// Their ncclUniqueIds are made by rank 0 of each and exchanged through a RendezvousKv under the
// keys "e<epoch>/nccl/tp<s>" and "e<epoch>/nccl/pp<r>" (an LLM worker's rendezvous table drops
// keys of older epochs, so a group re-formed under a new epoch never reads a stale id).
// Failures: the communicators are non-blocking (ncclConfig_t::blocking = 0), so forming them and
// every wait (Synchronize polls the stream and the communicators' asynchronous errors) end after
// the timeout: the communicators are then aborted (ncclCommAbort) and the error returned; a peer
// that died shows up as NCCL's asynchronous error or as that timeout, never a hang.
//
// Thread safety: one thread at a time, except Abort (any thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "backend/cuda/device_collective.h"

struct ncclComm;

namespace specinfer::cuda {

// Where the unique ids meet: a key-value store with blocking reads (an LLM worker's rendezvous
// table, dist/collective.h, or an in-memory map in tests). Thread-safe.
class RendezvousKv {
 public:
  virtual ~RendezvousKv() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // DeadlineExceeded when `key` does not appear within `timeout`.
  virtual StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

class NcclCollective final : public DeviceCollective {
 public:
  // Forms this rank's communicators on `device` (blocks until every peer has joined; the
  // timeout bounds that and every later wait).
  static StatusOr<std::unique_ptr<NcclCollective>> Create(RendezvousKv& store,
                                                          const CollectiveLayout& layout,
                                                          uint64_t epoch, int device,
                                                          std::chrono::milliseconds timeout);
  ~NcclCollective() override;

  const CollectiveLayout& layout() const override { return layout_; }
  Status AllGather(const float* in, float* out, std::span<const size_t> counts,
                   CUstream_st* stream) override;
  Status SendToNextStage(const float* data, size_t count, CUstream_st* stream) override;
  Status RecvFromPrevStage(float* data, size_t count, CUstream_st* stream) override;
  // NCCL (2.9 and later) records its collectives and point-to-point calls into CUDA graphs; the
  // runner's cudaStreamCaptureModeThreadLocal is the mode NCCL asks for when a capture holds
  // ncclSend/ncclRecv or a process has several threads on GPUs.
  bool capturable() override { return true; }
  Status Synchronize(CUstream_st* stream) override;
  void Abort(const Status& why) override;

 private:
  NcclCollective() = default;
  // Aborts the communicators and records `why` (the first failure wins); returns the recorded
  // failure. Needs mu_.
  Status FailLocked(const Status& why);
  // Waits until `comm`'s last operation has been enqueued (non-blocking communicators).
  Status AwaitLocked(ncclComm* comm, const char* what);

  CollectiveLayout layout_;
  int device_ = 0;
  std::chrono::milliseconds timeout_{30000};
  std::mutex mu_;
  ncclComm* tp_ = nullptr;  // null when tp_size == 1 or after a failure; guarded by mu_
  ncclComm* pp_ = nullptr;  // null when num_stages == 1 or after a failure; guarded by mu_
  Status failed_;           // guarded by mu_
};

}  // namespace specinfer::cuda
