// Llama2cTokenizer: loading (and rejecting corrupt files), encoding against the naive llama2.c
// rule and against SentencePiece itself, decoding, round trips and speed.
#include "tokenizer/llama2c_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "test_util.h"

namespace specinfer {
namespace {

using TokenType = Llama2cTokenizer::TokenType;
using Ids = std::vector<int32_t>;

std::unique_ptr<Llama2cTokenizer> MustLoad(const std::string& path, int32_t vocab_size) {
  auto tok = Llama2cTokenizer::Load(path, vocab_size);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

#define LOAD_LLAMA2_OR_SKIP(var)                                                 \
  const std::string var##_path = testing::Llama2TokenizerBin();                  \
  if (var##_path.empty()) GTEST_SKIP() << "Llama 2 tokenizer.bin not available"; \
  auto var = MustLoad(var##_path, 32000);                                        \
  ASSERT_NE(var, nullptr)

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// ---- the naive oracle ----------------------------------------------------------------------
// The encoding rule written as plainly as possible (llama2.c's run.c): O(n^2) per merge, a new
// string per pair. Independent of the implementation's UTF-8 classifier, too.

// Length of a valid UTF-8 sequence at s[i], decoded by value and checked against the shortest
// form, the surrogate range and U+10FFFF; 0 if invalid or incomplete.
size_t OracleCodePointLength(const std::string& s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  size_t n;
  uint32_t cp;
  if (b0 < 0x80) return 1;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<uint8_t>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

class Oracle {
 public:
  explicit Oracle(const Llama2cTokenizer& tok) : tok_(tok) {
    for (int32_t id = tok.vocab_size() - 1; id >= 0; --id) {  // lowest id wins
      const TokenType t = tok.token_type(id);
      if (t == TokenType::kNormal || t == TokenType::kUserDefined) {
        vocab_[std::string(tok.TokenPiece(id))] = id;
      }
    }
  }

  Ids Encode(const std::string& text) const {
    struct Sym {
      std::string text;
      int32_t id;  // -1: byte fallback
    };
    if (text.empty()) return {};
    std::vector<Sym> syms;
    const std::string s = (vocab_.count(" ") ? " " : "") + text;
    for (size_t i = 0; i < s.size();) {
      size_t n = OracleCodePointLength(s, i);
      if (n == 0) n = 1;
      const std::string unit = s.substr(i, n);
      auto it = vocab_.find(unit);
      syms.push_back({unit, it == vocab_.end() ? -1 : it->second});
      i += n;
    }
    while (true) {
      int best_i = -1, best_id = -1;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        if (syms[i].id < 0 || syms[i + 1].id < 0) continue;
        auto it = vocab_.find(syms[i].text + syms[i + 1].text);
        // Strictly greater: the leftmost pair wins a tie.
        if (it != vocab_.end() && (best_i < 0 || tok_.score(it->second) > tok_.score(best_id))) {
          best_i = static_cast<int>(i);
          best_id = it->second;
        }
      }
      if (best_i < 0) break;
      syms[best_i] = {syms[best_i].text + syms[best_i + 1].text, best_id};
      syms.erase(syms.begin() + best_i + 1);
    }
    Ids ids;
    for (const Sym& sym : syms) {
      if (sym.id >= 0) {
        ids.push_back(sym.id);
      } else {
        for (char c : sym.text) ids.push_back(tok_.byte_token(static_cast<uint8_t>(c)));
      }
    }
    return ids;
  }

 private:
  const Llama2cTokenizer& tok_;
  std::map<std::string, int32_t> vocab_;  // pieces text may produce
};

// Random text mixing whole words, whitespace runs, digits, punctuation, multi-byte characters,
// combining marks, and invalid UTF-8.
std::string RandomText(std::mt19937& rng, int max_parts) {
  // clang-format off
  static const char* kParts[] = {
      "the", " the", "a", " ", "  ", "    ", "\n", "\n\n", "\t", "ing", "Hello", " world", "er",
      "Once", " upon", " time", ".", ",", "!", "?", "'s", "0", "1", "42", "2024", "(", ")",
      "{", "}", "->", "==", "x", "q", "z", "Z", "e\xCC\x81", "\xC3\xA9", "\xE4\xBD\xA0",
      "\xE5\xA5\xBD", "\xE4\xB8\x96", "\xF0\x9F\x8D\x95", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
      "\xE2\x80\x8D", "\xD0\x9F\xD1\x80\xD0\xB8", "\xCE\xB1", "\xFF", "\x80", "\xC3",
      "\xE4\xB8", "\xED\xA0\x80", "\xC0\xAF", "<s>", "</s>", "<0x41>", "<unk>"};
  // clang-format on
  std::string s;
  const int n = static_cast<int>(rng() % (max_parts + 1));
  for (int i = 0; i < n; ++i) {
    if (rng() % 8 == 0) {
      s.push_back(static_cast<char>(rng() % 256));  // any byte at all
    } else {
      s += kParts[rng() % std::size(kParts)];
    }
  }
  return s;
}

// Texts that exercise byte fallback, whitespace, scripts; used by the round-trip tests.
const std::vector<std::string>& RoundTripTexts() {
  static const std::vector<std::string> texts = {
      "",
      " ",
      "   ",
      "a",
      " leading",
      "  two leading spaces",
      "trailing  ",
      "multiple   spaces    between     words",
      "line one\nline two\n\n\ttabbed\r\n",
      "I believe the meaning of life is",
      "Once upon a time, there was a little girl named Lily.",
      "Emoji: \xF0\x9F\x8D\x95\xF0\x9F\xA4\x96 and ZWJ "
      "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA9",
      "CJK: \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",
      "combining: e\xCC\x81 a\xCC\x88 Z\xCD\x91\xCD\xAB",
      "rare: \xF0\x90\x8D\x88 \xF0\x9D\x84\x9E \xE0\xBC\xBA",
      "\xF0\x9F\xA7\xAC\xF0\x9F\xA7\xAC\xF0\x9F\xA7\xAC",  // no piece: byte fallback only
      "invalid: \xFF\xFE \xC0\xAF \xED\xA0\x80 \xE4\xB8 end",
      std::string("nul \0 inside", 12),
      "<s> and </s> are text here",
      "def f(x):\n    return x * 2  # comment\n",
  };
  return texts;
}

// ---- loading ---------------------------------------------------------------------------------

TEST(Llama2cTokenizerLoadTest, LoadsStories260K) {
  auto tok = MustLoad(testing::Stories260KTokenizer(), 512);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->unk_id(), 0);
  EXPECT_TRUE(tok->add_bos_by_default());
  EXPECT_EQ(tok->TokenPiece(1), "\n<s>\n");
  EXPECT_EQ(tok->token_type(0), TokenType::kUnknown);
  EXPECT_EQ(tok->token_type(1), TokenType::kControl);
  EXPECT_EQ(tok->token_type(2), TokenType::kControl);
  for (int b = 0; b < 256; ++b) {
    const int32_t id = tok->byte_token(static_cast<uint8_t>(b));
    EXPECT_EQ(id, b + 3);  // where llama2.c puts them, though found by content
    EXPECT_EQ(tok->token_type(id), TokenType::kByte);
  }
}

TEST(Llama2cTokenizerLoadTest, LoadsLlama2) {
  LOAD_LLAMA2_OR_SKIP(tok);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->TokenPiece(306), " I");
  EXPECT_EQ(tok->byte_token('\n'), 13);
}

// Writes `bytes` to a fresh file in the test's temp dir and returns its path.
class CorruptFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("specinfer_tok_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    auto original = ReadFileToString(testing::Stories260KTokenizer());
    ASSERT_TRUE(original.ok()) << original.status().ToString();
    original_ = *original;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
    return path;
  }
  // Offset of token `index`'s record (score, length, bytes) in the original file.
  size_t TokenOffset(int index) const {
    size_t off = 4;
    for (int i = 0; i < index; ++i) {
      int32_t len;
      std::memcpy(&len, original_.data() + off + 4, 4);
      off += 8 + len;
    }
    return off;
  }
  std::string WithInt32(size_t offset, int32_t v) const {
    std::string s = original_;
    std::memcpy(s.data() + offset, &v, 4);
    return s;
  }

  std::filesystem::path dir_;
  std::string original_;
};

TEST_F(CorruptFileTest, MissingFileIsNotFound) {
  auto tok = Llama2cTokenizer::Load((dir_ / "absent.bin").string(), 512);
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound) << tok.status().ToString();
}

TEST_F(CorruptFileTest, EmptyFileIsDataLoss) {
  const std::string path = Write("empty.bin", "");
  auto tok = Llama2cTokenizer::Load(path, 512);
  EXPECT_EQ(tok.status().code(), StatusCode::kDataLoss) << tok.status().ToString();
}

TEST_F(CorruptFileTest, TruncatedFileIsDataLossNamingTheFile) {
  // Cut inside the header, inside a token's score/length, and inside a token's bytes.
  const size_t t300 = TokenOffset(300);
  for (size_t cut : {size_t{2}, t300 + 3, t300 + 6, t300 + 9, original_.size() - 1}) {
    SCOPED_TRACE(cut);
    const std::string path = Write("truncated.bin", original_.substr(0, cut));
    auto tok = Llama2cTokenizer::Load(path, 512);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), StatusCode::kDataLoss) << tok.status().ToString();
    EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status().ToString();
    EXPECT_NE(tok.status().message().find("truncated"), std::string::npos);
  }
}

TEST_F(CorruptFileTest, CutAtTokenBoundaryIsVocabMismatch) {
  const std::string path = Write("short.bin", original_.substr(0, TokenOffset(300)));
  auto tok = Llama2cTokenizer::Load(path, 512);
  EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << tok.status().ToString();
  EXPECT_NE(tok.status().message().find("holds 300 tokens"), std::string::npos)
      << tok.status().ToString();
}

TEST_F(CorruptFileTest, AbsurdLengthsAreDataLoss) {
  const size_t len_at = TokenOffset(7) + 4;
  for (int32_t len : {-1, -2147483647 - 1, 8, 1 << 30, 2147483647}) {
    SCOPED_TRACE(len);
    const std::string path = Write("badlen.bin", WithInt32(len_at, len));
    auto tok = Llama2cTokenizer::Load(path, 512);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), StatusCode::kDataLoss) << tok.status().ToString();
    EXPECT_NE(tok.status().message().find("token 7 has length"), std::string::npos)
        << tok.status().ToString();
    EXPECT_NE(tok.status().message().find(path), std::string::npos);
  }
  for (int32_t max_len : {0, -5, 1 << 30}) {
    SCOPED_TRACE(max_len);
    const std::string path = Write("badmax.bin", WithInt32(0, max_len));
    auto tok = Llama2cTokenizer::Load(path, 512);
    EXPECT_EQ(tok.status().code(), StatusCode::kDataLoss) << tok.status().ToString();
    EXPECT_NE(tok.status().message().find("max_token_length"), std::string::npos);
  }
}

TEST_F(CorruptFileTest, NonFiniteScoreIsDataLoss) {
  std::string bytes = original_;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + TokenOffset(400), &nan, 4);
  auto tok = Llama2cTokenizer::Load(Write("nan.bin", bytes), 512);
  EXPECT_EQ(tok.status().code(), StatusCode::kDataLoss) << tok.status().ToString();
}

TEST_F(CorruptFileTest, VocabSizeMismatchIsInvalidArgument) {
  const std::string path = testing::Stories260KTokenizer();
  for (int32_t expected : {32000, 511, 100}) {
    SCOPED_TRACE(expected);
    auto tok = Llama2cTokenizer::Load(path, expected);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << tok.status().ToString();
    const std::string msg = tok.status().message();
    EXPECT_NE(msg.find("holds 512 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("vocab_size is " + std::to_string(expected)), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
  EXPECT_EQ(Llama2cTokenizer::Load(path, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Llama2cTokenizer::Load(path, -1).status().code(), StatusCode::kInvalidArgument);
}

TEST(Llama2cTokenizerFromVocabTest, RejectsInconsistentData) {
  using Tok = Llama2cTokenizer;
  EXPECT_EQ(Tok::FromVocab({}, {}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Tok::FromVocab({"<unk>", "<s>", "</s>"}, {0, 0}, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Tok::FromVocab({"<unk>", "<s>", "</s>"}, {0, 0, 0}, {0, 1, 3}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Tok::FromVocab({"a", "b"}, {0, 0}, {-1, -1, -1}, {TokenType::kNormal}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Tok::FromVocab({"a", "b"}, {0, 0}, {-1, -1, -1}, {TokenType::kNormal, TokenType::kByte})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Tok::FromVocab({"a"}, {std::numeric_limits<float>::infinity()}, {-1, -1, -1}).status().code(),
      StatusCode::kInvalidArgument);
}

// ---- encoding --------------------------------------------------------------------------------

TEST(Llama2cTokenizerEncodeTest, Llama2KnownVector) {
  LOAD_LLAMA2_OR_SKIP(tok);
  auto ids = tok->Encode("I believe the meaning of life is", /*add_bos=*/true);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, (Ids{1, 306, 4658, 278, 6593, 310, 2834, 338}));
  auto no_bos = tok->Encode("I believe the meaning of life is", /*add_bos=*/false);
  ASSERT_TRUE(no_bos.ok());
  EXPECT_EQ(*no_bos, (Ids{306, 4658, 278, 6593, 310, 2834, 338}));
}

TEST(Llama2cTokenizerEncodeTest, EmptyText) {
  auto tok = MustLoad(testing::Stories260KTokenizer(), 512);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Encode("", true), (Ids{1}));
  EXPECT_EQ(*tok->Encode("", false), (Ids{}));
}

// Ids that the sentencepiece library itself produced (tests/reference/
// make_sentencepiece_vectors.py). The Llama 2 model's normalizer is the identity with a dummy
// prefix, so llama2.c's algorithm must agree exactly on valid UTF-8; the script records in
// "excluded" the inputs where the two legitimately differ (invalid UTF-8: SentencePiece
// substitutes U+FFFD, llama2.c keeps the bytes), and for those we check llama2.c's ids.
TEST(Llama2cTokenizerEncodeTest, MatchesSentencePiece) {
  LOAD_LLAMA2_OR_SKIP(tok);
  auto text =
      ReadFileToString(testing::SourcePath("tests/data/tokenizer/llama2_sentencepiece_ids.json"));
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const nlohmann::json data = nlohmann::json::parse(*text);
  ASSERT_GE(data["cases"].size(), 40u);
  auto input = [](const nlohmann::json& c) {
    return c.contains("text_hex") ? FromHex(c["text_hex"].get<std::string>())
                                  : c["text"].get<std::string>();
  };
  for (const auto& c : data["cases"]) {
    const std::string s = input(c);
    auto ids = tok->Encode(s, /*add_bos=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, c["ids"].get<Ids>()) << "text: " << s;
    EXPECT_EQ(tok->Decode(*ids), s);
  }
  for (const auto& c : data["excluded"]) {
    const std::string s = input(c);
    auto ids = tok->Encode(s, /*add_bos=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, c["llama2c_ids"].get<Ids>()) << "text: " << s;
    EXPECT_NE(*ids, c["sentencepiece_ids"].get<Ids>()) << "no longer differs; move to cases";
    EXPECT_EQ(tok->Decode(*ids), s);
  }
}

// The prompts of the stories260K reference vectors (tests/reference/llama2c_reference.py, an
// independent Python implementation of llama2.c's encoder), and llama2.c's own published output
// (expected_greedy_200.txt) decoded from the reference's greedy tokens.
TEST(Llama2cTokenizerEncodeTest, MatchesStories260KReferenceVectors) {
  auto tok = MustLoad(testing::Stories260KTokenizer(), 512);
  ASSERT_NE(tok, nullptr);
  auto text = ReadFileToString(testing::SourcePath("tests/data/stories260K/reference_greedy.json"));
  if (!text.ok()) GTEST_SKIP() << text.status().ToString();
  const nlohmann::json data = nlohmann::json::parse(*text);
  for (const auto& c : data["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    auto ids = tok->Encode(prompt, /*add_bos=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, c["prompt_tokens"].get<Ids>()) << "prompt: " << prompt;
    if (prompt.empty() && c["generated_tokens"].size() == 200) {
      auto expected =
          ReadFileToString(testing::SourcePath("tests/data/stories260K/expected_greedy_200.txt"));
      ASSERT_TRUE(expected.ok()) << expected.status().ToString();
      Ids all = *ids;
      for (int32_t id : c["generated_tokens"].get<Ids>()) all.push_back(id);
      EXPECT_EQ(tok->Decode(all), *expected);
    }
  }
}

void ExpectMatchesOracle(const Llama2cTokenizer& tok, uint32_t seed, int count, int max_parts) {
  const Oracle oracle(tok);
  std::mt19937 rng(seed);
  for (int i = 0; i < count; ++i) {
    const std::string s = RandomText(rng, max_parts);
    auto ids = tok.Encode(s, /*add_bos=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    ASSERT_EQ(*ids, oracle.Encode(s)) << "text: " << s;
  }
}

TEST(Llama2cTokenizerEncodeTest, MatchesNaiveRuleStories260K) {
  auto tok = MustLoad(testing::Stories260KTokenizer(), 512);
  ASSERT_NE(tok, nullptr);
  ExpectMatchesOracle(*tok, 1, 400, 40);
}

TEST(Llama2cTokenizerEncodeTest, MatchesNaiveRuleLlama2) {
  LOAD_LLAMA2_OR_SKIP(tok);
  ExpectMatchesOracle(*tok, 2, 300, 40);
}

// A small hand-made vocabulary pins the rules down: highest score first, leftmost on ties,
// no dummy prefix without a " " piece, <unk> without byte tokens.
TEST(Llama2cTokenizerEncodeTest, MergeOrderOnSmallVocab) {
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "a", "b", "ab", "ba", "aba"};
  //                                         0        1      2      3    4    5     6     7
  auto equal = Llama2cTokenizer::FromVocab(pieces, {0, 0, 0, -1, -1, -5, -5, -9}, {});
  ASSERT_TRUE(equal.ok()) << equal.status().ToString();
  const Llama2cTokenizer& eq = **equal;
  EXPECT_EQ(*eq.Encode("bab", false), (Ids{6, 4}));   // ba|ab tie: leftmost "ba" wins
  EXPECT_EQ(*eq.Encode("aba", false), (Ids{7}));      // ab, then ab+a = aba
  EXPECT_EQ(*eq.Encode("abab", false), (Ids{5, 5}));  // ab@0, then ab@2 (-5) before aba (-9)
  auto ab_better = Llama2cTokenizer::FromVocab(pieces, {0, 0, 0, -1, -1, -4, -5, -9}, {});
  ASSERT_TRUE(ab_better.ok());
  EXPECT_EQ(*(*ab_better)->Encode("bab", false), (Ids{4, 5}));  // the better pair, not leftmost
  auto ba_better = Llama2cTokenizer::FromVocab(pieces, {0, 0, 0, -1, -1, -5, -4, -9}, {});
  ASSERT_TRUE(ba_better.ok());
  EXPECT_EQ(*(*ba_better)->Encode("abab", false), (Ids{7, 4}));  // ba@1, then a+ba = aba
  for (const Llama2cTokenizer* tok : {&eq, static_cast<const Llama2cTokenizer*>(ba_better->get()),
                                      static_cast<const Llama2cTokenizer*>(ab_better->get())}) {
    const Oracle oracle(*tok);
    for (const char* s : {"a", "ab", "ba", "aab", "abba", "ababab", "bababa", "aabbaabb"}) {
      EXPECT_EQ(*tok->Encode(s, false), oracle.Encode(s)) << s;
    }
  }
  // No byte tokens: an unknown character is one <unk>. No " " piece: no dummy prefix, and a
  // space in the text is unknown.
  EXPECT_EQ(*eq.Encode("a\xE4\xB8\x96", false), (Ids{3, 0}));
  EXPECT_EQ(*eq.Encode(" a", false), (Ids{0, 3}));
  EXPECT_EQ(*eq.Encode("a", true), (Ids{1, 3}));
  EXPECT_EQ(eq.Decode(Ids{1, 3, 5}), "aab");
}

TEST(Llama2cTokenizerEncodeTest, NoUnkAndNoByteTokensIsAnError) {
  auto tok = Llama2cTokenizer::FromVocab({"a", "b"}, {0, 0}, {-1, -1, -1});
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(*(*tok)->Encode("ab", true), (Ids{0, 1}));  // no BOS in this vocabulary
  auto bad = (*tok)->Encode("abc", false);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
}

TEST(Llama2cTokenizerEncodeTest, ByteFallbackUsesByteTokens) {
  auto tok = MustLoad(testing::Stories260KTokenizer(), 512);
  ASSERT_NE(tok, nullptr);
  // U+1F355 has no piece in a 512-token vocabulary: the dummy prefix alone, then 4 bytes.
  auto ids = tok->Encode("\xF0\x9F\x8D\x95", false);
  ASSERT_TRUE(ids.ok());
  const int32_t space = 410;  // " " in tok512.bin
  EXPECT_EQ(*ids, (Ids{space, 0xF0 + 3, 0x9F + 3, 0x8D + 3, 0x95 + 3}));
}

TEST(Llama2cTokenizerEncodeTest, ParseSpecial) {
  LOAD_LLAMA2_OR_SKIP(tok);
  // With parse_special, "<s>" and "</s>" are BOS and EOS; each text fragment after a special
  // token gets its own dummy prefix (SentencePiece encoding the fragment alone; llama.cpp).
  auto ids = tok->Encode("<s>Hello</s>", false, /*parse_special=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (Ids{1, 15043, 2}));
  auto hello = tok->Encode("Hello", false);
  auto world = tok->Encode("world", false);
  Ids expected = *hello;
  expected.push_back(2);
  expected.push_back(1);
  expected.insert(expected.end(), world->begin(), world->end());
  EXPECT_EQ(*tok->Encode("Hello</s><s>world", false, true), expected);
  // Without parse_special it is ordinary text.
  auto plain = tok->Encode("<s>Hello</s>", false, /*parse_special=*/false);
  ASSERT_TRUE(plain.ok());
  for (int32_t id : *plain) {
    EXPECT_FALSE(tok->IsSpecial(id)) << id;
  }
  EXPECT_EQ(tok->Decode(*plain), "<s>Hello</s>");
  // "<unk>" is not a control token and stays text; a lone "<" too.
  auto unk = tok->Encode("<unk> <", false, true);
  ASSERT_TRUE(unk.ok());
  EXPECT_EQ(*unk, *tok->Encode("<unk> <", false, false));
}

// ---- decoding --------------------------------------------------------------------------------

TEST(Llama2cTokenizerDecodeTest, TokenBytes) {
  LOAD_LLAMA2_OR_SKIP(tok);
  EXPECT_EQ(tok->TokenBytes(1, 306), "I");     // dummy prefix dropped after BOS
  EXPECT_EQ(tok->TokenBytes(-1, 306), "I");    // and at the start of text
  EXPECT_EQ(tok->TokenBytes(306, 306), " I");  // kept elsewhere
  EXPECT_EQ(tok->TokenBytes(2, 306), " I");    // EOS is not BOS
  EXPECT_EQ(tok->TokenBytes(1, 29871), "");    // the prefix alone
  EXPECT_EQ(tok->TokenBytes(306, 1), "");      // control tokens: nothing
  EXPECT_EQ(tok->TokenBytes(306, 2), "");
  EXPECT_EQ(tok->TokenBytes(306, 0), " \xE2\x81\x87 ");  // <unk> as SentencePiece shows it
  EXPECT_EQ(tok->TokenBytes(306, 13), "\n");             // <0x0A>
  EXPECT_EQ(tok->TokenBytes(1, 3 + 0x20), " ");          // a byte token keeps its byte
  EXPECT_EQ(tok->TokenBytes(306, 258), "\xFF");
  EXPECT_EQ(tok->TokenBytes(306, -1), "");
  EXPECT_EQ(tok->TokenBytes(306, 32000), "");
  EXPECT_EQ(tok->TokenPiece(32000), "");
  EXPECT_TRUE(tok->IsSpecial(1));
  EXPECT_TRUE(tok->IsSpecial(2));
  EXPECT_FALSE(tok->IsSpecial(0));
  EXPECT_FALSE(tok->IsSpecial(306));
  EXPECT_FALSE(tok->IsSpecial(13));
  EXPECT_EQ(tok->Decode(Ids{1, 306, 4658, 278, 6593, 310, 2834, 338}),
            "I believe the meaning of life is");
}

// Decode(Encode(s)) == s, with and without BOS: Encode adds one dummy-prefix space and
// Decode drops exactly one, so leading spaces of s survive too. Also checks that the encoding
// is not trivially byte-level (the dummy prefix is there, pieces are multi-byte) and that
// streaming through Utf8StreamDecoder gives the same text for valid UTF-8.
void ExpectRoundTrips(const Llama2cTokenizer& tok, const std::string& s) {
  SCOPED_TRACE("text: " + s);
  for (bool bos : {true, false}) {
    auto ids = tok.Encode(s, bos);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(tok.Decode(*ids), s);
    if (bos) {
      ASSERT_FALSE(ids->empty());
      EXPECT_EQ((*ids)[0], tok.bos_id());
    }
    if (!s.empty()) {
      const int32_t first = (*ids)[bos ? 1 : 0];
      EXPECT_EQ(tok.TokenPiece(first).substr(0, 1), " ") << "dummy prefix missing";
    }
    // Token by token through the stream decoder.
    Utf8StreamDecoder stream;
    std::string streamed;
    int32_t prev = -1;
    for (int32_t id : *ids) {
      streamed += stream.Push(tok.TokenBytes(prev, id));
      prev = id;
    }
    streamed += stream.Flush();
    Utf8StreamDecoder whole;
    std::string expected = whole.Push(s);
    expected += whole.Flush();
    EXPECT_EQ(streamed, expected);
  }
}

TEST(Llama2cTokenizerDecodeTest, RoundTripStories260K) {
  auto tok = MustLoad(testing::Stories260KTokenizer(), 512);
  ASSERT_NE(tok, nullptr);
  for (const std::string& s : RoundTripTexts()) ExpectRoundTrips(*tok, s);
  std::mt19937 rng(3);
  for (int i = 0; i < 300; ++i) ExpectRoundTrips(*tok, RandomText(rng, 30));
}

TEST(Llama2cTokenizerDecodeTest, RoundTripLlama2) {
  LOAD_LLAMA2_OR_SKIP(tok);
  for (const std::string& s : RoundTripTexts()) ExpectRoundTrips(*tok, s);
  std::mt19937 rng(4);
  for (int i = 0; i < 300; ++i) ExpectRoundTrips(*tok, RandomText(rng, 30));
  // The round trip is not vacuous: ordinary English takes far fewer tokens than bytes.
  const std::string prose = RoundTripTexts()[10];
  EXPECT_LT(tok->Encode(prose, false)->size(), prose.size() / 3);
}

// ---- speed -----------------------------------------------------------------------------------

double EncodeSeconds(const Llama2cTokenizer& tok, const std::string& text, Ids* ids) {
  const auto start = std::chrono::steady_clock::now();
  auto result = tok.Encode(text, true);
  const auto end = std::chrono::steady_clock::now();
  EXPECT_TRUE(result.ok());
  if (result.ok()) *ids = std::move(result).value();
  return std::chrono::duration<double>(end - start).count();
}

TEST(Llama2cTokenizerSpeedTest, Encodes100KBQuickly) {
  std::string path = testing::Llama2TokenizerBin();
  int32_t vocab = 32000;
  if (path.empty()) path = testing::Stories260KTokenizer(), vocab = 512;
  auto tok = MustLoad(path, vocab);
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(5);
  std::string prose;
  while (prose.size() < 100 * 1024) prose += RandomText(rng, 20) + " ";
  const std::string spaces(100 * 1024, ' ');  // one long chain of merges
  const std::string letters(100 * 1024, 'a');
  const std::string* texts[] = {&prose, &spaces, &letters};
  for (const std::string* text : texts) {
    Ids ids;
    const double seconds = EncodeSeconds(*tok, *text, &ids);
    std::cout << "[ speed    ] " << text->size() << " bytes -> " << ids.size() << " tokens in "
              << seconds * 1e3 << " ms (" << path << ")\n";
    EXPECT_LT(seconds, 1.0);
    EXPECT_EQ(tok->Decode(ids), *text);
  }
}

}  // namespace
}  // namespace specinfer
