// The CPU runner on weights that go through the tile kernels (tiled_matrix.h): a token tree of
// 19 nodes (more than one kernel slice of tokens, a slice boundary inside the tree) after a
// 37-token prefix must give every node the logits of decoding its path token by token, bit for
// bit, for Q4_1, Q4_0, Q8_0, Q5_1, Q5_0, F32, F16 and BF16 weights (the output layer included),
// with GQA groups of head size 64 (the grouped attention kernels). This is the property
// speculative verification needs on the default (Q4_1) model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/quants.h"
#include "kv/kv_cache.h"
#include "model/random_model.h"
#include "tensor/half.h"

namespace specinfer {
namespace {

// ggml's reference quantisers for one row (n a multiple of 32).
void QuantizeRow(DType t, const float* x, int64_t n, uint8_t* dst) {
  if (t == DType::kQ8_0) return cpu::scalar::FromFloatQ8_0(x, dst, n);
  if (t == DType::kF32) return static_cast<void>(std::memcpy(dst, x, n * sizeof(float)));
  if (t == DType::kF16 || t == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = t == DType::kF16 ? Fp32ToFp16(x[i]) : Fp32ToBf16(x[i]);
      std::memcpy(dst + 2 * i, &h, 2);
    }
    return;
  }
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    if (t == DType::kQ5_0 || t == DType::kQ5_1) {
      // 5-bit quants q[32], then the GGUF block (nibbles, fifth bits in qh).
      int q[32];
      uint16_t d16, m16 = 0;
      if (t == DType::kQ5_1) {
        const float lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
        const float d = (hi - lo) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        d16 = Fp32ToFp16(d);
        m16 = Fp32ToFp16(lo);
        for (int j = 0; j < 32; ++j) q[j] = std::min(31, static_cast<int>((x[j] - lo) * id + 0.5f));
      } else {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j)
          if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
        const float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        d16 = Fp32ToFp16(d);
        for (int j = 0; j < 32; ++j) q[j] = std::min(31, static_cast<int>(x[j] * id + 16.5f));
      }
      uint32_t qh = 0;
      uint8_t qs[16];
      for (int j = 0; j < 16; ++j) {
        qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        qh |= static_cast<uint32_t>(q[j] >> 4) << j | static_cast<uint32_t>(q[j + 16] >> 4)
                                                          << (j + 16);
      }
      uint8_t* o = dst + b * RowBytes(t, 32);
      std::memcpy(o, &d16, 2);
      if (t == DType::kQ5_1) std::memcpy(o + 2, &m16, 2);
      uint8_t* rest = o + (t == DType::kQ5_1 ? 4 : 2);
      std::memcpy(rest, &qh, 4);
      std::memcpy(rest + 4, qs, 16);
    } else if (t == DType::kQ4_1) {
      const float lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
      const float d = (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      cpu::BlockQ4_1& o = reinterpret_cast<cpu::BlockQ4_1*>(dst)[b];
      o.d = Fp32ToFp16(d);
      o.m = Fp32ToFp16(lo);
      for (int j = 0; j < 16; ++j) {
        const int q0 = std::min(15, static_cast<int>((x[j] - lo) * id + 0.5f));
        const int q1 = std::min(15, static_cast<int>((x[j + 16] - lo) * id + 0.5f));
        o.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
      }
    } else {  // Q4_0
      float amax = 0, max = 0;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
      const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      cpu::BlockQ4_0& o = reinterpret_cast<cpu::BlockQ4_0*>(dst)[b];
      o.d = Fp32ToFp16(d);
      for (int j = 0; j < 16; ++j) {
        const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
        const int q1 = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
        o.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
      }
    }
  }
}

// A random Llama with every matrix (token embedding and output included) quantised to `t`.
std::shared_ptr<Model> QuantizedModel(DType t) {
  ModelConfig c;
  c.dim = 128;
  c.hidden_dim = 256;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 320;
  c.max_seq_len = 256;
  c.tied_output = false;
  auto f = MakeRandomModel(c, 7);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  const ModelWeights& src = (*f)->weights();
  auto m = std::make_shared<Model>(c, ModelWeights{}, "quantised random");
  auto q = [&](const WeightMatrix& w) {
    const size_t row_bytes = RowBytes(t, w.cols);
    uint8_t* data = reinterpret_cast<uint8_t*>(m->AllocateOwned((row_bytes * w.rows + 3) / 4));
    for (int64_t r = 0; r < w.rows; ++r)
      QuantizeRow(t, static_cast<const float*>(w.data) + r * w.cols, w.cols,
                  data + r * row_bytes);
    return WeightMatrix{t, w.rows, w.cols, data};
  };
  auto copy = [&](const WeightVector& v) {
    float* data = m->AllocateOwned(static_cast<size_t>(v.size));
    std::copy_n(v.data, v.size, data);
    return WeightVector{data, v.size};
  };
  ModelWeights w;
  w.token_embedding = q(src.token_embedding);
  for (const LayerWeights& s : src.layers) {
    LayerWeights l;
    l.attn_norm = copy(s.attn_norm);
    l.ffn_norm = copy(s.ffn_norm);
    l.wq = q(s.wq);
    l.wk = q(s.wk);
    l.wv = q(s.wv);
    l.wo = q(s.wo);
    l.w_gate = q(s.w_gate);
    l.w_up = q(s.w_up);
    l.w_down = q(s.w_down);
    w.layers.push_back(l);
  }
  w.final_norm = copy(src.final_norm);
  w.output = q(src.output);
  m->set_weights(std::move(w));
  return m;
}

TEST(CpuRunnerTiles, TreePassEqualsIncrementalDecodingOfEachPath) {
  for (DType t : {DType::kQ4_1, DType::kQ4_0, DType::kQ8_0, DType::kQ5_1, DType::kQ5_0,
                  DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    std::shared_ptr<Model> model = QuantizedModel(t);
    CpuRunnerOptions o;
    o.num_threads = 2;
    o.num_kv_blocks = 32;
    o.kv_block_size = 16;
    auto runner_or = CpuModelRunner::Create(model, o);
    ASSERT_TRUE(runner_or.ok()) << runner_or.status().ToString();
    CpuModelRunner& runner = **runner_or;
    KvCacheManager kv(32, 16);
    const int32_t vocab = model->config().vocab_size;

    std::vector<int32_t> prefix(37);
    for (int32_t i = 0; i < 37; ++i) prefix[i] = (i * 37 + 11) % vocab;
    auto prefill = [&] {
      SeqId s = kv.AddSequence();
      EXPECT_TRUE(kv.Reserve(s, static_cast<int32_t>(prefix.size())).ok());
      std::vector<int32_t> pos(prefix.size());
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
      ForwardBatch b;
      b.AddSequence(s, prefix, pos, 0, nullptr);
      std::vector<float> unused;
      EXPECT_TRUE(runner.Forward(b, kv, unused).ok());
      return s;
    };
    // 19 nodes: a chain of 9 (0..8) with side branches.
    const std::vector<int32_t> parents = {-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 1, 11, 4, 13,
                                          14, 8, 2, 17};
    const int32_t n = static_cast<int32_t>(parents.size());
    std::vector<int32_t> tokens(n);
    for (int32_t i = 0; i < n; ++i) tokens[i] = (i * 53 + 5) % vocab;
    const int32_t P = static_cast<int32_t>(prefix.size());
    SeqId tree_seq = prefill();
    ASSERT_TRUE(kv.Reserve(tree_seq, P + n).ok());
    TreeMask mask = TreeMask::FromParents(parents);
    std::vector<int32_t> pos(n);
    for (int32_t i = 0; i < n; ++i) {
      int32_t depth = 0;
      for (int32_t a = parents[i]; a >= 0; a = parents[a]) ++depth;
      pos[i] = P + depth;
    }
    ForwardBatch b;
    b.AddSequence(tree_seq, tokens, pos, P, &mask);
    for (int32_t i = 0; i < n; ++i) b.logit_rows.push_back(i);
    std::vector<float> tree_logits(static_cast<size_t>(n) * vocab);
    ASSERT_TRUE(runner.Forward(b, kv, tree_logits).ok());
    kv.RemoveSequence(tree_seq);

    for (int32_t i : {0, 3, 8, 10, 12, 16, 18}) {
      std::vector<int32_t> path;
      for (int32_t a = i; a >= 0; a = parents[a]) path.insert(path.begin(), tokens[a]);
      SeqId ref = prefill();
      std::vector<float> logits(vocab);
      for (int32_t tok : path) {
        int32_t p = kv.Length(ref);
        ASSERT_TRUE(kv.Reserve(ref, p + 1).ok());
        ForwardBatch d;
        d.AddSequence(ref, std::span(&tok, 1), std::span(&p, 1), p, nullptr);
        d.logit_rows = {0};
        ASSERT_TRUE(runner.Forward(d, kv, logits).ok());
      }
      kv.RemoveSequence(ref);
      for (int32_t v = 0; v < vocab; ++v)
        ASSERT_EQ(std::memcmp(&tree_logits[static_cast<size_t>(i) * vocab + v], &logits[v], 4), 0)
            << "node " << i << " vocab " << v << ": " << tree_logits[i * vocab + v] << " vs "
            << logits[v];
    }
  }
}

}  // namespace
}  // namespace specinfer
