#include "backend/cuda/nccl/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>
#include <vector>

#include "backend/cuda/device_buffer.h"

namespace specinfer::cuda {

namespace {

using Clock = std::chrono::steady_clock;

Status NcclStatus(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess) return Status::Ok();
  std::string msg = what + ": NCCL " + ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  }
  const StatusCode code =
      r == ncclSystemError || r == ncclRemoteError ? StatusCode::kAborted : StatusCode::kInternal;
  return Status(code, msg);
}

// Polls `done` (true: finished; an error: failed) until the deadline: spins for the first
// millisecond (collectives of a decode step take microseconds), then sleeps between polls.
template <typename Poll>
Status PollUntil(Clock::time_point deadline, const char* what, std::chrono::milliseconds timeout,
                 Poll poll) {
  const Clock::time_point start = Clock::now();
  for (;;) {
    StatusOr<bool> done = poll();
    if (!done.ok()) return done.status();
    if (*done) return Status::Ok();
    const Clock::time_point now = Clock::now();
    if (now >= deadline)
      return Status(StatusCode::kDeadlineExceeded, std::string(what) + ": no progress within " +
                                                       std::to_string(timeout.count()) + " ms");
    if (now - start < std::chrono::milliseconds(1))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Makes (rank 0) or fetches the unique id under `key` and starts a non-blocking communicator.
StatusOr<ncclComm_t> StartComm(RendezvousKv& store, const std::string& key, int nranks, int rank,
                               std::chrono::milliseconds timeout) {
  ncclUniqueId id;
  if (rank == 0) {
    SI_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
    SI_RETURN_IF_ERROR(store.Set(key, std::string(id.internal, NCCL_UNIQUE_ID_BYTES)));
  } else {
    SI_ASSIGN_OR_RETURN(std::string v, store.Get(key, timeout));
    if (v.size() != NCCL_UNIQUE_ID_BYTES)
      return InvalidArgumentError("rendezvous key " + key + " does not hold an NCCL unique id");
    std::memcpy(id.internal, v.data(), NCCL_UNIQUE_ID_BYTES);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclStatus(r, nullptr, "ncclCommInitRankConfig (" + key + ")");
  }
  return comm;
}

}  // namespace

StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Create(
    RendezvousKv& store, const CollectiveLayout& layout, uint64_t epoch, int device,
    std::chrono::milliseconds timeout) {
  if (layout.num_stages < 1 || layout.tp_size < 1 || layout.stage < 0 ||
      layout.stage >= layout.num_stages || layout.tp_rank < 0 || layout.tp_rank >= layout.tp_size)
    return InvalidArgumentError("stage/tp rank outside the group layout");
  if (timeout.count() <= 0) return InvalidArgumentError("an NCCL group needs a timeout");
  std::unique_ptr<NcclCollective> c(new NcclCollective());
  c->layout_ = layout;
  c->device_ = device;
  c->timeout_ = timeout;
  SI_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  std::string prefix = "e";  // (not "e" + ...: GCC 12 warns falsely about that, -Wrestrict)
  prefix += std::to_string(epoch) + "/nccl/";
  std::lock_guard<std::mutex> lock(c->mu_);
  if (layout.tp_size > 1) {
    SI_ASSIGN_OR_RETURN(c->tp_, StartComm(store, prefix + "tp" + std::to_string(layout.stage),
                                          layout.tp_size, layout.tp_rank, timeout));
  }
  if (layout.num_stages > 1) {
    auto pp = StartComm(store, prefix + "pp" + std::to_string(layout.tp_rank), layout.num_stages,
                        layout.stage, timeout);
    if (!pp.ok()) return c->FailLocked(pp.status());  // aborts the TP communicator
    c->pp_ = *pp;
  }
  // Both communicators were started without blocking: wait for them together.
  if (c->tp_) SI_RETURN_IF_ERROR(c->AwaitLocked(c->tp_, "forming the TP group"));
  if (c->pp_) SI_RETURN_IF_ERROR(c->AwaitLocked(c->pp_, "forming the pipeline link"));
  return c;
}

NcclCollective::~NcclCollective() {
  std::lock_guard<std::mutex> lock(mu_);
  // Destroy is local (Finalize would talk to the peers, which may be gone).
  if (tp_) ncclCommDestroy(tp_);
  if (pp_) ncclCommDestroy(pp_);
}

Status NcclCollective::FailLocked(const Status& why) {
  if (failed_.ok()) failed_ = why;
  if (tp_) ncclCommAbort(tp_);
  if (pp_) ncclCommAbort(pp_);
  tp_ = pp_ = nullptr;
  return failed_;
}

Status NcclCollective::AwaitLocked(ncclComm* comm, const char* what) {
  const Clock::time_point deadline = Clock::now() + timeout_;
  Status s = PollUntil(deadline, what, timeout_, [&]() -> StatusOr<bool> {
    ncclResult_t state = ncclSuccess;
    SI_RETURN_IF_ERROR(NcclStatus(ncclCommGetAsyncError(comm, &state), comm, what));
    if (state == ncclInProgress) return false;
    SI_RETURN_IF_ERROR(NcclStatus(state, comm, what));
    return true;
  });
  if (!s.ok()) return FailLocked(s);
  return s;
}

void NcclCollective::Abort(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  (void)FailLocked(Status(StatusCode::kAborted, "NCCL group aborted: " + why.ToString()));
}

Status NcclCollective::AllGather(const float* in, float* out, std::span<const size_t> counts,
                                 CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  if (counts.size() != static_cast<size_t>(layout_.tp_size))
    return FailLocked(InternalError("all-gather: one count per TP rank"));
  if (layout_.tp_size == 1)
    return CudaStatus(
        cudaMemcpyAsync(out, in, counts[0] * sizeof(float), cudaMemcpyDeviceToDevice, stream),
        "all-gather copy");
  // All-gather-v: every rank broadcasts its share into its place of `out`.
  Status s = NcclStatus(ncclGroupStart(), tp_, "ncclGroupStart");
  size_t off = 0;
  for (int r = 0; r < layout_.tp_size && s.ok(); ++r) {
    const size_t n = counts[static_cast<size_t>(r)];
    const ncclResult_t res =
        ncclBroadcast(r == layout_.tp_rank ? static_cast<const void*>(in) : out + off, out + off, n,
                      ncclFloat, r, tp_, stream);
    if (res != ncclSuccess && res != ncclInProgress) s = NcclStatus(res, tp_, "ncclBroadcast");
    off += n;
  }
  const ncclResult_t end = ncclGroupEnd();
  if (!s.ok()) return FailLocked(s);
  if (end != ncclSuccess && end != ncclInProgress)
    return FailLocked(NcclStatus(end, tp_, "all-gather"));
  return end == ncclInProgress ? AwaitLocked(tp_, "all-gather") : Status::Ok();
}

Status NcclCollective::SendToNextStage(const float* data, size_t count, CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  if (pp_ == nullptr || layout_.stage + 1 >= layout_.num_stages)
    return FailLocked(InternalError("send from the last pipeline stage"));
  const ncclResult_t r = ncclSend(data, count, ncclFloat, layout_.stage + 1, pp_, stream);
  if (r == ncclInProgress) return AwaitLocked(pp_, "pipeline send");
  if (r != ncclSuccess) return FailLocked(NcclStatus(r, pp_, "ncclSend"));
  return Status::Ok();
}

Status NcclCollective::RecvFromPrevStage(float* data, size_t count, CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  if (pp_ == nullptr || layout_.stage == 0)
    return FailLocked(InternalError("receive on the first pipeline stage"));
  const ncclResult_t r = ncclRecv(data, count, ncclFloat, layout_.stage - 1, pp_, stream);
  if (r == ncclInProgress) return AwaitLocked(pp_, "pipeline receive");
  if (r != ncclSuccess) return FailLocked(NcclStatus(r, pp_, "ncclRecv"));
  return Status::Ok();
}

Status NcclCollective::Synchronize(CUstream_st* stream) {
  const Clock::time_point deadline = Clock::now() + timeout_;
  Status s = PollUntil(
      deadline, "waiting for the GPU and the NCCL group", timeout_, [&]() -> StatusOr<bool> {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return true;
        if (e != cudaErrorNotReady) return CudaStatus(e, "stream");
        std::lock_guard<std::mutex> lock(mu_);
        if (!failed_.ok()) return failed_;
        for (ncclComm* comm : {tp_, pp_}) {
          if (comm == nullptr) continue;
          ncclResult_t state = ncclSuccess;
          SI_RETURN_IF_ERROR(NcclStatus(ncclCommGetAsyncError(comm, &state), comm, "NCCL"));
          if (state != ncclSuccess && state != ncclInProgress)
            return NcclStatus(state, comm, "NCCL");
        }
        return false;
      });
  std::lock_guard<std::mutex> lock(mu_);
  if (!s.ok()) return FailLocked(s);
  return failed_;
}

}  // namespace specinfer::cuda
