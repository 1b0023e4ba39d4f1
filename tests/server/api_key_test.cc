// The API-key check both frontends share (server/api_key.h).
#include "server/api_key.h"

#include <gtest/gtest.h>

#include <string>

namespace specinfer {
namespace {

TEST(ConstantTimeEquals, EqualStrings) {
  EXPECT_TRUE(ConstantTimeEquals("sk-test-123", "sk-test-123"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  const std::string with_nul("a\0b", 3);
  EXPECT_TRUE(ConstantTimeEquals(with_nul, with_nul));
}

TEST(ConstantTimeEquals, DifferentLengths) {
  EXPECT_FALSE(ConstantTimeEquals("sk-test-12", "sk-test-123"));              // a prefix of the key
  EXPECT_FALSE(ConstantTimeEquals("sk-test-1234", "sk-test-123"));            // the key and more
  EXPECT_FALSE(ConstantTimeEquals("sk-test-123sk-test-123", "sk-test-123"));  // key repeated
  EXPECT_FALSE(ConstantTimeEquals("", "sk-test-123"));
  EXPECT_FALSE(ConstantTimeEquals("x", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0", 2), "a"));
}

TEST(ConstantTimeEquals, OneByteDiffering) {
  const std::string key = "sk-test-123";
  for (size_t i = 0; i < key.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string other = key;
      other[i] = static_cast<char>(other[i] ^ (1 << bit));
      EXPECT_FALSE(ConstantTimeEquals(other, key)) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(BearerKeyMatches, NeedsTheBearerPrefixAndTheExactKey) {
  EXPECT_TRUE(BearerKeyMatches("Bearer secret", "secret"));
  EXPECT_FALSE(BearerKeyMatches("secret", "secret"));
  EXPECT_FALSE(BearerKeyMatches("bearer secret", "secret"));
  EXPECT_FALSE(BearerKeyMatches("Bearer  secret", "secret"));
  EXPECT_FALSE(BearerKeyMatches("Bearer secreT", "secret"));
  EXPECT_FALSE(BearerKeyMatches("Bearer secre", "secret"));
  EXPECT_FALSE(BearerKeyMatches("Bearer secrets", "secret"));
  EXPECT_FALSE(BearerKeyMatches("Bearer ", "secret"));
  EXPECT_FALSE(BearerKeyMatches("", "secret"));
}

}  // namespace
}  // namespace specinfer
