// Incremental text of a generated sequence: UTF-8 assembly and stop strings.
#include "server/text_output.h"

#include <gtest/gtest.h>

#include <random>

#include "server_test_util.h"

namespace specinfer {
namespace {

// Pushes `pieces` one by one; returns everything emitted (Push results, then Flush).
std::string RunMatcher(std::vector<std::string> stops, const std::vector<std::string>& pieces,
                       bool* stopped = nullptr) {
  StopStringMatcher m(std::move(stops));
  std::string out;
  for (const std::string& p : pieces) out += m.Push(p);
  if (stopped) *stopped = m.stopped();
  return out + m.Flush();
}

TEST(StopStringMatcher, NoStopsPassesEverythingThrough) {
  StopStringMatcher m({});
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_EQ(m.Push(""), "");
  EXPECT_EQ(m.Flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringMatcher, CutsAtTheStopStringAndDropsTheRest) {
  bool stopped = false;
  EXPECT_EQ(RunMatcher({"END"}, {"hello ", "wor", "ld END and more"}, &stopped), "hello world ");
  EXPECT_TRUE(stopped);
}

TEST(StopStringMatcher, MatchesAcrossPieces) {
  bool stopped = false;
  EXPECT_EQ(RunMatcher({"\n\n"}, {"line one\n", "\nline two"}, &stopped), "line one");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(RunMatcher({"STOP"}, {"aS", "T", "O", "Pb"}, &stopped), "a");
  EXPECT_TRUE(stopped);
}

TEST(StopStringMatcher, HoldsBackOnlyWhatCouldStartAStopString) {
  StopStringMatcher m({"xyz"});
  EXPECT_EQ(m.Push("abcx"), "abc");  // "x" may start "xyz"
  EXPECT_EQ(m.Push("y"), "");        // "xy" still may
  EXPECT_EQ(m.Push("a"), "xya");     // no longer
  EXPECT_EQ(m.Push("xy"), "");
  EXPECT_EQ(m.Flush(), "xy");  // generation ended without the stop string: release it
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringMatcher, EarliestOfSeveralStopsWins) {
  bool stopped = false;
  EXPECT_EQ(RunMatcher({"cd", "b"}, {"abcde"}, &stopped), "a");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(RunMatcher({"bcd", "cx"}, {"ab", "cd"}, &stopped), "a");
}

TEST(StopStringMatcher, NothingAfterStopping) {
  StopStringMatcher m({"!"});
  EXPECT_EQ(m.Push("hi!"), "hi");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringMatcher, HoldBackNeverSplitsAUtf8Character) {
  // "é" is C3 A9; the stop string starts with "é".
  StopStringMatcher m({"\xC3\xA9t\xC3\xA9"});
  std::string out = m.Push("caf\xC3\xA9");
  EXPECT_EQ(out, "caf");
  out += m.Push(" ok");
  EXPECT_EQ(out, "caf\xC3\xA9 ok");
}

// Property: for random texts, stop sets and splits into pieces (tokens), the emitted text equals a
// plain reference without any hold-back logic: after each piece, if the text so far contains a
// stop string, cut at the earliest occurrence and stop. (Generation ends at the first token that
// completes a stop string, so with overlapping stop strings the cut can depend on the token
// boundaries -- as in vLLM -- but never on how the text was streamed.)
TEST(StopStringMatcher, RandomSplitsEqualThePlainReference) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab\n";
  for (int trial = 0; trial < 5000; ++trial) {
    std::string text;
    const int len = rng() % 30;
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    const int nstops = rng() % 3;
    for (int s = 0; s < nstops; ++s) {
      std::string stop;
      const int sl = 1 + rng() % 4;
      for (int i = 0; i < sl; ++i) stop += alphabet[rng() % alphabet.size()];
      stops.push_back(stop);
    }
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 5;
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    std::string so_far, expected;
    bool expect_stop = false;
    for (const std::string& p : pieces) {
      so_far += p;
      size_t cut = std::string::npos;
      for (const std::string& s : stops) cut = std::min(cut, so_far.find(s));
      if (cut != std::string::npos) {
        expected = so_far.substr(0, cut);
        expect_stop = true;
        break;
      }
    }
    if (!expect_stop) expected = text;
    bool stopped = false;
    ASSERT_EQ(RunMatcher(stops, pieces, &stopped), expected) << "text '" << text << "'";
    EXPECT_EQ(stopped, expect_stop);
  }
}

TEST(CompletionText, ConcatenationEqualsTheDecodedSequence) {
  auto engine = testing::Stories260KEngine();
  ASSERT_TRUE(engine);
  const Tokenizer& tok = engine->tokenizer();
  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt("Once upon a time");
  req.max_new_tokens = 60;
  req.sampling.temperature = 0;
  auto r = engine->Generate(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();

  CompletionText text(tok, req.prompt_tokens.back(), {}, {});
  std::string streamed;
  for (int32_t t : r->tokens) streamed += text.Push(t);
  streamed += text.Finish();
  Utf8StreamDecoder d;
  std::string whole;
  int32_t prev = req.prompt_tokens.back();
  for (int32_t t : r->tokens) {
    whole += d.Push(tok.TokenBytes(prev, t));
    prev = t;
  }
  whole += d.Flush();
  EXPECT_EQ(streamed, whole);
  EXPECT_FALSE(whole.empty());
}

TEST(CompletionText, StopTokensAddNoTextAndStopStringsStop) {
  auto engine = testing::Stories260KEngine();
  ASSERT_TRUE(engine);
  const Tokenizer& tok = engine->tokenizer();
  const std::vector<int32_t> ids = *tok.Encode("Lily was happy. Tom was sad.", false);
  std::string expected;  // the plain decode after BOS
  int32_t prev = tok.bos_id();
  for (int32_t t : ids) {
    expected += tok.TokenBytes(prev, t);
    prev = t;
  }
  ASSERT_NE(expected.find('.'), std::string::npos);

  // The EOS id as a stop token contributes nothing.
  const int32_t eos = tok.eos_id();
  CompletionText a(tok, tok.bos_id(), std::vector<int32_t>{eos}, {});
  std::string out;
  for (int32_t t : ids) out += a.Push(t);
  out += a.Push(eos);
  out += a.Finish();
  EXPECT_EQ(out, expected);

  CompletionText b(tok, tok.bos_id(), {}, {"."});
  std::string cut;
  size_t pushed = 0;
  for (int32_t t : ids) {
    cut += b.Push(t);
    ++pushed;
    if (b.stopped()) break;
  }
  cut += b.Finish();
  EXPECT_TRUE(b.stopped());
  EXPECT_EQ(cut, expected.substr(0, expected.find('.')));
  EXPECT_LT(pushed, ids.size());  // stopped at the token that completed the stop string
}

TEST(Utf8Helpers, SanitizeAndCount) {
  EXPECT_EQ(SanitizeUtf8("ok"), "ok");
  EXPECT_EQ(SanitizeUtf8("\xE2\x82"), "\xEF\xBF\xBD");  // incomplete euro sign
  EXPECT_EQ(SanitizeUtf8("a\xFF"
                         "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(CountCodePoints("h\xC3\xA9llo \xE2\x82\xAC"), 7u);
}

}  // namespace
}  // namespace specinfer
