#include "model/dequantize.h"

#include <algorithm>
#include <string>

#include "backend/cpu/matmul.h"

namespace specinfer {

StatusOr<std::unique_ptr<Model>> DequantizeToF32(const Model& m) {
  const ModelWeights& src = m.weights();
  auto out = std::make_unique<Model>(m.config(), ModelWeights{}, m.source() + " (f32)");

  auto matrix = [&](const WeightMatrix& w, const char* name) -> StatusOr<WeightMatrix> {
    if (w.empty()) return WeightMatrix{DType::kF32, w.rows, w.cols, nullptr};
    if (!cpu::SupportsType(w.type))
      return InvalidArgumentError(std::string("cannot dequantise ") + name + " of type " +
                                  std::string(DTypeName(w.type)));
    float* data = out->AllocateOwned(static_cast<size_t>(w.rows * w.cols));
    for (int64_t r = 0; r < w.rows; ++r) cpu::GetRow(w, r, data + r * w.cols);
    return WeightMatrix{DType::kF32, w.rows, w.cols, data};
  };
  auto vector = [&](const WeightVector& v) {
    if (v.data == nullptr || v.size == 0) return WeightVector{};
    float* data = out->AllocateOwned(static_cast<size_t>(v.size));
    std::copy_n(v.data, v.size, data);
    return WeightVector{data, v.size};
  };

  ModelWeights w;
  SI_ASSIGN_OR_RETURN(w.token_embedding, matrix(src.token_embedding, "token_embedding"));
  w.layers.resize(src.layers.size());
  for (size_t i = 0; i < src.layers.size(); ++i) {
    const LayerWeights& s = src.layers[i];
    LayerWeights& d = w.layers[i];
    d.attn_norm = vector(s.attn_norm);
    SI_ASSIGN_OR_RETURN(d.wq, matrix(s.wq, "wq"));
    SI_ASSIGN_OR_RETURN(d.wk, matrix(s.wk, "wk"));
    SI_ASSIGN_OR_RETURN(d.wv, matrix(s.wv, "wv"));
    SI_ASSIGN_OR_RETURN(d.wo, matrix(s.wo, "wo"));
    d.bq = vector(s.bq);
    d.bk = vector(s.bk);
    d.bv = vector(s.bv);
    d.q_norm = vector(s.q_norm);
    d.k_norm = vector(s.k_norm);
    d.post_attn_norm = vector(s.post_attn_norm);
    d.post_ffn_norm = vector(s.post_ffn_norm);
    d.ffn_norm = vector(s.ffn_norm);
    SI_ASSIGN_OR_RETURN(d.w_gate, matrix(s.w_gate, "w_gate"));
    SI_ASSIGN_OR_RETURN(d.w_down, matrix(s.w_down, "w_down"));
    SI_ASSIGN_OR_RETURN(d.w_up, matrix(s.w_up, "w_up"));
  }
  w.final_norm = vector(src.final_norm);
  if (src.output.data == src.token_embedding.data) {
    w.output = w.token_embedding;  // tied: stays shared
  } else {
    SI_ASSIGN_OR_RETURN(w.output, matrix(src.output, "output"));
  }
  out->set_weights(std::move(w));
  return out;
}

}  // namespace specinfer
