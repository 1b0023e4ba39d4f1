// A loaded model: its configuration, its weights (views into mapped files or owned buffers),
// and the files that back them.
//
// Thread safety: immutable after loading; shared read-only by every runner and thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "model/model_config.h"
#include "tensor/weight.h"

namespace specinfer {

struct LayerWeights {
  WeightVector attn_norm;  // [dim]
  WeightMatrix wq;         // [q_dim, dim]
  WeightMatrix wk;         // [kv_dim, dim]
  WeightMatrix wv;         // [kv_dim, dim]
  WeightMatrix wo;         // [dim, q_dim]
  WeightVector bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim]; empty unless attention_bias
  WeightVector q_norm, k_norm;  // [head_dim] each; empty unless qk_norm
  WeightVector post_attn_norm, post_ffn_norm;  // [dim] each; empty unless post_norms
  WeightVector ffn_norm;   // [dim]
  WeightMatrix w_gate;     // [hidden, dim]   (llama2.c w1)
  WeightMatrix w_down;     // [dim, hidden]   (llama2.c w2)
  WeightMatrix w_up;       // [hidden, dim]   (llama2.c w3)
};

struct ModelWeights {
  WeightMatrix token_embedding;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  WeightVector final_norm;       // [dim]
  WeightMatrix output;           // [vocab, dim]; equals token_embedding when tied
};

class Model {
 public:
  Model(ModelConfig config, ModelWeights weights, std::string source)
      : config_(std::move(config)), weights_(std::move(weights)), source_(std::move(source)) {}

  const ModelConfig& config() const { return config_; }
  // Serves with a shorter context than the model's own (saves KV memory).
  void set_context_length(int32_t n) { config_.max_seq_len = n; }
  // For builders that allocate owned buffers through the Model before the weights exist.
  void set_weights(ModelWeights weights) { weights_ = std::move(weights); }
  const ModelWeights& weights() const { return weights_; }
  const std::string& source() const { return source_; }  // path it was loaded from

  // Keeps `file` alive as long as the model (weights point into it).
  void AdoptFile(std::unique_ptr<MappedFile> file) { files_.push_back(std::move(file)); }
  // Keeps an owned buffer alive (converted weights, e.g. norms stored as F16 on disk).
  float* AllocateOwned(size_t count);

  // The first `n_layers` (1 <= n_layers <= base's) layers of `base` with its final norm and
  // output matrix: the self-speculative draft model. Shares base's weights (no copy) and keeps
  // base alive.
  static std::shared_ptr<Model> FirstLayers(std::shared_ptr<const Model> base, int32_t n_layers);

  // Pages every backing file in (see MappedFile::Prefault); progress covers all files, 0..1.
  void Prefault(const std::function<void(double)>& progress) const;

  // Total bytes of weight data.
  size_t WeightBytes() const;

 private:
  ModelConfig config_;
  ModelWeights weights_;
  std::string source_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<std::unique_ptr<float[]>> owned_;
  std::shared_ptr<const Model> base_;  // the model whose weights this one views, if any
};

}  // namespace specinfer
