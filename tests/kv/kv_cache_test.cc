#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <set>

namespace specinfer {
namespace {

TEST(KvCacheManager, ReserveAllocatesWholeBlocksAndSlotsAreDistinct) {
  KvCacheManager kv(8, 4);
  SeqId a = kv.AddSequence(), b = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(a, 5).ok());  // 2 blocks
  ASSERT_TRUE(kv.Reserve(b, 4).ok());  // 1 block
  EXPECT_EQ(kv.free_blocks(), 5);
  EXPECT_EQ(kv.Length(a), 5);
  std::set<int64_t> slots;
  for (int p = 0; p < 5; ++p) slots.insert(kv.SlotOf(a, p));
  for (int p = 0; p < 4; ++p) slots.insert(kv.SlotOf(b, p));
  EXPECT_EQ(slots.size(), 9u);
  for (int64_t s : slots) EXPECT_LT(s, 8 * 4);
}

TEST(KvCacheManager, TruncateFreesBlocksBeyondTheNewLength) {
  KvCacheManager kv(8, 4);
  SeqId a = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(a, 16).ok());
  EXPECT_EQ(kv.free_blocks(), 4);
  int64_t slot3 = kv.SlotOf(a, 3);
  kv.Truncate(a, 5);
  EXPECT_EQ(kv.Length(a), 5);
  EXPECT_EQ(kv.free_blocks(), 6);
  EXPECT_EQ(kv.SlotOf(a, 3), slot3);  // kept entries do not move
  kv.Truncate(a, 0);
  EXPECT_EQ(kv.free_blocks(), 8);
}

TEST(KvCacheManager, ExhaustionIsAnErrorAndChangesNothing) {
  KvCacheManager kv(2, 4);
  SeqId a = kv.AddSequence();
  Status s = kv.Reserve(a, 9);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.free_blocks(), 2);
  EXPECT_EQ(kv.Length(a), 0);
}

TEST(KvCacheManager, RemoveSequenceReturnsEverything) {
  KvCacheManager kv(4, 2);
  SeqId a = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(a, 8).ok());
  kv.RemoveSequence(a);
  EXPECT_EQ(kv.free_blocks(), 4);
  EXPECT_FALSE(kv.HasSequence(a));
  EXPECT_EQ(kv.Reserve(a, 1).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specinfer
