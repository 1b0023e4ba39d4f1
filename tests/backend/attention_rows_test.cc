// AttendKvHead (slots resolved by the caller, Dot and Axpy over all visible rows per call, the
// output columns kept in registers across rows) against the plain per-row composition of the
// public Dot, Softmax and Axpy it replaced: the results must be bit-identical, since decode and
// tree passes both go through it and a token's attention must not depend on the kernel's
// blocking.
// Head sizes cover one 64-column chunk, two, a partial chunk (72) and a size with a scalar tail;
// groups of 1 to 4 query heads per KV head (head size 64 takes the grouped kernels: AVX2 here with
// SPECINFER_NO_AVX512=1, the isa_avx2 copy of this test, else AVX-512).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ops.h"

namespace specinfer {
namespace {

// The attention of one query head as it was computed before the row kernels.
void ReferenceHead(const std::vector<int32_t>& positions, const std::vector<int32_t>& table,
                   int32_t bs, const float* keys, const float* values, int64_t stride,
                   const float* q, int32_t head_dim, float scale, float* out) {
  std::vector<float> scores(positions.size());
  for (size_t k = 0; k < positions.size(); ++k) {
    const int32_t p = positions[k];
    const int64_t slot = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
    scores[k] = cpu::Dot(q, keys + slot * stride, head_dim) * scale;
  }
  cpu::Softmax(scores.data(), static_cast<int64_t>(scores.size()));
  std::fill_n(out, head_dim, 0.0f);
  for (size_t k = 0; k < positions.size(); ++k) {
    const int32_t p = positions[k];
    const int64_t slot = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
    cpu::Axpy(scores[k], values + slot * stride, out, head_dim);
  }
}

TEST(AttendKvHead, BitIdenticalToPerRowDotAndAxpy) {
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int32_t bs = 16;
  for (int32_t group : {1, 2, 3, 4})  // query heads per KV head (head size 64: grouped kernels)
    for (int32_t head_dim : {64, 128, 72, 36}) {
      for (int32_t prefix : {0, 1, 17, 300}) {
        SCOPED_TRACE("group=" + std::to_string(group) + " head_dim=" + std::to_string(head_dim) +
                     " prefix=" + std::to_string(prefix));
        const int32_t new_tokens = 5;
        const int32_t positions = prefix + new_tokens;
        const int32_t blocks = (positions + bs - 1) / bs;
        std::vector<int32_t> table(blocks);
        for (int32_t b = 0; b < blocks; ++b) table[b] = blocks - 1 - b;  // not in order
        const int64_t stride = head_dim + 8;  // slots wider than one head
        std::vector<float> keys(static_cast<size_t>(blocks) * bs * stride);
        std::vector<float> values(keys.size());
        for (float& v : keys) v = dist(rng);
        for (float& v : values) v = dist(rng);
        std::vector<float> q(static_cast<size_t>(group) * head_dim);
        for (float& v : q) v = dist(rng);
        BatchSequence s;
        s.token_count = new_tokens;
        s.kv_prefix = prefix;
        const float scale = 0.125f;
        std::vector<int32_t> slots(static_cast<size_t>(positions));
        for (int32_t p = 0; p < positions; ++p) slots[p] = table[p / bs] * bs + p % bs;
        for (int32_t i = 0; i < new_tokens; ++i) {
          std::vector<int32_t> visible;
          std::vector<float> scores;
          std::vector<float> got(q.size()), want(q.size());
          cpu::AttendKvHead(s, i, slots.data(), keys.data(), values.data(), stride, q.data(), group,
                            head_dim, scale, visible, scores, got.data());
          std::vector<int32_t> seen;
          for (int32_t p = 0; p <= prefix + i; ++p) seen.push_back(p);
          for (int32_t g = 0; g < group; ++g)
            ReferenceHead(seen, table, bs, keys.data(), values.data(), stride,
                          q.data() + g * head_dim, head_dim, scale, want.data() + g * head_dim);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << "token " << i;
        }
      }
    }
}

}  // namespace
}  // namespace specinfer
