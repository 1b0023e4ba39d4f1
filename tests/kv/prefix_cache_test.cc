// Prefix caching in the KV-cache bookkeeping (kv/kv_cache.h): registration, exact lookups,
// sharing with reference counts, LRU eviction, deduplication and copy-on-write.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv/kv_cache.h"

namespace specinfer {
namespace {

std::vector<int32_t> Tokens(int32_t n, int32_t first = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence that computed (reserved and committed) `tokens`.
SeqId Computed(KvCacheManager& kv, const std::vector<int32_t>& tokens) {
  SeqId s = kv.AddSequence();
  EXPECT_TRUE(kv.Reserve(s, static_cast<int32_t>(tokens.size())).ok());
  kv.CommitTokens(s, tokens);
  return s;
}

std::vector<int32_t> Table(const KvCacheManager& kv, SeqId s) {
  auto t = kv.BlockTable(s);
  return {t.begin(), t.end()};
}

TEST(PrefixCache, CommittedFullBlocksAreFoundByALaterPromptAndShared) {
  KvCacheManager kv(8, 4);
  kv.set_prefix_caching(true);
  const auto toks = Tokens(10);  // blocks [0,4) [4,8) full, [8,10) partial
  SeqId a = Computed(kv, toks);
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 2);
  const auto a_table = Table(kv, a);

  SeqId b = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(b, toks, 9), 8);
  EXPECT_EQ(kv.Length(b), 8);
  EXPECT_EQ(Table(kv, b), std::vector<int32_t>(a_table.begin(), a_table.begin() + 2));
  EXPECT_EQ(kv.RefCount(a_table[0]), 2);
  EXPECT_EQ(kv.WritableFrom(b), 8);
  // Growing past the shared blocks takes a fresh block for the partial one.
  ASSERT_TRUE(kv.Reserve(b, 10).ok());
  EXPECT_NE(Table(kv, b)[2], a_table[2]);
  EXPECT_EQ(kv.free_blocks(), 8 - 4);

  const PrefixCacheStats st = kv.prefix_stats();
  EXPECT_EQ(st.lookups, 1);
  EXPECT_EQ(st.lookup_tokens, 10);
  EXPECT_EQ(st.hit_tokens, 8);
}

TEST(PrefixCache, AttachesWholeBlocksOnlyAndStopsAtTheFirstDifference) {
  KvCacheManager kv(16, 4);
  kv.set_prefix_caching(true);
  const auto toks = Tokens(12);
  SeqId a = Computed(kv, toks);
  kv.RemoveSequence(a);  // its blocks stay cached, evictable
  EXPECT_EQ(kv.free_blocks(), 16);
  EXPECT_EQ(kv.prefix_stats().evictable_blocks, 3);

  // At most max_tokens, whole blocks: the engine never attaches the last prompt token.
  SeqId b = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(b, toks, 11), 8);
  SeqId c = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(c, std::vector<int32_t>(toks.begin(), toks.begin() + 7), 6),
            4);
  // A different token in the second block: the first block only.
  auto other = toks;
  other[5] = 7;
  SeqId d = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(d, other, 11), 4);
  // A different first block: nothing, although later blocks hold the same tokens.
  other = toks;
  other[0] = 7;
  SeqId e = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(e, other, 11), 0);
  EXPECT_EQ(kv.Length(e), 0);
}

TEST(PrefixCache, OffFindsAndRegistersNothing) {
  KvCacheManager kv(8, 4);
  const auto toks = Tokens(8);
  SeqId a = Computed(kv, toks);
  kv.RemoveSequence(a);
  SeqId b = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(b, toks, 7), 0);
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 0);
}

TEST(PrefixCache, EvictsLeastRecentlyReleasedBlocksOnlyWhenFreeOnesRunOut) {
  KvCacheManager kv(4, 2);
  kv.set_prefix_caching(true);
  const auto first = Tokens(4, 100), second = Tokens(4, 200);
  kv.RemoveSequence(Computed(kv, first));   // 2 evictable blocks
  kv.RemoveSequence(Computed(kv, second));  // 2 more
  EXPECT_EQ(kv.prefix_stats().evictable_blocks, 4);
  EXPECT_EQ(kv.free_blocks(), 4);

  // One new block evicts the least recently released: `first`'s last block (released first).
  SeqId x = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(x, 1).ok());
  EXPECT_EQ(kv.prefix_stats().evictions, 1);
  SeqId y = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(y, first, 4), 2);  // its head survives
  SeqId z = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(z, second, 4), 4);
  // Blocks in use are never evicted: y and z hold 3, x holds 1.
  EXPECT_EQ(kv.free_blocks(), 0);
  EXPECT_EQ(kv.Reserve(x, 3).code(), StatusCode::kResourceExhausted);
  kv.RemoveSequence(z);
  ASSERT_TRUE(kv.Reserve(x, 5).ok());  // evicts both of `second`'s blocks
  EXPECT_EQ(kv.prefix_stats().evictions, 3);
  SeqId w = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(w, second, 4), 0);
}

TEST(PrefixCache, TheSamePrefixComputedTwiceIsKeptOnce) {
  KvCacheManager kv(8, 4);
  kv.set_prefix_caching(true);
  const auto toks = Tokens(8);
  SeqId a = kv.AddSequence(), b = kv.AddSequence();  // admitted together: both compute it
  ASSERT_TRUE(kv.Reserve(a, 8).ok());
  ASSERT_TRUE(kv.Reserve(b, 8).ok());
  EXPECT_EQ(kv.free_blocks(), 4);
  kv.CommitTokens(a, toks);
  kv.CommitTokens(b, toks);
  EXPECT_EQ(Table(kv, a), Table(kv, b));
  EXPECT_EQ(kv.free_blocks(), 6);
  EXPECT_EQ(kv.RefCount(Table(kv, a)[1]), 2);
  // Both release theirs; the chain stays whole for the next one.
  kv.RemoveSequence(a);
  kv.RemoveSequence(b);
  SeqId c = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(c, Tokens(9), 8), 8);
}

TEST(PrefixCache, WritingIntoASharedBlockCopiesItFirst) {
  KvCacheManager kv(8, 4);
  kv.set_prefix_caching(true);
  const auto toks = Tokens(9);
  SeqId a = Computed(kv, toks);
  SeqId b = kv.AddSequence();
  ASSERT_EQ(kv.AttachCachedPrefix(b, toks, 8), 8);
  const int32_t shared = Table(kv, b)[1];
  // b backs up into the second shared block, then writes there.
  kv.Truncate(b, 6);
  EXPECT_EQ(Table(kv, b)[1], shared);  // still shared: nothing written yet
  ASSERT_TRUE(kv.Reserve(b, 8).ok());
  const int32_t own = Table(kv, b)[1];
  EXPECT_NE(own, shared);
  EXPECT_EQ(Table(kv, a)[1], shared);  // a's entries untouched
  EXPECT_EQ(kv.WritableFrom(b), 4);
  ASSERT_TRUE(kv.has_pending_copies());

  std::vector<int32_t> copied_src, copied_dst, helper_table;
  Status s = kv.ApplyPendingCopies(
      [&](SeqId helper, std::span<const int32_t> src, std::span<const int32_t> dst) {
        helper_table = Table(kv, helper);
        copied_src.assign(src.begin(), src.end());
        copied_dst.assign(dst.begin(), dst.end());
        return Status::Ok();
      });
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(helper_table, (std::vector<int32_t>{shared, own}));
  EXPECT_EQ(copied_src, (std::vector<int32_t>{0, 1}));  // the 2 entries kept: positions 4, 5
  EXPECT_EQ(copied_dst, (std::vector<int32_t>{4, 5}));
  EXPECT_FALSE(kv.has_pending_copies());
  EXPECT_EQ(kv.RefCount(shared), 1);  // a's again
  EXPECT_EQ(kv.RefCount(own), 1);
  EXPECT_EQ(kv.free_blocks(), 8 - 3 - 1);  // a: 3, b: a's first + its own
}

TEST(PrefixCache, ClearForgetsEveryRegistration) {
  KvCacheManager kv(8, 4);
  kv.set_prefix_caching(true);
  const auto toks = Tokens(8);
  SeqId a = Computed(kv, toks);
  kv.RemoveSequence(Computed(kv, Tokens(8, 500)));
  kv.ClearPrefixCache();
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 0);
  EXPECT_EQ(kv.prefix_stats().evictable_blocks, 0);
  EXPECT_EQ(kv.free_blocks(), 6);
  SeqId b = kv.AddSequence();
  EXPECT_EQ(kv.AttachCachedPrefix(b, toks, 8), 0);
  kv.RemoveSequence(a);
  EXPECT_EQ(kv.free_blocks(), 8);
}

}  // namespace
}  // namespace specinfer
