// The K-quant routines (src/backend/cpu/quants_k*.cc) against the Python gguf package
// (tests/reference/make_kquant_vectors.py, data in tests/data/kquant): dequantisation, Q8_K
// activation quantisation and the dot products bit for bit with every kernel set, the
// multi-token kernels bit-identical to the single-token ones, and K-quant matrix products
// batch-invariant.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "backend/cpu/matmul.h"
#include "backend/cpu/quants_k.h"
#include "model/gguf.h"
#include "quant_random.h"
#include "quant_vectors.h"
#include "tensor/half.h"

namespace specinfer {
namespace {

using testing::AvailableIsas;
using testing::IsaName;
using testing::QuantVectors;

const DType kKTypes[] = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

bool LoadKQuantVectors(QuantVectors* v) {
  std::ifstream idx(testing::SourcePath("tests/data/kquant/index.json"));
  std::ifstream bin(testing::SourcePath("tests/data/kquant/vectors.bin"), std::ios::binary);
  if (!idx || !bin) {
    ADD_FAILURE() << "tests/data/kquant is missing; run tests/reference/make_kquant_vectors.py";
    return false;
  }
  v->index = nlohmann::json::parse(idx);
  std::ostringstream ss;
  ss << bin.rdbuf();
  v->blob = ss.str();
  return true;
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

using testing::HalfFields;
using testing::RandomKRow;

TEST(KQuantTest, BlockStructsMatchDTypeTraits) {
  EXPECT_EQ(sizeof(cpu::BlockQ2_K), size_t(GetDTypeTraits(DType::kQ2_K).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ3_K), size_t(GetDTypeTraits(DType::kQ3_K).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ4_K), size_t(GetDTypeTraits(DType::kQ4_K).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ5_K), size_t(GetDTypeTraits(DType::kQ5_K).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ6_K), size_t(GetDTypeTraits(DType::kQ6_K).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ8_K), size_t(GetDTypeTraits(DType::kQ8_K).block_bytes));
  for (DType t : kKTypes) {
    for (cpu::KernelIsa isa : AvailableIsas()) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      ASSERT_NE(ops, nullptr) << DTypeName(t) << " " << IsaName(isa);
      EXPECT_EQ(ops->vec_dot_type, DType::kQ8_K);
      EXPECT_NE(ops->to_float, nullptr);
      EXPECT_NE(ops->vec_dot, nullptr);
    }
  }
}

TEST(KQuantTest, ToFloatMatchesPythonGguf) {
  QuantVectors v;
  if (!LoadKQuantVectors(&v)) return;
  int checked = 0;
  for (const auto& c : v.index["cases"]) {
    if (c["kind"] != "to_float") continue;
    const std::string name = c["name"];
    const std::optional<DType> t = DTypeFromGgmlType(c["ggml_type"].get<uint32_t>());
    ASSERT_TRUE(t.has_value()) << name;
    const int64_t n = c["n"];
    const std::vector<uint8_t> raw = v.Bytes(c, "raw");
    const std::vector<float> want = v.Array<float>(c, "expected");
    ASSERT_EQ(raw.size(), RowBytes(*t, n)) << name;
    for (cpu::KernelIsa isa : AvailableIsas()) {
      std::vector<uint8_t> src(raw.size() + 2);  // only the blocks' own 2-byte alignment
      std::memcpy(src.data() + 2, raw.data(), raw.size());
      std::vector<float> got(n);
      cpu::GetTypeOpsForIsa(*t, isa)->to_float(src.data() + 2, got.data(), n);
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (Bits(got[i]) != Bits(want[i]) && bad++ < 3) {
          ADD_FAILURE() << name << " (" << IsaName(isa) << ") element " << i << ": got "
                        << got[i] << ", want " << want[i];
        }
      }
      EXPECT_EQ(bad, 0) << name;
      ++checked;
    }
  }
  EXPECT_GE(checked, 5);
}

TEST(KQuantTest, Q8KQuantizationMatchesLlamaCppReference) {
  QuantVectors v;
  if (!LoadKQuantVectors(&v)) return;
  int checked = 0;
  for (const auto& c : v.index["cases"]) {
    if (c["kind"] != "quantize") continue;
    const int64_t n = c["n"];
    const std::vector<float> x = v.Array<float>(c, "input");
    const std::vector<uint8_t> want = v.Bytes(c, "expected");
    ASSERT_EQ(want.size(), RowBytes(DType::kQ8_K, n));
    for (cpu::KernelIsa isa : AvailableIsas()) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(DType::kQ8_K, isa);
      std::vector<uint8_t> got(want.size(), 0xAB);
      ops->from_float(x.data(), got.data(), n);
      for (size_t b = 0; b < want.size() / sizeof(cpu::BlockQ8_K); ++b) {
        const size_t off = b * sizeof(cpu::BlockQ8_K);
        EXPECT_EQ(std::memcmp(got.data() + off, want.data() + off, sizeof(cpu::BlockQ8_K)), 0)
            << IsaName(isa) << ": block " << b << " differs";
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 1);
}

// The dot products, single- and multi-token, equal the reference's float32 steps bit for bit,
// and the reference agrees with the float64 dot of gguf-py's dequantised weights.
TEST(KQuantTest, VecDotMatchesReferenceBitForBit) {
  QuantVectors v;
  if (!LoadKQuantVectors(&v)) return;
  int checked = 0;
  for (const auto& c : v.index["cases"]) {
    if (c["kind"] != "vec_dot") continue;
    const std::string name = c["name"];
    const DType t = *DTypeFromGgmlType(c["ggml_type"].get<uint32_t>());
    const int64_t n = c["n"];
    const int rows = c["rows"];
    const std::vector<uint8_t> w = v.Bytes(c, "w");
    const std::vector<uint8_t> x = v.Bytes(c, "x");
    const std::vector<float> want = v.Array<float>(c, "expected");
    const std::vector<double> want64 = v.Array<double>(c, "expected_f64");
    ASSERT_EQ(w.size(), RowBytes(t, n));
    ASSERT_EQ(x.size(), RowBytes(DType::kQ8_K, n) * rows);
    ASSERT_EQ(want.size(), size_t(rows));
    const size_t stride = RowBytes(DType::kQ8_K, n);
    for (int r = 0; r < rows; ++r) {
      EXPECT_NEAR(want[r], want64[r], 1e-5 * std::fabs(want64[r]) + 1e-6) << name;
    }
    for (cpu::KernelIsa isa : AvailableIsas()) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      for (int r = 0; r < rows; ++r) {
        const float got = ops->vec_dot(n, w.data(), x.data() + r * stride);
        EXPECT_EQ(Bits(got), Bits(want[r]))
            << name << " (" << IsaName(isa) << ") row " << r << ": got " << got << ", want "
            << want[r];
      }
      if (ops->vec_dot_multi != nullptr) {
        for (int count = 1; count <= cpu::kMaxMultiDot; ++count) {
          for (int first = 0; first + count <= rows; ++first) {
            float out[cpu::kMaxMultiDot];
            ops->vec_dot_multi(n, w.data(), x.data() + first * stride, stride, count, out);
            for (int k = 0; k < count; ++k) {
              EXPECT_EQ(Bits(out[k]), Bits(want[first + k]))
                  << name << " multi (" << IsaName(isa) << ") count " << count << " row "
                  << first + k;
            }
          }
        }
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 5);
}

// Random rows, longer than the vectors: every kernel set and the multi-token kernels agree bit
// for bit, including extreme quants (all bits set) and extreme activations.
TEST(KQuantTest, KernelSetsAgreeOnRandomRows) {
  std::mt19937 rng(4242);
  const int64_t n = 256 * 11;
  for (DType t : kKTypes) {
    for (int pattern = 0; pattern < 3; ++pattern) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " pattern " + std::to_string(pattern));
      std::vector<uint8_t> w = RandomKRow(t, n, rng);
      if (pattern > 0) {  // all quant and scale bits 1 (or 0x80), keeping the fp16 fields
        const size_t bb = GetDTypeTraits(t).block_bytes;
        for (size_t i = 0; i < w.size(); ++i) {
          bool half = false;
          for (size_t f : HalfFields(t)) half = half || (i % bb == f || i % bb == f + 1);
          if (!half) w[i] = pattern == 1 ? 0xFF : 0x80;
        }
      }
      std::vector<float> xs[4];
      std::vector<uint8_t> xq(RowBytes(DType::kQ8_K, n) * 4);
      const size_t stride = RowBytes(DType::kQ8_K, n);
      for (int r = 0; r < 4; ++r) {
        xs[r] = testing::RandomActivations(n, rng);
        if (pattern == 2) for (float& f : xs[r]) f = f < 0 ? -100.0f : 100.0f;
        cpu::scalar::FromFloatQ8_K(xs[r].data(), xq.data() + r * stride, n);
      }
      for (int r = 0; r < 4; ++r) {
        const float ref = cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar)
                              ->vec_dot(n, w.data(), xq.data() + r * stride);
        // The dequantised dot, in double, as a sanity bound on the definition.
        std::vector<float> wf(n), xf(n);
        cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar)->to_float(w.data(), wf.data(), n);
        cpu::scalar::ToFloatQ8_K(xq.data() + r * stride, xf.data(), n);
        double exact = 0, abs_terms = 0;
        for (int64_t i = 0; i < n; ++i) {
          exact += double(wf[i]) * xf[i];
          abs_terms += std::fabs(double(wf[i]) * xf[i]);
        }
        EXPECT_NEAR(ref, exact, 1e-5 * abs_terms + 1e-6);
        for (cpu::KernelIsa isa : AvailableIsas()) {
          const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
          EXPECT_EQ(Bits(ops->vec_dot(n, w.data(), xq.data() + r * stride)), Bits(ref))
              << IsaName(isa);
          if (ops->vec_dot_multi != nullptr) {
            float out[4];
            ops->vec_dot_multi(n, w.data(), xq.data(), stride, 4, out);
            EXPECT_EQ(Bits(out[r]), Bits(ref)) << IsaName(isa) << " multi";
          }
        }
      }
    }
  }
}

// A K-quant matrix product: each token's outputs are the same bits whatever else is in the
// batch (the property that makes speculative greedy decoding equal incremental decoding).
TEST(KQuantTest, MatMulIsBatchInvariant) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  std::vector<uint8_t> scratch;
  for (DType t : kKTypes) {
    SCOPED_TRACE(DTypeName(t));
    const int64_t rows = 37, cols = 512;
    std::vector<uint8_t> data;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<uint8_t> row = RandomKRow(t, cols, rng);
      data.insert(data.end(), row.begin(), row.end());
    }
    const WeightMatrix w{t, rows, cols, data.data()};
    const int64_t n = 7;
    std::vector<float> x;
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<float> xi = testing::RandomActivations(cols, rng);
      x.insert(x.end(), xi.begin(), xi.end());
    }
    std::vector<float> y(n * rows), y1(rows);
    const cpu::CpuMatrix cw{w, nullptr};  // K-quants have no tiles: the per-row kernels
    cpu::MatMul(cw, x.data(), n, y.data(), pool, scratch);
    for (int64_t i = 0; i < n; ++i) {
      cpu::MatMul(cw, x.data() + i * cols, 1, y1.data(), pool, scratch);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(Bits(y[i * rows + r]), Bits(y1[r])) << "token " << i << " row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace specinfer

#include "backend/cpu/cpu_runner.h"
#include "kv/kv_cache.h"
#include "model/random_model.h"

namespace specinfer {
namespace {

// A whole model with K-quant weights (every K type somewhere, Gemma 3 switches on): one prompt
// pass (multi-token kernels) and decoding the same tokens one at a time (single-token kernels)
// give the same logits bit for bit, the property speculative greedy decoding relies on.
TEST(KQuantTest, PromptPassEqualsIncrementalDecoding) {
  ModelConfig c;
  c.architecture = "gemma3";
  c.dim = 256;
  c.hidden_dim = 512;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 64;
  c.max_seq_len = 64;
  c.rope_style = RopeStyle::kHalf;
  c.ffn_activation = FfnActivation::kGeluTanh;
  c.qk_norm = true;
  c.post_norms = true;
  c.embedding_scale = 16.0f;
  c.sliding_window = 3;
  c.sliding_layers = {1, 0, 1};
  c.rope_theta_local = 100.0f;
  ASSERT_TRUE(c.Validate().ok());
  auto base = MakeRandomModel(c, 5);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  ModelWeights w = (*base)->weights();
  std::mt19937 rng(11);
  std::vector<std::vector<uint8_t>> storage;
  int k = 0;
  auto requant = [&](WeightMatrix& m) {
    const DType t = kKTypes[k++ % 5];
    storage.emplace_back();
    for (int64_t r = 0; r < m.rows; ++r) {
      const std::vector<uint8_t> row = RandomKRow(t, m.cols, rng);
      storage.back().insert(storage.back().end(), row.begin(), row.end());
    }
    m = WeightMatrix{t, m.rows, m.cols, storage.back().data()};
  };
  // Every norm gain is needed by the switches: reuse attn_norm's (ones, head_dim of them fit).
  for (LayerWeights& l : w.layers) {
    for (WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) requant(*m);
    l.q_norm = l.k_norm = WeightVector{l.attn_norm.data, c.head_dim};
    l.post_attn_norm = l.post_ffn_norm = l.attn_norm;
  }
  w.output = w.token_embedding;
  auto model = std::make_shared<Model>(c, w, "k-quant random");

  CpuRunnerOptions o;
  o.num_threads = 2;
  o.kv_block_size = 4;
  o.num_kv_blocks = 8;
  auto runner = CpuModelRunner::Create(model, o);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  KvCacheManager kv(o.num_kv_blocks, o.kv_block_size);
  const std::vector<int32_t> tokens = {1, 7, 33, 2, 60, 9, 9, 41, 5};
  const int32_t n = static_cast<int32_t>(tokens.size());
  std::vector<int32_t> rows(n);
  for (int32_t i = 0; i < n; ++i) rows[i] = i;
  const std::vector<float> all = testing::PromptLogits(**runner, kv, tokens, rows);
  ASSERT_EQ(all.size(), size_t(n) * c.vocab_size);
  SeqId s = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(s, n).ok());
  std::vector<float> step(c.vocab_size);
  for (int32_t i = 0; i < n; ++i) {
    ForwardBatch b;
    const std::vector<int32_t> tok = {tokens[i]}, pos = {i};
    b.AddSequence(s, tok, pos, i, nullptr);
    b.logit_rows = {0};
    ASSERT_TRUE((*runner)->Forward(b, kv, step).ok());
    for (int32_t v = 0; v < c.vocab_size; ++v) {
      ASSERT_TRUE(std::isfinite(step[v]));
      ASSERT_EQ(Bits(step[v]), Bits(all[i * c.vocab_size + v])) << "step " << i << " token " << v;
    }
  }
}

}  // namespace
}  // namespace specinfer
