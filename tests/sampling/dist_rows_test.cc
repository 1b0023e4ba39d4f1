// DistRows: sampling distributions as a runner brings them back for multi-step speculative
// sampling, sparse where top-k/top-p leave few tokens, dense otherwise.
#include "sampling/dist_rows.h"

#include <gtest/gtest.h>

#include <vector>

#include "sampling/sampler.h"

namespace specinfer {
namespace {

TEST(DistRows, KeepsFewTokensSparseAndManyDenseAndExpandsBothBack) {
  constexpr int32_t kVocab = 64;
  DistRows rows;
  rows.Reset(kVocab);
  std::vector<float> few(kVocab, 0.0f), many(kVocab, 0.0f);
  few[3] = 0.25f;
  few[40] = 0.75f;
  for (int32_t i = 0; i < 9; ++i) many[static_cast<size_t>(i) * 7] = 1.0f / 9;  // 9 > 64 / 8
  rows.AddDense(few);
  rows.AddDense(many);
  ASSERT_EQ(rows.size(), 2);
  EXPECT_EQ(std::vector<int32_t>(rows.ids(0).begin(), rows.ids(0).end()),
            (std::vector<int32_t>{3, 40}));
  EXPECT_EQ(std::vector<float>(rows.probs(0).begin(), rows.probs(0).end()),
            (std::vector<float>{0.25f, 0.75f}));
  EXPECT_TRUE(rows.ids(1).empty());
  EXPECT_EQ(rows.probs(1).size(), static_cast<size_t>(kVocab));
  EXPECT_EQ(rows.stored_values(), 4 + kVocab);
  std::vector<float> p;
  rows.Expand(0, p);
  EXPECT_EQ(p, few);
  rows.Expand(1, p);
  EXPECT_EQ(p, many);
  EXPECT_TRUE(DistRows::Sparse(8, kVocab));
  EXPECT_FALSE(DistRows::Sparse(9, kVocab));
}

TEST(DistRows, AddSparseRefusesIdsOutOfOrderOrOutsideTheVocabulary) {
  DistRows rows;
  rows.Reset(10);
  const std::vector<float> two = {0.5f, 0.5f};
  EXPECT_EQ(rows.AddSparse(std::vector<int32_t>{4, 2}, two).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rows.AddSparse(std::vector<int32_t>{4, 4}, two).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rows.AddSparse(std::vector<int32_t>{4, 10}, two).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rows.AddSparse(std::vector<int32_t>{4}, two).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rows.size(), 0);
  ASSERT_TRUE(rows.AddSparse(std::vector<int32_t>{2, 9}, two).ok());
  std::vector<float> p;
  rows.Expand(0, p);
  EXPECT_EQ(p, (std::vector<float>{0, 0, 0.5f, 0, 0, 0, 0, 0, 0, 0.5f}));
}

// The packed form (the LLM worker protocol's) holds the rows exactly; counts and words that do not
// fit together, or ids out of order, are refused and append nothing.
TEST(DistRows, PackedRowsComeBackWholeAndMalformedOnesAreRefused) {
  constexpr int32_t kVocab = 32;
  DistRows rows;
  rows.Reset(kVocab);
  std::vector<float> few(kVocab, 0.0f), many(kVocab, 1.0f / kVocab);
  few[5] = 0.5f;
  few[31] = 0.5f;
  rows.AddDense(few);
  rows.AddDense(many);
  ASSERT_TRUE(
      rows.AddSparse(std::vector<int32_t>{0, 7, 9}, std::vector<float>{0.2f, 0.3f, 0.5f}).ok());
  std::vector<int32_t> kept;
  std::vector<uint32_t> words;
  rows.Pack(kept, words);
  EXPECT_EQ(kept, (std::vector<int32_t>{2, 32, 3}));
  EXPECT_EQ(words.size(), 4u + 32u + 6u);
  DistRows back;
  back.Reset(kVocab);
  ASSERT_TRUE(back.AddPacked(kept, words).ok());
  ASSERT_EQ(back.size(), 3);
  std::vector<float> a, b;
  for (int32_t r = 0; r < 3; ++r) {
    rows.Expand(r, a);
    back.Expand(r, b);
    EXPECT_EQ(a, b) << "row " << r;
  }
  DistRows bad;
  bad.Reset(kVocab);
  std::vector<uint32_t> short_words(words.begin(), words.end() - 1);
  EXPECT_EQ(bad.AddPacked(kept, short_words).code(), StatusCode::kInvalidArgument);
  std::vector<uint32_t> swapped = words;
  std::swap(swapped[2], swapped[3]);  // the first row's ids, 5 and 31, now descending
  EXPECT_EQ(bad.AddPacked(kept, swapped).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.AddPacked(std::vector<int32_t>{-1}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.size(), 0);
}

// What ComputeProbs keeps comes back whole: a top-p nucleus of a 49152-token row is a few ids.
TEST(DistRows, ATopPNucleusTakesAFractionOfItsLogits) {
  constexpr int32_t kVocab = 49152;
  std::vector<float> logits(kVocab);
  for (int32_t i = 0; i < kVocab; ++i) logits[static_cast<size_t>(i)] = -0.001f * (i % 997);
  logits[123] = 12.0f;
  logits[4567] = 11.0f;
  SamplingParams s;
  s.temperature = 0.7f;
  s.top_p = 0.9f;
  std::vector<float> p, back;
  ComputeProbs(logits, s, p);
  DistRows rows;
  rows.Reset(kVocab);
  rows.AddDense(p);
  EXPECT_LT(rows.stored_values(), 16);
  rows.Expand(0, back);
  EXPECT_EQ(back, p);
}

}  // namespace
}  // namespace specinfer
