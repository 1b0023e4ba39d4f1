// An Engine bundles what serving one model needs: the model, its tokenizer, a runner on a
// backend (backend/registry.h), the KV cache sized from the runner, and the speculators. The
// CLI, the benchmarks, the servers and the cluster manager build on it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "engine/chat_template.h"
#include "engine/generator.h"
#include "engine/spec_controller.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "spec/speculator.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

struct EngineOptions {
  std::string model_path;
  // Empty: the tokenizer inside the model file (GGUF), or tokenizer.bin beside a llama2.c file.
  std::string tokenizer_path;
  int32_t num_threads = 0;     // 0: all hardware threads
  int32_t context_length = 0;  // 0: the model's own
  int32_t kv_block_size = 16;
  int32_t max_sequences = 1;   // KV storage is sized for this many full-context sequences
  // Called with the fraction (0..1) of weight bytes paged in while loading; null for none.
  std::function<void(double)> load_progress;
  // Converts every weight matrix to float32 at load (4 bytes per weight): full precision, and on
  // a CPU a memory-bound decode where token-tree passes cost little more than one token.
  bool dequantize = false;
  // Speculators to load at start (spec strings, see spec/speculator.h); ngram and layers ones
  // can also be created later by name, model ones only here.
  std::vector<std::string> drafts;
  // Where the model runs: a backend registered under this name (backend/registry.h: "cpu", and
  // "cuda" in builds with the CUDA backend). The runner is created with KV storage for
  // max_sequences full contexts, and the engine's KvCacheManager takes the runner's geometry.
  std::string backend = "cpu";
  // A backend given directly, used in place of `backend` when set: e.g. the cluster manager's
  // group of remote LLM workers (LlmGroupBackend, dist/llm_client.h). A backend that does not
  // read weights gets the loaded model for its configuration only: the weights are then neither
  // paged in here nor dequantized.
  std::optional<Backend> custom_backend;
  // Where model and layers drafts run: a registered backend name, as `backend`. CPU drafts share
  // the engine's threads; layers drafts read the LLM's weights (a GPU one uploads its own copy).
  std::string draft_backend = "cpu";
  // Overrides draft_backend: one name, for every draft, or one per entry of `drafts`, in order
  // (drafts created later by name, GetSpeculator, then run on draft_backend). Any other count is
  // InvalidArgument. The CLI's --draft-backend cuda,cpu.
  std::vector<std::string> draft_backends;
  // GPU backends (the model's and the drafts'): replay decode and tree passes from CUDA graphs
  // (RunnerOptions::cuda_graphs); false: the CLI's --enforce-eager.
  bool cuda_graphs = true;
  // How deep Generate's token trees go (engine/spec_controller.h): auto adapts them per step
  // (one controller for all of this engine's Generate calls), static expands the full shape.
  SpecBudgetMode spec_budget = SpecBudgetMode::kAuto;

  // Builds more speculators once the model and tokenizer are loaded, e.g. RemoteSpeculator over
  // SSM workers. They join after `drafts`, found by name() like them (a name equal to a spec
  // string of `drafts` is refused). Null: none.
  std::function<StatusOr<std::vector<std::unique_ptr<Speculator>>>(
      std::shared_ptr<const Model> model, const Tokenizer& tokenizer)>
      speculator_factory;
};

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);

  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  ModelRunner& runner() { return *runner_; }
  KvCacheManager& kv() { return *kv_; }
  int32_t context_length() const { return model_->config().max_seq_len; }
  // The model's own chat template (Jinja source), empty if it ships none.
  const std::string& chat_template() const { return chat_template_; }

  // Tokens that end generation by default: EOS, and for llama2.c models BOS too (llama2.c uses
  // BOS as the delimiter between stories).
  const std::vector<int32_t>& default_stop_tokens() const { return stop_tokens_; }

  // Encodes a prompt as the model expects (BOS first when the model wants one). An empty prompt
  // is BOS alone.
  StatusOr<std::vector<int32_t>> EncodePrompt(std::string_view text) const;

  // Renders a conversation with the model's chat template (or the built-in one named by
  // `template_name`: chatml, llama2, llama3, gemma; a model without a template whose vocabulary has
  // Gemma's <start_of_turn>/<end_of_turn> special tokens gets gemma) plus the assistant's
  // generation prompt, and encodes it with special tokens parsed. BOS is added only where the
  // model wants one and the template did not write it. The template's end-of-turn tokens that are
  // single special tokens of the vocabulary are appended to *stop_tokens (if not there yet).
  StatusOr<std::vector<int32_t>> EncodeChat(std::span<const ChatMessage> messages,
                                            const std::string& template_name,
                                            std::vector<int32_t>* stop_tokens) const;

  // The speculator named by `spec` (e.g. "ngram:3", "layers:4", "model:PATH"): one loaded at
  // start, or for ngram and layers drafts a new one (kept for later requests). A model draft not
  // loaded at start is FailedPrecondition: loading model files on a client's word is refused.
  StatusOr<Speculator*> GetSpeculator(const std::string& spec);
  // Speculators loaded so far, in load order.
  std::vector<Speculator*> speculators() const;

  // Generates for `request` (its speculators, if any, from GetSpeculator).
  StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                    const TokenCallback& on_token = nullptr);

 private:
  StatusOr<Speculator*> AddSpeculator(const std::string& spec, const std::string& backend);

  std::shared_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<KvCacheManager> kv_;
  std::vector<int32_t> stop_tokens_;
  std::string chat_template_;
  std::shared_ptr<ThreadPool> pool_;
  int32_t max_sequences_ = 1;
  int32_t kv_block_size_ = 16;
  bool cuda_graphs_ = true;
  std::string draft_backend_ = "cpu";
  std::vector<std::unique_ptr<Speculator>> speculators_;
  SpecBudgetMode spec_budget_ = SpecBudgetMode::kAuto;
  std::shared_ptr<SpecController> spec_controller_ = std::make_shared<SpecController>();
};

}  // namespace specinfer
