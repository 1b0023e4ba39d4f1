// The backend registry: where a model runs, by name. A backend is a factory that creates a
// ModelRunner (backend/backend.h) for a model, with KV storage for the capacity asked for:
//   "cpu"   the CPU backend (backend/cpu), registered by the core library itself;
//   "cuda"  the CUDA backend (backend/cuda), registered by the CUDA library
//           (cuda::RegisterCudaBackend, which programs built with it call at start), on the
//           device RunnerOptions::device names.
// A backend that is not global (the cluster manager's group of remote LLM workers,
// dist/llm_client.h, whose factory holds the workers' addresses) is a Backend value passed
// where a runner is created (EngineOptions::custom_backend) instead of a registered name.
//
// Users (the engine for its LLM, the speculators for draft models) create runners through
// CreateRunner and then size their KvCacheManager from what the runner reports
// (ModelRunner::num_kv_blocks, kv_block_size), never from what they asked for.
//
// Thread safety: every function may be called from any thread (programs register at start).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "specinfer/status.h"

namespace specinfer {

class ThreadPool;
class Tokenizer;

// What a runner is created for. A backend uses the fields that concern it.
struct RunnerOptions {
  // KV capacity wanted: num_kv_blocks blocks of kv_block_size positions. A runner reports what
  // it got (normally exactly this; a remote group refuses more than its workers hold).
  int32_t num_kv_blocks = 0;
  int32_t kv_block_size = 16;
  // CPU: threads shared with other runners that take turns with this one (an LLM and its draft
  // models); null: a pool of num_threads of its own (0: all hardware threads).
  std::shared_ptr<ThreadPool> pool;
  int32_t num_threads = 0;
  // The model's tokenizer, for backends that check that their peers serve the same vocabulary
  // (remote workers); may be null for the others. Not kept after the factory returns.
  const Tokenizer* tokenizer = nullptr;
  // GPU backends: which device (the others ignore it).
  int32_t device = 0;
  // GPU backends: replay decode and token-tree passes from CUDA graphs; false launches every
  // kernel of every pass (the CLI's --enforce-eager).
  bool cuda_graphs = true;
};

using RunnerFactory = std::function<StatusOr<std::unique_ptr<ModelRunner>>(
    std::shared_ptr<const Model> model, const RunnerOptions& options)>;

struct Backend {
  std::string name;
  RunnerFactory create;
  // True: the runner reads the model's weights in this process (the loader pages them in first,
  // and may convert them to float32). False: only the model's configuration is used (a remote
  // group: the weights stay on the workers).
  bool reads_weights = true;
};

// Adds `backend`, replacing one of the same name. Programs call it at start.
void RegisterBackend(Backend backend);

// The backend registered as `name`. FailedPrecondition for "cuda" in a build without the CUDA
// backend (saying so); InvalidArgument, listing the registered names, for any other unknown name.
StatusOr<Backend> FindBackend(std::string_view name);

// Registered names, sorted ("cpu" always among them).
std::vector<std::string> BackendNames();

// Creates a runner with `backend` (errors of the factory pass through; a factory that returns
// no runner is Internal).
StatusOr<std::unique_ptr<ModelRunner>> CreateRunner(const Backend& backend,
                                                    std::shared_ptr<const Model> model,
                                                    const RunnerOptions& options);
// The same by registered name (FindBackend's errors for an unknown one).
StatusOr<std::unique_ptr<ModelRunner>> CreateRunner(std::string_view backend,
                                                    std::shared_ptr<const Model> model,
                                                    const RunnerOptions& options);

}  // namespace specinfer
