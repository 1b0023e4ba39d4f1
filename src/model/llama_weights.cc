#include "model/llama_weights.h"

namespace specinfer {

StatusOr<ModelWeights> ReadLlamaWeights(const ModelConfig& c, const LlamaTensorNames& n,
                                        const LlamaTensorReaders& read) {
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), hidden = c.hidden_dim;
  auto name = [](std::string_view s) { return std::string(s); };
  ModelWeights w;
  SI_ASSIGN_OR_RETURN(w.token_embedding, read.matrix(name(n.token_embedding), c.vocab_size, dim));
  SI_ASSIGN_OR_RETURN(w.final_norm, read.vector(name(n.final_norm), dim));
  if (c.tied_output) {
    w.output = w.token_embedding;
  } else {
    SI_ASSIGN_OR_RETURN(w.output, read.matrix(name(n.output), c.vocab_size, dim));
  }
  w.layers.resize(c.n_layers);
  for (int32_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = name(n.layer_prefix) + std::to_string(i) + ".";
    SI_ASSIGN_OR_RETURN(l.attn_norm, read.vector(p + name(n.attn_norm), dim));
    SI_ASSIGN_OR_RETURN(l.wq, read.matrix(p + name(n.wq), q, dim));
    SI_ASSIGN_OR_RETURN(l.wk, read.matrix(p + name(n.wk), kv, dim));
    SI_ASSIGN_OR_RETURN(l.wv, read.matrix(p + name(n.wv), kv, dim));
    SI_ASSIGN_OR_RETURN(l.wo, read.matrix(p + name(n.wo), dim, q));
    if (c.attention_bias) {
      SI_ASSIGN_OR_RETURN(l.bq, read.vector(p + name(n.bq), q));
      SI_ASSIGN_OR_RETURN(l.bk, read.vector(p + name(n.bk), kv));
      SI_ASSIGN_OR_RETURN(l.bv, read.vector(p + name(n.bv), kv));
    }
    if (c.qk_norm) {
      SI_ASSIGN_OR_RETURN(l.q_norm, read.vector(p + name(n.q_norm), c.head_dim));
      SI_ASSIGN_OR_RETURN(l.k_norm, read.vector(p + name(n.k_norm), c.head_dim));
    }
    if (c.post_norms) {
      SI_ASSIGN_OR_RETURN(l.post_attn_norm, read.vector(p + name(n.post_attn_norm), dim));
      SI_ASSIGN_OR_RETURN(l.post_ffn_norm, read.vector(p + name(n.post_ffn_norm), dim));
    }
    SI_ASSIGN_OR_RETURN(l.ffn_norm, read.vector(p + name(n.ffn_norm), dim));
    SI_ASSIGN_OR_RETURN(l.w_gate, read.matrix(p + name(n.w_gate), hidden, dim));
    SI_ASSIGN_OR_RETURN(l.w_up, read.matrix(p + name(n.w_up), hidden, dim));
    SI_ASSIGN_OR_RETURN(l.w_down, read.matrix(p + name(n.w_down), dim, hidden));
  }
  return w;
}

}  // namespace specinfer
