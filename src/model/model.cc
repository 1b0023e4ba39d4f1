#include "model/model.h"

namespace specinfer {

float* Model::AllocateOwned(size_t count) {
  owned_.push_back(std::make_unique<float[]>(count));
  return owned_.back().get();
}

void Model::Prefault(const std::function<void(double)>& progress) const {
  size_t total = 0, done = 0;
  for (const auto& f : files_) total += f->size();
  for (const auto& f : files_) {
    f->Prefault([&](double frac) {
      if (progress) progress(static_cast<double>(done + frac * f->size()) / total);
    });
    done += f->size();
  }
}

std::shared_ptr<Model> Model::FirstLayers(std::shared_ptr<const Model> base, int32_t n_layers) {
  ModelConfig config = base->config();
  config.n_layers = n_layers;
  if (!config.sliding_layers.empty()) config.sliding_layers.resize(static_cast<size_t>(n_layers));
  ModelWeights weights = base->weights();
  weights.layers.resize(static_cast<size_t>(n_layers));
  auto view = std::make_shared<Model>(std::move(config), std::move(weights),
                                      base->source() + " (first " + std::to_string(n_layers) +
                                          " layers)");
  view->base_ = std::move(base);
  return view;
}

static size_t MatrixBytes(const WeightMatrix& m) {
  return m.empty() ? 0 : static_cast<size_t>(m.rows) * RowBytes(m.type, m.cols);
}

size_t Model::WeightBytes() const {
  size_t total = MatrixBytes(weights_.token_embedding);
  if (weights_.output.data != weights_.token_embedding.data) total += MatrixBytes(weights_.output);
  for (const LayerWeights& l : weights_.layers) {
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_down, &l.w_up})
      total += MatrixBytes(*m);
    total += (l.attn_norm.size + l.ffn_norm.size + l.bq.size + l.bk.size + l.bv.size +
              l.q_norm.size + l.k_norm.size + l.post_attn_norm.size + l.post_ffn_norm.size) * 4;
  }
  return total + weights_.final_norm.size * 4;
}

}  // namespace specinfer
