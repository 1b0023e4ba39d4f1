// Utf8StreamDecoder and Tokenizer::Decode's UTF-8 contract: never half a character out,
// invalid bytes become U+FFFD (one per maximal invalid subpart).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tokenizer/tokenizer.h"

namespace specinfer {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string DecodeAll(std::string_view bytes) {
  Utf8StreamDecoder d;
  std::string out = d.Push(bytes);
  return out + d.Flush();
}

TEST(Utf8StreamDecoderTest, AsciiPassesThrough) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push("hello"), "hello");
  EXPECT_EQ(d.Push(""), "");
  EXPECT_EQ(d.Push(std::string_view("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(d.Flush(), "");
}

TEST(Utf8StreamDecoderTest, FourByteEmojiSplitOverFourPushes) {
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push(emoji.substr(0, 1)), "");
  EXPECT_EQ(d.Push(emoji.substr(1, 1)), "");
  EXPECT_EQ(d.Push(emoji.substr(2, 1)), "");
  EXPECT_EQ(d.Push(emoji.substr(3, 1)), emoji);
  EXPECT_EQ(d.Flush(), "");
}

TEST(Utf8StreamDecoderTest, CompletePrefixIsEmittedAndTailHeldBack) {
  Utf8StreamDecoder d;
  // "ab" then the first two bytes of U+4E16 (E4 B8 96).
  EXPECT_EQ(d.Push("ab\xE4\xB8"), "ab");
  EXPECT_EQ(d.Push("\x96x"), "\xE4\xB8\x96x");
}

TEST(Utf8StreamDecoderTest, FlushTurnsIncompleteTailIntoOneReplacement) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push("ab\xF0\x9F\x98"), "ab");
  EXPECT_EQ(d.Flush(), kFffd);
  // Flush resets: the next Push starts afresh.
  EXPECT_EQ(d.Push("c"), "c");
  EXPECT_EQ(d.Flush(), "");
}

TEST(Utf8StreamDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(DecodeAll(std::string("a\xFF") + "b"), "a" + kFffd + "b");      // never valid
  EXPECT_EQ(DecodeAll("\x80"), kFffd);                                      // stray continuation
  EXPECT_EQ(DecodeAll("\xC0\xAF"), kFffd + kFffd);                          // overlong '/'
  EXPECT_EQ(DecodeAll("\xE0\x80\xAF"), kFffd + kFffd + kFffd);              // overlong, 3 bytes
  EXPECT_EQ(DecodeAll("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // surrogate U+D800
  EXPECT_EQ(DecodeAll("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(DecodeAll("\xF5\x80"), kFffd + kFffd);
  // A truncated sequence followed by something else is one maximal subpart.
  EXPECT_EQ(DecodeAll(std::string("\xE4\xB8") + "A"), kFffd + "A");
  EXPECT_EQ(DecodeAll(std::string("\xF0\x9F\x98") + "\xF0\x9F\x98\x80"),
            kFffd + "\xF0\x9F\x98\x80");
}

TEST(Utf8StreamDecoderTest, InvalidByteIsReportedWithoutWaitingForMore) {
  Utf8StreamDecoder d;
  // C0 can never start a valid sequence: replaced at once, not held back.
  EXPECT_EQ(d.Push("\xC0"), kFffd);
  // E4 B8 followed by a non-continuation byte: known invalid at once.
  EXPECT_EQ(d.Push("\xE4\xB8"), "");
  EXPECT_EQ(d.Push("Z"), kFffd + "Z");
}

TEST(Utf8StreamDecoderTest, ValidTextSurvivesAnySplit) {
  const std::string text =
      "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x8D\x95 e\xCC\x81 \xF4\x8F\xBF\xBF end";
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); ++b) {
      Utf8StreamDecoder d;
      std::string out = d.Push(text.substr(0, a));
      out += d.Push(text.substr(a, b - a));
      out += d.Push(text.substr(b));
      out += d.Flush();
      ASSERT_EQ(out, text) << "split at " << a << ", " << b;
    }
  }
}

// Property: any byte-by-byte or chunked streaming of arbitrary bytes equals the one-shot
// result, every output chunk is valid UTF-8 on its own, and valid input is unchanged.
TEST(Utf8StreamDecoderTest, ChunkingDoesNotChangeTheResult) {
  std::mt19937 rng(7);
  const std::string pool[] = {"a",           " ",    "\xC3\xA9", "\xE4\xB8\x96", "\xF0\x9F\x8D\x95",
                              "\x80",        "\xFF", "\xC0",     "\xE4",         "\xF0\x9F",
                              "\xED\xA0\x80"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes;
    const int n = rng() % 12;
    for (int i = 0; i < n; ++i) bytes += pool[rng() % std::size(pool)];
    const std::string whole = DecodeAll(bytes);
    Utf8StreamDecoder d;
    std::string streamed;
    for (size_t i = 0; i < bytes.size();) {
      const size_t len = 1 + rng() % 3;
      const std::string chunk = d.Push(std::string_view(bytes).substr(i, len));
      // Each emitted chunk is complete: decoding it again changes nothing.
      ASSERT_EQ(DecodeAll(chunk), chunk);
      streamed += chunk;
      i += len;
    }
    streamed += d.Flush();
    ASSERT_EQ(streamed, whole);
  }
}

}  // namespace
}  // namespace specinfer
