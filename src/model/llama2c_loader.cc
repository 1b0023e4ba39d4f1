#include "model/llama2c_loader.h"

#include <cstdint>

namespace specinfer {

namespace {

struct Header {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadLlama2cCheckpoint(const std::string& path) {
  SI_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  ByteReader reader(file->data(), file->size(), "llama2.c checkpoint '" + path + "'");
  Header h;
  SI_RETURN_IF_ERROR(reader.Read(&h));
  // Before -h.vocab_size below, which is undefined for INT32_MIN.
  if (h.vocab_size == INT32_MIN) return DataLossError("'" + path + "': vocab_size is INT32_MIN");

  ModelConfig c;
  c.architecture = "llama";
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  // A negative vocab_size marks an untied output classifier stored after the legacy blocks.
  c.tied_output = h.vocab_size > 0;
  c.vocab_size = h.vocab_size > 0 ? h.vocab_size : -h.vocab_size;
  c.max_seq_len = h.seq_len;
  c.head_dim = (h.n_heads > 0 && h.dim > 0 && h.dim % h.n_heads == 0) ? h.dim / h.n_heads : 0;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  c.rope_style = RopeStyle::kInterleaved;
  Status valid = c.Validate();
  if (!valid.ok()) return valid.WithContext("'" + path + "'");

  // All sizes below are products of validated int32 values; compute in 64 bits.
  const int64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers, vocab = c.vocab_size;
  const int64_t kv_dim = c.kv_dim(), head = c.head_dim, seq = c.max_seq_len;
  int64_t floats = vocab * dim                               // token embedding
                   + layers * dim * 2                         // rms_att, rms_ffn
                   + layers * dim * dim * 2                   // wq, wo
                   + layers * kv_dim * dim * 2                // wk, wv
                   + layers * hidden * dim * 3                // w1, w2, w3
                   + dim                                      // rms_final
                   + seq * head;                              // legacy freq_cis_real + imag
  if (!c.tied_output) floats += vocab * dim;
  const int64_t need = floats * 4;
  if (static_cast<uint64_t>(need) > reader.remaining()) {
    return DataLossError("llama2.c checkpoint '" + path + "' is truncated: the header (" +
                         c.ToString() + ") needs " + std::to_string(need + sizeof(Header)) +
                         " bytes, the file has " + std::to_string(file->size()));
  }

  const float* p = reinterpret_cast<const float*>(reader.current());
  if (reinterpret_cast<uintptr_t>(p) % alignof(float) != 0)
    return InternalError("unaligned mapping of '" + path + "'");
  auto take = [&p](int64_t n) {
    const float* r = p;
    p += n;
    return r;
  };
  auto matrix = [](const float* data, int64_t rows, int64_t cols) {
    return WeightMatrix{DType::kF32, rows, cols, data};
  };

  ModelWeights w;
  w.layers.resize(layers);
  w.token_embedding = matrix(take(vocab * dim), vocab, dim);
  for (auto& l : w.layers) l.attn_norm = {take(dim), dim};
  for (auto& l : w.layers) l.wq = matrix(take(dim * dim), dim, dim);
  for (auto& l : w.layers) l.wk = matrix(take(kv_dim * dim), kv_dim, dim);
  for (auto& l : w.layers) l.wv = matrix(take(kv_dim * dim), kv_dim, dim);
  for (auto& l : w.layers) l.wo = matrix(take(dim * dim), dim, dim);
  for (auto& l : w.layers) l.ffn_norm = {take(dim), dim};
  for (auto& l : w.layers) l.w_gate = matrix(take(hidden * dim), hidden, dim);
  for (auto& l : w.layers) l.w_down = matrix(take(dim * hidden), dim, hidden);
  for (auto& l : w.layers) l.w_up = matrix(take(hidden * dim), hidden, dim);
  w.final_norm = {take(dim), dim};
  take(seq * head);  // legacy freq_cis_real and freq_cis_imag (RoPE is computed instead)
  w.output = c.tied_output ? w.token_embedding : matrix(take(vocab * dim), vocab, dim);

  auto model = std::make_unique<Model>(c, std::move(w), path);
  model->AdoptFile(std::move(file));
  return model;
}

}  // namespace specinfer
