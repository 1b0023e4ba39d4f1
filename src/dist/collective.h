// Collectives of a tensor x pipeline parallel LLM group on CPUs, through Gloo (Debian's
// libgloo-dev, TCP transport): not a protocol of our own.
//
// A worker at (stage s, tp rank r) of a num_stages x tp_size group belongs to two Gloo contexts:
//   - its TP group: the tp_size workers of stage s (rank r), for all-gathers;
//   - its pipeline link: the num_stages workers of tp rank r (rank s), for sending a stage's
//     activations to the next stage (every tp rank of a stage holds the same activations, so
//     (s, r) sends to (s + 1, r) and no broadcast is needed).
// Both are formed through a gloo::rendezvous::Store under the key prefix "e<epoch>/tp<s>/" and
// "e<epoch>/pp<r>/", so a group can be re-formed under a new epoch after a worker restarts
// without stale addresses. GrpcRendezvousStore is that Store over gRPC (StoreSet/StoreGet of
// proto/llm_worker.proto), served by one worker's RendezvousTable: it works across hosts.
//
// Failures: every wait has a timeout; a peer that died (socket closed) or hangs turns into an
// ABORTED Status, never an exception or a hang. (Forming a group sets SIGPIPE to be ignored in
// the process, so that writing to a dead peer is an error and not the end of the process.) After a failure the group is unusable (message
// order on its pairs is unknown): destroy it and Form a new one under a new epoch.
//
// Thread safety: a CollectiveGroup is used by one thread at a time. RendezvousTable and
// GrpcRendezvousStore are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "backend/collective.h"
#include "specinfer/status.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace specinfer {

// The server side of the rendezvous store: keys and values with blocking reads. Keys of the form
// "e<N>/..." of an epoch older than the newest seen are dropped, so the table does not grow
// with re-formations. At most kMaxKeys keys of kMaxValueBytes each.
class RendezvousTable {
 public:
  static constexpr size_t kMaxKeys = 4096;
  static constexpr size_t kMaxValueBytes = 1 << 20;

  Status Set(const std::string& key, std::string value);
  // Waits up to `timeout` for `key`; DeadlineExceeded if it does not appear.
  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;  // guarded by mu_
  uint64_t newest_epoch_ = 0;                  // guarded by mu_
};

// A gloo::rendezvous::Store whose keys live in the RendezvousTable of the LLM worker at
// `address` (host:port). Errors are thrown as gloo::IoException (the Store interface's way);
// CollectiveGroup::Form catches them.
std::unique_ptr<gloo::rendezvous::Store> MakeGrpcRendezvousStore(
    const std::string& address, std::chrono::milliseconds timeout);

// The Gloo implementation of backend/collective.h's interface.
class CollectiveGroup final : public Collective {
 public:
  // Connects this worker's TP group and pipeline link for `epoch` through `store`, listening on
  // `hostname` (an address the peers can reach). Blocks until every peer has connected;
  // ABORTED after `timeout`. `timeout` also bounds every later wait.
  static StatusOr<std::unique_ptr<CollectiveGroup>> Form(gloo::rendezvous::Store& store,
                                                         const std::string& hostname,
                                                         const CollectiveLayout& layout,
                                                         uint64_t epoch,
                                                         std::chrono::milliseconds timeout);
  ~CollectiveGroup() override;

  const CollectiveLayout& layout() const { return layout_; }

  // TP all-gather: `out` receives every TP rank's `in` in rank order, counts[r] floats from rank
  // r (counts.size() == tp_size; this rank sends counts[tp_rank] floats from `in`).
  Status AllGather(const float* in, float* out, std::span<const size_t> counts) override;
  // Pipeline: `count` floats to the same tp rank of the next stage / from the previous one.
  Status SendToNextStage(const float* data, size_t count) override;
  Status RecvFromPrevStage(float* data, size_t count) override;

  // Seconds spent in collectives since the last call (waiting on peers included).
  double TakeSeconds();

 private:
  CollectiveGroup() = default;

  CollectiveLayout layout_;
  std::chrono::milliseconds timeout_{30000};
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> tp_;  // null when tp_size == 1
  std::shared_ptr<gloo::Context> pp_;  // null when num_stages == 1
  double seconds_ = 0;
};

}  // namespace specinfer
