#include "model/random_model.h"

#include <random>

namespace specinfer {

StatusOr<ModelConfig> PresetConfig(const std::string& name) {
  ModelConfig c;
  c.vocab_size = 32000;
  if (name == "stories15M") {
    c.dim = 288, c.hidden_dim = 768, c.n_layers = 6, c.n_heads = 6, c.n_kv_heads = 6;
    c.max_seq_len = 256;
  } else if (name == "stories110M") {
    c.dim = 768, c.hidden_dim = 2048, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 12;
    c.max_seq_len = 1024;
  } else if (name == "smollm2-135m") {
    c.dim = 576, c.hidden_dim = 1536, c.n_layers = 30, c.n_heads = 9, c.n_kv_heads = 3;
    c.vocab_size = 49152, c.max_seq_len = 8192, c.rope_theta = 100000.0f;
  } else {
    return InvalidArgumentError("unknown preset '" + name +
                                "' (stories15M, stories110M, smollm2-135m)");
  }
  c.head_dim = c.dim / c.n_heads;
  return c;
}

StatusOr<std::unique_ptr<Model>> MakeRandomModel(const ModelConfig& c, uint64_t seed) {
  SI_RETURN_IF_ERROR(c.Validate());
  // Build the Model first (with empty weights) so it can own the buffers, then fill them in.
  auto model = std::make_unique<Model>(c, ModelWeights{}, "random:" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  auto matrix = [&](int64_t rows, int64_t cols) {
    float* data = model->AllocateOwned(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) data[i] = normal(rng);
    return WeightMatrix{DType::kF32, rows, cols, data};
  };
  auto ones = [&](int64_t n) {
    float* data = model->AllocateOwned(static_cast<size_t>(n));
    std::fill_n(data, n, 1.0f);
    return WeightVector{data, n};
  };
  ModelWeights w;
  w.token_embedding = matrix(c.vocab_size, c.dim);
  w.layers.resize(c.n_layers);
  for (LayerWeights& l : w.layers) {
    l.attn_norm = ones(c.dim);
    l.wq = matrix(c.q_dim(), c.dim);
    l.wk = matrix(c.kv_dim(), c.dim);
    l.wv = matrix(c.kv_dim(), c.dim);
    l.wo = matrix(c.dim, c.q_dim());
    l.ffn_norm = ones(c.dim);
    l.w_gate = matrix(c.hidden_dim, c.dim);
    l.w_down = matrix(c.dim, c.hidden_dim);
    l.w_up = matrix(c.hidden_dim, c.dim);
  }
  w.final_norm = ones(c.dim);
  w.output = c.tied_output ? w.token_embedding : matrix(c.vocab_size, c.dim);
  model->set_weights(std::move(w));
  return model;
}

}  // namespace specinfer
