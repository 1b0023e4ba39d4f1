// An LLM worker: one (pipeline stage, tensor-parallel rank) share of the model
// (dist/worker_shard.h: backend/cpu/shard_runner.h over Gloo, or on a GPU
// backend/cuda/cuda_runner.h over NCCL) behind the gRPC service of proto/llm_worker.proto. The
// request manager's RemoteLlmRunner (dist/llm_client.h) registers it, joins it into a group with
// its peers and sends it every forward pass of the group.
//
// The worker keeps no per-sequence state: every Forward carries the sequences' block tables,
// and its KV storage ([its layers][slot][its KV heads]) is addressed only through them. Every
// request is validated before use (sizes, ranges, block ids within its capacity, mask
// dimensions, ForwardBatch::Validate): a malformed one is answered INVALID_ARGUMENT and the
// worker goes on serving. A collective that fails (a peer died or timed out) is answered
// ABORTED and leaves the worker out of any group until the next Join.
//
// Thread safety: Start/Shutdown/Wait from any thread; the gRPC handlers serialise the forward
// passes (one at a time) internally.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/model.h"
#include "specinfer/status.h"

namespace specinfer {

struct LlmWorkerOptions {
  std::string model_path, tokenizer_path;  // tokenizer: as LoadModelAndTokenizer
  std::string listen = "127.0.0.1:0";      // gRPC host:port (port 0: any free port)
  // The address peers reach this worker's Gloo connections at; empty: the listen host (the
  // machine's hostname when listening on all interfaces).
  std::string collective_host;
  int32_t stage = 0, num_stages = 1, tp_rank = 0, tp_size = 1;
  int32_t num_threads = 0;     // 0: all hardware threads
  int32_t context_length = 0;  // 0: the model's own (shorter saves KV memory)
  int32_t max_sequences = 8;   // KV storage: this many full-context sequences
  int32_t kv_block_size = 16;
  bool dequantize = false;     // float32 copies of its weights
  // Where the share runs (dist/worker_shard.h's registry: "cpu", or "cuda" in programs built
  // with the CUDA backend) and, for a GPU, on which device.
  std::string backend = "cpu";
  int32_t device = 0;
  bool cuda_graphs = true;  // GPU shares: replay CUDA graphs (false: every pass eager)
};

class LlmWorkerServer {
 public:
  // Loads the model (its shard's pages only are read), allocates the KV storage and starts
  // serving. InvalidArgument for a layout the model cannot be split into (more stages than
  // layers, tp not dividing the KV heads); Unavailable if the address cannot be bound.
  static StatusOr<std::unique_ptr<LlmWorkerServer>> Start(const LlmWorkerOptions& options);
  // The same with a model already in memory and its vocabulary fingerprint (tests, embedding);
  // options.model_path, tokenizer_path, context_length and dequantize are ignored.
  static StatusOr<std::unique_ptr<LlmWorkerServer>> Start(const LlmWorkerOptions& options,
                                                          std::shared_ptr<const Model> model,
                                                          uint64_t vocab_fingerprint);
  ~LlmWorkerServer();  // Shutdown()

  int port() const;
  std::string address() const;  // host:port it serves on
  // Blocks until Shutdown.
  void Wait();
  // Stops serving: in-flight calls are cancelled, the Gloo group is closed (peers blocked on
  // this worker see the connection drop). Idempotent.
  void Shutdown();

  class Impl;

 private:
  explicit LlmWorkerServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specinfer
