// RemoteSpeculator: one logical speculator backed by N SSM worker replicas
// (proto/ssm_worker.proto), data-parallel: each sequence's session is pinned to one replica (the
// live one with the fewest sessions), so the replicas share the running sequences.
//
// Registration: Connect() asks every replica for its Info and refuses, with a log line naming the
// worker and the reason, a replica whose vocabulary (size or fingerprint) differs from the LLM's
// or that does not offer the speculator. Unreachable replicas start as down. Connect fails only
// when every replica was refused (a misconfigured deployment).
//
// Faults never fail a request: on an RPC error, a deadline or a malformed answer the replica is
// marked down and the session moves to another live replica, which is sent the sequence's
// committed tokens in full; with no live replica the step's tree is the root alone (plain
// decoding). Greedy output stays identical because the LLM verifies every tree exactly. A
// background thread re-probes down and refused replicas with Info every probe_interval and
// brings them back when they answer (and still match); live ones get a Health call then, and
// one that does not answer is marked down before a request has to find out.
//
// Per step each replica gets one Speculate RPC carrying the items of all the sequences pinned to
// it (BeginBatch; the worker drafts them together, one pass per tree level). The engine starts
// the step's calls at its start (asynchronous) and collects each sequence's item while planning
// the batch, so the replicas work in parallel; a session begun alone (DraftSession::Begin) makes
// its own call, and a retry after a failure is a synchronous call of its own.
//
// Thread safety: sessions are used by one thread at a time (the engine's loop); the replica
// table is shared with the probe thread under a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spec/speculator.h"

namespace specinfer {

struct RemoteSpeculatorOptions {
  std::vector<std::string> replicas;  // host:port of each replica
  std::vector<std::string> labels;    // for logs, one per replica ("ssm[i]" if absent)
  // The spec string requests name it by ("layers:2"); every replica must offer it. Empty: what
  // the first registered replica offers.
  std::string name;
  int32_t vocab_size = 0;             // the LLM's
  uint64_t vocab_fingerprint = 0;     // the LLM's (dist/model_identity.h)
  std::chrono::milliseconds rpc_timeout{5000};
  std::chrono::milliseconds probe_interval{1000};
};

class RemoteSpeculator final : public Speculator {
 public:
  enum class ReplicaState { kLive, kDown, kRefused };

  // InvalidArgument when no replica is given, or when every replica was refused.
  static StatusOr<std::unique_ptr<RemoteSpeculator>> Connect(RemoteSpeculatorOptions options);
  ~RemoteSpeculator() override;  // stops the probe thread; sessions must be gone

  const std::string& name() const override;
  // Never ResourceExhausted: a session without a replica decodes plainly.
  StatusOr<std::unique_ptr<DraftSession>> StartSession() override;
  // One Speculate call per replica carrying the items of all `sessions` pinned to it (the
  // worker drafts them together), sent without waiting; each session's Propose collects its
  // tree. A session of another speculator, or given twice, begins on its own.
  void BeginBatch(std::span<DraftSession* const> sessions,
                  std::span<const DraftContext> contexts) override;

  std::vector<ReplicaState> replica_states() const;
  // Sessions pinned to each replica now.
  std::vector<int32_t> replica_sessions() const;
  int32_t live_replicas() const;
  // Re-probes every replica that is not live now (what the probe thread does periodically).
  void ProbeNow();
  // Tells every live replica to drain (stop taking new sessions).
  void DrainAll();

  struct Impl;

 private:
  explicit RemoteSpeculator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specinfer
