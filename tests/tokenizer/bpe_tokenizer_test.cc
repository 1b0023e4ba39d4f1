// Byte-level BPE tokenizer: exact ids against Hugging Face `tokenizers` for every corpus string
// and four pre-tokenizers (tests/reference/make_bpe_vectors.py made the vectors), the
// pre-tokenizer's word splits, round trips, loaders and their errors, and throughput.
#include "tokenizer/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "model/gguf.h"
#include "test_util.h"

namespace specinfer {
namespace {

using Json = nlohmann::json;
using specinfer::testing::SourcePath;

std::string TokenizerJsonPath() {
  return SourcePath("tests/data/tokenizer/smollm2/tokenizer.json");
}
std::string GgufPath() { return SourcePath("models/SmolLM2-135M-Instruct.Q4_1.gguf"); }

Json ReadJson(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return Json::parse(f);
}

std::string Join(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

std::string Pieces(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s.append("[").append(tok.TokenPiece(id)).append("]");
  return s;
}

// Concatenated TokenBytes (what Tokenizer::Decode does), kept local to this test.
std::string DecodeBytes(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  int32_t prev = -1;
  for (int32_t id : ids) {
    out += tok.TokenBytes(prev, id);
    prev = id;
  }
  return out;
}

struct Shared {
  std::unique_ptr<BpeTokenizer> smollm;  // from tokenizer.json
  BpeVocab vocab;                        // the same, as data
  std::map<std::string, std::string> texts;
  std::vector<std::string> names;  // corpus order
  Json reference;
};

Shared* g_shared = nullptr;

class BpeTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (g_shared != nullptr) return;
    auto s = std::make_unique<Shared>();
    auto tok = BpeTokenizer::FromTokenizerJson(TokenizerJsonPath());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    s->smollm = std::move(tok).value();
    auto vocab = BpeTokenizer::ReadTokenizerJson(TokenizerJsonPath());
    ASSERT_TRUE(vocab.ok()) << vocab.status().ToString();
    s->vocab = std::move(vocab).value();
    const Json corpus = ReadJson(SourcePath("tests/data/tokenizer/corpus.json"));
    for (const Json& e : corpus.at("strings")) {
      s->names.push_back(e["name"].get<std::string>());
      s->texts[s->names.back()] = e["text"].get<std::string>();
    }
    s->reference = ReadJson(SourcePath("tests/data/tokenizer/smollm2_ids.json"));
    ASSERT_GT(s->names.size(), 200u);
    g_shared = s.release();
  }
  void SetUp() override { ASSERT_NE(g_shared, nullptr); }

  static const BpeTokenizer& Smollm() { return *g_shared->smollm; }

  static std::unique_ptr<BpeTokenizer> Variant(const std::string& name) {
    BpeVocab v = g_shared->vocab;
    v.ignore_merges = false;
    if (name == "smollm") v.pre = PreTokenizer::kSmolLM;
    if (name == "gpt2") v.pre = PreTokenizer::kGpt2;
    if (name == "llama3") v.pre = PreTokenizer::kLlama3, v.ignore_merges = true;
    if (name == "qwen2") v.pre = PreTokenizer::kQwen2;
    auto tok = BpeTokenizer::Create(std::move(v));
    EXPECT_TRUE(tok.ok()) << tok.status().ToString();
    return tok.ok() ? std::move(tok).value() : nullptr;
  }

  // Encodes every reference row of `variant` with `tok`; returns the number of mismatches.
  static int CheckEncodings(const Tokenizer& tok, const std::string& variant) {
    int rows = 0;
    int bad = 0;
    for (const Json& row : g_shared->reference["variants"][variant]["encodings"]) {
      const std::string name = row["name"].get<std::string>();
      const bool ps = row["parse_special"].get<bool>();
      const auto expected = row["ids"].get<std::vector<int32_t>>();
      auto got = tok.Encode(g_shared->texts.at(name), /*add_bos=*/false, ps);
      ++rows;
      if (!got.ok()) {
        ADD_FAILURE() << variant << " " << name << ": " << got.status().ToString();
        ++bad;
        continue;
      }
      if (*got != expected) {
        ++bad;
        ADD_FAILURE() << variant << " " << name << " parse_special=" << ps << "\n  expected "
                      << Join(expected) << "\n           " << Pieces(tok, expected)
                      << "\n  got      " << Join(*got) << "\n           " << Pieces(tok, *got);
      }
    }
    EXPECT_GT(rows, 400) << "reference vectors missing for " << variant;
    std::printf("[ conformance ] %-7s %d/%d rows match Hugging Face tokenizers\n", variant.c_str(),
                rows - bad, rows);
    return bad;
  }

  // Bytes whose byte-level symbol the vocabulary lacks (dropped by encoding).
  static std::string Droppable(const BpeTokenizer& tok, std::string_view s) {
    std::string out;
    for (char c : s) {
      if (tok.TokenId(BpeTokenizer::ByteLevelEncode(std::string_view(&c, 1))) >= 0) out += c;
    }
    return out;
  }
};

// ---- the loaded vocabulary ----------------------------------------------------------------------

TEST_F(BpeTokenizerTest, SmolLM2Metadata) {
  const BpeTokenizer& tok = Smollm();
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(g_shared->vocab.merges.size(), 48900u);
  EXPECT_EQ(tok.pre_tokenizer(), PreTokenizer::kSmolLM);
  EXPECT_EQ(tok.bos_id(), 1);  // tokenizer_config.json: <|im_start|>
  EXPECT_EQ(tok.eos_id(), 2);  // <|im_end|>
  EXPECT_FALSE(tok.add_bos_by_default());
  EXPECT_EQ(tok.TokenPiece(1), "<|im_start|>");
  EXPECT_EQ(tok.TokenPiece(504), g_shared->vocab.tokens[504]);
  for (int id = 0; id <= 16; ++id) EXPECT_TRUE(tok.IsSpecial(id)) << id;
  EXPECT_FALSE(tok.IsSpecial(17));
  EXPECT_FALSE(tok.IsSpecial(-1));
  EXPECT_FALSE(tok.IsSpecial(49152));
  EXPECT_EQ(tok.TokenBytes(-1, 1), "");  // control tokens contribute nothing
  EXPECT_EQ(tok.TokenBytes(-1, 99999), "");
  EXPECT_EQ(tok.TokenPiece(-5), "");
  const int32_t the = tok.TokenId("Ġthe");
  ASSERT_GE(the, 0);
  EXPECT_EQ(tok.TokenBytes(-1, the), " the");
  EXPECT_EQ(tok.TokenId("no such token"), -1);
}

TEST_F(BpeTokenizerTest, AddBos) {
  auto ids = Smollm().Encode("Hello", /*add_bos=*/true);
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 2u);
  EXPECT_EQ((*ids)[0], 1);
  auto plain = Smollm().Encode("Hello", false);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(std::vector<int32_t>(ids->begin() + 1, ids->end()), *plain);
  auto empty = Smollm().Encode("", true);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, std::vector<int32_t>{1});
}

// ---- conformance --------------------------------------------------------------------------------

TEST_F(BpeTokenizerTest, SmolLM2MatchesReference) {
  EXPECT_EQ(CheckEncodings(Smollm(), "smollm"), 0);
}

TEST_F(BpeTokenizerTest, Gpt2PreTokenizerMatchesReference) {
  auto tok = Variant("gpt2");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(CheckEncodings(*tok, "gpt2"), 0);
}

TEST_F(BpeTokenizerTest, Llama3PreTokenizerMatchesReference) {
  auto tok = Variant("llama3");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(CheckEncodings(*tok, "llama3"), 0);
}

TEST_F(BpeTokenizerTest, Qwen2PreTokenizerMatchesReference) {
  auto tok = Variant("qwen2");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(CheckEncodings(*tok, "qwen2"), 0);
}

// The word splits themselves, against Hugging Face's pre_tokenize_str: this checks the PCRE2
// patterns against Oniguruma's even where the vocabulary would hide a difference.
TEST_F(BpeTokenizerTest, PreTokenizerSplitsMatchReference) {
  for (const std::string variant : {"smollm", "gpt2", "llama3", "qwen2"}) {
    auto tok = Variant(variant);
    ASSERT_NE(tok, nullptr);
    int bad = 0;
    const Json& pieces = g_shared->reference["variants"][variant]["pieces"];
    for (const std::string& name : g_shared->names) {
      const auto expected = pieces.at(name).get<std::vector<std::string>>();
      auto words = tok->PreTokenize(g_shared->texts.at(name));
      ASSERT_TRUE(words.ok()) << words.status().ToString();
      std::vector<std::string> got;
      for (const std::string& w : *words) got.push_back(BpeTokenizer::ByteLevelEncode(w));
      if (got != expected) {
        ++bad;
        std::string e, g;
        for (const auto& p : expected) e.append("[").append(p).append("]");
        for (const auto& p : got) g.append("[").append(p).append("]");
        ADD_FAILURE() << variant << " " << name << "\n  expected " << e << "\n  got      " << g;
      }
    }
    EXPECT_EQ(bad, 0) << variant;
  }
}

// ---- loaders agree ------------------------------------------------------------------------------

// FromGgufVocab, fed what a GGUF holds (token strings, "a b" merges, token types), encodes like
// FromTokenizerJson.
TEST_F(BpeTokenizerTest, FromGgufVocabMatchesTokenizerJson) {
  const BpeVocab& v = g_shared->vocab;
  std::vector<std::string_view> tokens(v.tokens.begin(), v.tokens.end());
  std::vector<std::string> merge_strings;
  for (const auto& [a, b] : v.merges) merge_strings.push_back(a + " " + b);
  std::vector<std::string_view> merges(merge_strings.begin(), merge_strings.end());
  std::vector<int32_t> types(tokens.size(), 1);
  for (int32_t id : v.special_ids) types[id] = 3;
  auto tok = BpeTokenizer::FromGgufVocab(tokens, merges, types, 1, 2, false, "smollm");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_FALSE((*tok)->add_bos_by_default());
  EXPECT_EQ(CheckEncodings(**tok, "smollm"), 0);
}

// The real model file through the project's GGUF reader (skipped where models/ is absent).
TEST_F(BpeTokenizerTest, FromRealGgufMatchesReference) {
  if (!std::filesystem::exists(GgufPath())) GTEST_SKIP() << GgufPath() << " not present";
  auto gguf = GgufFile::Open(GgufPath());
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  const GgufFile& f = **gguf;
  auto model = f.GetString("tokenizer.ggml.model");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(*model, "gpt2");
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  auto merges = f.GetStringArray("tokenizer.ggml.merges");
  auto types = f.GetI32Array("tokenizer.ggml.token_type");
  auto bos = f.GetU32("tokenizer.ggml.bos_token_id");
  auto eos = f.GetU32("tokenizer.ggml.eos_token_id");
  auto add_bos = f.GetBool("tokenizer.ggml.add_bos_token", false);
  auto pre = f.GetString("tokenizer.ggml.pre");
  ASSERT_TRUE(tokens.ok() && merges.ok() && types.ok() && bos.ok() && eos.ok() && add_bos.ok() &&
              pre.ok());
  auto tok = BpeTokenizer::FromGgufVocab(*tokens, *merges, *types, static_cast<int32_t>(*bos),
                                         static_cast<int32_t>(*eos), *add_bos, *pre);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  EXPECT_EQ((*tok)->pre_tokenizer(), PreTokenizer::kSmolLM);
  EXPECT_FALSE((*tok)->add_bos_by_default());
  EXPECT_EQ(CheckEncodings(**tok, "smollm"), 0);
}

// ---- round trips --------------------------------------------------------------------------------

TEST_F(BpeTokenizerTest, CorpusRoundTrips) {
  const BpeTokenizer& tok = Smollm();
  for (const std::string& name : g_shared->names) {
    const std::string& text = g_shared->texts.at(name);
    auto ids = tok.Encode(text, false, /*parse_special=*/false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(DecodeBytes(tok, *ids), Droppable(tok, text)) << name;
  }
}

std::string RandomUtf8(std::mt19937& rng, size_t max_chars) {
  static const std::vector<std::pair<uint32_t, uint32_t>> kRanges = {
      {0x20, 0x7E},     {0x20, 0x20},     {0x30, 0x39},       {0x27, 0x27},       {0x09, 0x0D},
      {0x00, 0x1F},     {0x80, 0x2FF},    {0x300, 0x36F},     {0x400, 0x4FF},     {0x600, 0x6FF},
      {0x900, 0x97F},   {0x2000, 0x206F}, {0x3000, 0x30FF},   {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3},
      {0xE000, 0xF8FF}, {0xFF00, 0xFFFF}, {0x1F300, 0x1FAFF}, {0x10000, 0x10FFFF}};
  std::uniform_int_distribution<size_t> len_dist(0, max_chars);
  std::uniform_int_distribution<size_t> range_dist(0, kRanges.size() - 1);
  std::string s;
  const size_t n = len_dist(rng);
  for (size_t i = 0; i < n; ++i) {
    const auto [lo, hi] = kRanges[range_dist(rng)];
    uint32_t cp = std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return s;
}

TEST_F(BpeTokenizerTest, RandomUtf8RoundTrips) {
  std::mt19937 rng(1234);
  for (const std::string variant : {"smollm", "gpt2", "llama3", "qwen2"}) {
    auto tok = Variant(variant);
    ASSERT_NE(tok, nullptr);
    for (int i = 0; i < 400; ++i) {
      const std::string s = RandomUtf8(rng, 60);
      auto ids = tok->Encode(s, false, false);
      ASSERT_TRUE(ids.ok());
      ASSERT_EQ(DecodeBytes(*tok, *ids), Droppable(*tok, s)) << variant << " case " << i;
    }
  }
}

// Arbitrary bytes, invalid UTF-8 included, encode without error and decode back to themselves
// (less the bytes the vocabulary has no symbol for).
TEST_F(BpeTokenizerTest, ArbitraryBytesRoundTrip) {
  const BpeTokenizer& tok = Smollm();
  std::mt19937 rng(99);
  for (int i = 0; i < 2000; ++i) {
    std::string s(std::uniform_int_distribution<int>(0, 40)(rng), '\0');
    for (char& c : s) {
      // Mostly ASCII with some high bytes, so that valid and invalid runs interleave.
      c = static_cast<char>(std::uniform_int_distribution<int>(0, 3)(rng) == 0
                                ? std::uniform_int_distribution<int>(0x80, 0xFF)(rng)
                                : std::uniform_int_distribution<int>(0x00, 0x7F)(rng));
    }
    for (bool ps : {false, true}) {
      auto ids = tok.Encode(s, false, ps);
      ASSERT_TRUE(ids.ok()) << ids.status().ToString();
      ASSERT_EQ(DecodeBytes(tok, *ids), Droppable(tok, s)) << "case " << i;
    }
  }
  // Each byte of an ill-formed sequence is its own byte-level token.
  auto ids = tok.Encode("a\xC3(b\xE2\x82", false);
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> expected;
  for (std::string_view w : {"a", "\xC3", "(", "b", "\xE2", "\x82"}) {
    expected.push_back(tok.TokenId(BpeTokenizer::ByteLevelEncode(w)));
  }
  EXPECT_EQ(*ids, expected) << Pieces(tok, *ids);
}

TEST_F(BpeTokenizerTest, SpecialTokensOnlyWhenParsed) {
  const BpeTokenizer& tok = Smollm();
  auto on = tok.Encode("<|im_start|>user\nhi<|im_end|>", false, true);
  ASSERT_TRUE(on.ok());
  EXPECT_EQ(on->front(), 1);
  EXPECT_EQ(on->back(), 2);
  auto off = tok.Encode("<|im_start|>user\nhi<|im_end|>", false, false);
  ASSERT_TRUE(off.ok());
  for (int32_t id : *off) EXPECT_FALSE(tok.IsSpecial(id)) << id;
  EXPECT_EQ(DecodeBytes(tok, *off), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(DecodeBytes(tok, *on), "user\nhi");
}

TEST_F(BpeTokenizerTest, ConcurrentEncodesAgree) {
  const BpeTokenizer& tok = Smollm();
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& name : g_shared->names) {
    expected.push_back(*tok.Encode(g_shared->texts.at(name), false, true));
  }
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        for (size_t i = 0; i < g_shared->names.size(); ++i) {
          auto ids = tok.Encode(g_shared->texts.at(g_shared->names[i]), false, true);
          if (!ids.ok() || *ids != expected[i]) ++bad[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}

// ---- a small synthetic tokenizer.json: formats and options --------------------------------------

// 256 byte-level symbols (ids 0..255 in byte order), then merged tokens, then added tokens.
Json SmallTokenizerJson(bool string_merges) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[BpeTokenizer::ByteLevelEncode(std::string(1, static_cast<char>(b)))] = b;
  }
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}};
  int next = 256;
  Json merge_list = Json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    if (string_merges) {
      merge_list.push_back(a + " " + b);
    } else {
      merge_list.push_back(Json::array({a, b}));
    }
  }
  Json doc;
  doc["version"] = "1.0";
  doc["added_tokens"] = Json::array({{{"id", 261}, {"content", "<s>"}, {"special", true}},
                                     {{"id", 262}, {"content", "<user>"}, {"special", false}}});
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  doc["post_processor"] = nullptr;
  doc["model"] = {{"type", "BPE"},       {"dropout", nullptr},     {"unk_token", nullptr},
                  {"fuse_unk", false},   {"byte_fallback", false}, {"vocab", vocab},
                  {"merges", merge_list}};
  return doc;
}

std::unique_ptr<BpeTokenizer> MustCreate(const Json& doc, std::string_view config = {}) {
  auto v = BpeTokenizer::ParseTokenizerJson(doc.dump(), config);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  if (!v.ok()) return nullptr;
  auto tok = BpeTokenizer::Create(std::move(v).value());
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

TEST(BpeTokenizerJsonTest, StringAndArrayMergesAgree) {
  for (bool string_merges : {true, false}) {
    auto tok = MustCreate(SmallTokenizerJson(string_merges));
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->vocab_size(), 263);
    EXPECT_EQ(tok->pre_tokenizer(), PreTokenizer::kGpt2);
    auto ids = tok->Encode("hello world", false);
    ASSERT_TRUE(ids.ok());
    // hello, Ġw, o, r, l, d
    EXPECT_EQ(*ids, (std::vector<int32_t>{259, 260, 'o', 'r', 'l', 'd'}));
    // Added tokens: <s> only with parse_special; <user> (not special) always.
    auto a = tok->Encode("<s>hello<user>", false, false);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(*a, (std::vector<int32_t>{'<', 's', '>', 259, 262}));
    auto b = tok->Encode("<s>hello<user>", false, true);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*b, (std::vector<int32_t>{261, 259, 262}));
    EXPECT_TRUE(tok->IsSpecial(261));
    EXPECT_FALSE(tok->IsSpecial(262));
    EXPECT_EQ(tok->TokenBytes(-1, 262), "<user>");
    EXPECT_EQ(tok->TokenBytes(-1, 261), "");
    EXPECT_EQ(tok->bos_id(), -1);
  }
}

TEST(BpeTokenizerJsonTest, BosFromConfigAndTemplate) {
  Json doc = SmallTokenizerJson(false);
  doc["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", Json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}};
  auto tok = MustCreate(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 261);
  EXPECT_TRUE(tok->add_bos_by_default());
  auto tok2 = MustCreate(doc, R"({"bos_token": {"content": "<s>"}, "eos_token": "<s>",
                                  "add_bos_token": false})");
  ASSERT_NE(tok2, nullptr);
  EXPECT_EQ(tok2->bos_id(), 261);
  EXPECT_EQ(tok2->eos_id(), 261);
  EXPECT_FALSE(tok2->add_bos_by_default());
}

TEST(BpeTokenizerJsonTest, PreTokenizerDetection) {
  Json doc = SmallTokenizerJson(false);
  auto split = [](const std::string& regex) {
    return Json{{"type", "Sequence"},
                {"pretokenizers", Json::array({{{"type", "Split"},
                                                {"pattern", {{"Regex", regex}}},
                                                {"behavior", "Isolated"},
                                                {"invert", false}},
                                               {{"type", "ByteLevel"},
                                                {"add_prefix_space", false},
                                                {"trim_offsets", true},
                                                {"use_regex", false}}})}};
  };
  doc["pre_tokenizer"] = split(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
                               R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  auto tok = MustCreate(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->pre_tokenizer(), PreTokenizer::kLlama3);
  doc["pre_tokenizer"] = split(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                               R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  tok = MustCreate(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->pre_tokenizer(), PreTokenizer::kQwen2);
  doc["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array({{{"type", "Digits"}, {"individual_digits", true}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
  tok = MustCreate(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->pre_tokenizer(), PreTokenizer::kSmolLM);

  doc["pre_tokenizer"] = split("\\s+");  // some other regex
  auto v = BpeTokenizer::ParseTokenizerJson(doc.dump());
  EXPECT_EQ(v.status().code(), StatusCode::kUnimplemented) << v.status().ToString();
  doc["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
  v = BpeTokenizer::ParseTokenizerJson(doc.dump());
  EXPECT_EQ(v.status().code(), StatusCode::kUnimplemented) << v.status().ToString();
  doc["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
  v = BpeTokenizer::ParseTokenizerJson(doc.dump());
  EXPECT_EQ(v.status().code(), StatusCode::kUnimplemented) << v.status().ToString();
}

TEST(BpeTokenizerJsonTest, LoaderErrorsAreStatuses) {
  auto code_of = [](const std::string& text) {
    auto v = BpeTokenizer::ParseTokenizerJson(text);
    if (!v.ok()) return v.status().code();
    auto tok = BpeTokenizer::Create(std::move(v).value());
    return tok.status().code();
  };
  EXPECT_EQ(code_of("{not json"), StatusCode::kDataLoss);
  EXPECT_EQ(code_of(""), StatusCode::kDataLoss);
  EXPECT_EQ(code_of("[1, 2]"), StatusCode::kDataLoss);
  EXPECT_EQ(code_of("{}"), StatusCode::kDataLoss);

  Json doc = SmallTokenizerJson(false);
  doc["model"].erase("vocab");
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kDataLoss);

  doc = SmallTokenizerJson(false);
  doc["model"].erase("merges");
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kDataLoss);

  doc = SmallTokenizerJson(false);
  doc["model"]["vocab"]["h"] = "not an id";
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kDataLoss);

  // One huge id in a tiny file: refused before anything is sized by it (found writing its fuzz
  // target: the loader allocated 2^31 strings and died of std::bad_alloc).
  doc = SmallTokenizerJson(false);
  doc["model"]["vocab"]["h"] = INT32_MAX - 1;
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kDataLoss);
  doc = SmallTokenizerJson(false);
  doc["added_tokens"] = Json::array({{{"id", 1 << 30}, {"content", "<big>"}}});
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kDataLoss);

  doc = SmallTokenizerJson(false);
  doc["model"]["merges"].push_back(Json::array({"zz", "q"}));    // unknown token
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kInvalidArgument);  // from Create

  doc = SmallTokenizerJson(false);
  doc["model"]["merges"].push_back(Json::array({"o", "r"}));  // "or" is not a token
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kInvalidArgument);

  doc = SmallTokenizerJson(true);
  doc["model"]["merges"].push_back("nospace");
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kDataLoss);

  doc = SmallTokenizerJson(false);
  doc["model"]["merges"].push_back(42);
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kDataLoss);

  doc = SmallTokenizerJson(false);
  doc["model"]["type"] = "Unigram";
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kUnimplemented);
  doc["model"]["type"] = "WordPiece";
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kUnimplemented);

  doc = SmallTokenizerJson(false);
  doc["model"]["byte_fallback"] = true;
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kUnimplemented);

  doc = SmallTokenizerJson(false);
  doc["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kUnimplemented);

  doc = SmallTokenizerJson(false);
  doc["added_tokens"][0]["lstrip"] = true;
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kUnimplemented);

  doc = SmallTokenizerJson(false);
  doc["added_tokens"][0]["id"] = 300;  // leaves ids 261, 263..299 undefined
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kDataLoss);

  doc = SmallTokenizerJson(false);
  doc["added_tokens"][0]["id"] = "x";
  EXPECT_EQ(code_of(doc.dump()), StatusCode::kDataLoss);

  doc = SmallTokenizerJson(false);
  auto v = BpeTokenizer::ParseTokenizerJson(doc.dump(), "{broken");
  EXPECT_EQ(v.status().code(), StatusCode::kDataLoss);
  v = BpeTokenizer::ParseTokenizerJson(doc.dump(), R"({"bos_token": "<nope>"})");
  EXPECT_EQ(v.status().code(), StatusCode::kDataLoss);

  auto missing = BpeTokenizer::FromTokenizerJson("/nonexistent/tokenizer.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(BpeTokenizerJsonTest, FileLoaderMapsInconsistencyToDataLoss) {
  Json doc = SmallTokenizerJson(false);
  doc["model"]["merges"].push_back(Json::array({"zz", "q"}));
  const auto dir = std::filesystem::temp_directory_path() / "bpe_tokenizer_test_bad";
  std::filesystem::create_directories(dir);
  const auto path = (dir / "tokenizer.json").string();
  std::ofstream(path) << doc.dump();
  auto tok = BpeTokenizer::FromTokenizerJson(path);
  EXPECT_EQ(tok.status().code(), StatusCode::kDataLoss) << tok.status().ToString();
  EXPECT_NE(tok.status().message().find("merge"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// SmolLM2's vocabulary is merge-consistent (BPE reaches every token from its own text), so the
// reference vectors cannot show these options; the expected ids were checked with Hugging Face
// tokenizers 0.23 on the same tiny vocabularies.
TEST(BpeTokenizerJsonTest, IgnoreMergesAndUnk) {
  auto tiny = [](Json vocab, Json merges, Json model_extra) {
    Json doc;
    doc["added_tokens"] = Json::array();
    doc["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
    doc["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
    doc["model"].update(model_extra);
    return MustCreate(doc);
  };
  const Json vocab1 = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}};
  for (bool ignore : {false, true}) {
    auto tok = tiny(vocab1, Json::array({"a b"}), {{"ignore_merges", ignore}});
    ASSERT_NE(tok, nullptr);
    const std::vector<int32_t> expected =
        ignore ? std::vector<int32_t>({4}) : std::vector<int32_t>({3, 2});
    EXPECT_EQ(*tok->Encode("abc", false), expected);
    EXPECT_EQ(*tok->Encode("abcab", false), (std::vector<int32_t>{3, 2, 3}));
  }
  const Json vocab2 = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}};
  for (bool fuse : {false, true}) {
    auto tok = tiny(vocab2, Json::array({"a b"}), {{"unk_token", "<unk>"}, {"fuse_unk", fuse}});
    ASSERT_NE(tok, nullptr);
    const std::vector<int32_t> expected =
        fuse ? std::vector<int32_t>({3, 0, 3}) : std::vector<int32_t>({3, 0, 0, 3});
    EXPECT_EQ(*tok->Encode("abzzab", false), expected);
    EXPECT_EQ(*tok->Encode("zab", false), (std::vector<int32_t>{0, 3}));
  }
  // Without an unk token, symbols missing from the vocabulary are dropped.
  auto tok = tiny(vocab2, Json::array({"a b"}), Json::object());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Encode("azb", false), (std::vector<int32_t>{3}));
}

TEST(BpeTokenizerGgufTest, Errors) {
  std::vector<std::string_view> tokens = {"a", "b", "ab"};
  std::vector<std::string_view> merges = {"a b"};
  std::vector<int32_t> types = {1, 1, 1};
  auto ok = BpeTokenizer::FromGgufVocab(tokens, merges, types, -1, -1, std::nullopt, "gpt2");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  auto ids = (*ok)->Encode("abab", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{2, 2}));

  auto bad_pre = BpeTokenizer::FromGgufVocab(tokens, merges, types, -1, -1, false, "default");
  EXPECT_EQ(bad_pre.status().code(), StatusCode::kUnimplemented);
  auto no_pre = BpeTokenizer::FromGgufVocab(tokens, merges, types, -1, -1, false, "");
  EXPECT_EQ(no_pre.status().code(), StatusCode::kUnimplemented);
  std::vector<std::string_view> bad_merges = {"ab"};
  auto m = BpeTokenizer::FromGgufVocab(tokens, bad_merges, types, -1, -1, false, "gpt2");
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  std::vector<std::string_view> unknown_merges = {"a c"};
  m = BpeTokenizer::FromGgufVocab(tokens, unknown_merges, types, -1, -1, false, "gpt2");
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  std::vector<int32_t> short_types = {1};
  m = BpeTokenizer::FromGgufVocab(tokens, merges, short_types, -1, -1, false, "gpt2");
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  m = BpeTokenizer::FromGgufVocab(tokens, merges, types, 7, -1, false, "gpt2");
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  std::vector<std::string_view> none;
  m = BpeTokenizer::FromGgufVocab(none, none, {}, -1, -1, false, "gpt2");
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);

  // llama.cpp's defaults: Llama 3 ignores merges and adds BOS unless the file says otherwise.
  auto l3 = BpeTokenizer::FromGgufVocab(tokens, merges, types, 0, 1, std::nullopt, "llama-bpe");
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ((*l3)->pre_tokenizer(), PreTokenizer::kLlama3);
  EXPECT_TRUE((*l3)->add_bos_by_default());
}

// ---- throughput ---------------------------------------------------------------------------------

TEST_F(BpeTokenizerTest, Throughput) {
  std::string text;
  ASSERT_FALSE(g_shared->names.empty());
  while (text.size() < (1u << 20)) {
    for (const std::string& name : g_shared->names) {
      if (name.rfind("random_", 0) == 0) continue;
      text += g_shared->texts.at(name);
      text += "\n";
    }
  }
  const BpeTokenizer& tok = Smollm();
  for (bool ps : {false, true}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto ids = tok.Encode(text, false, ps);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(ids.ok());
    std::printf(
        "[ throughput  ] %.2f MB mixed text (parse_special=%d) -> %zu tokens in %.3f s: "
        "%.2f MB/s\n",
        text.size() / 1e6, ps, ids->size(), s, text.size() / 1e6 / s);
    EXPECT_LT(s, 20.0);
  }
  // Many short prompts (below the size where Encode keeps a per-call word cache).
  {
    size_t bytes = 0;
    size_t tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 20; ++rep) {
      for (const std::string& name : g_shared->names) {
        const std::string& t = g_shared->texts.at(name);
        auto ids = tok.Encode(t, false, true);
        ASSERT_TRUE(ids.ok());
        bytes += t.size();
        tokens += ids->size();
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ throughput  ] %.2f MB as %zu short prompts -> %zu tokens in %.3f s: %.2f MB/s\n",
                bytes / 1e6, 20 * g_shared->names.size(), tokens, s, bytes / 1e6 / s);
  }
  // Pathological shapes stay near-linear.
  const std::vector<std::pair<std::string, std::string>> shapes = {
      {"200k spaces then x", std::string(200000, ' ') + "x"},
      {"200k newlines+spaces",
       [] {
         std::string s;
         for (int i = 0; i < 50000; ++i) s += " \n \t";
         return s;
       }()},
      {"200k digits", std::string(200000, '7')},
      {"200k '!' then newlines", std::string(200000, '!') + "\n\n\r\n"},
      {"200k \" \\r\\n\"",
       [] {
         std::string s;
         for (int i = 0; i < 66667; ++i) s += " \r\n";
         return s;
       }()},
      {"200k-letter word", std::string(200000, 'a')},
      {"100k x '<|im_'", [] {
         std::string s;
         for (int i = 0; i < 20000; ++i) s += "<|im_";
         return s;
       }()}};
  for (const auto& [label, s] : shapes) {
    for (const std::string variant : {"smollm", "llama3"}) {
      auto v = variant == "smollm" ? nullptr : Variant(variant);
      const BpeTokenizer& t = v ? *v : tok;
      const auto t0 = std::chrono::steady_clock::now();
      auto ids = t.Encode(s, false, true);
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_TRUE(ids.ok()) << label << ": " << ids.status().ToString();
      EXPECT_EQ(DecodeBytes(t, *ids), s) << label;
      std::printf("[ throughput  ] %-22s %-6s %7zu tokens in %.3f s\n", label.c_str(),
                  variant.c_str(), ids->size(), sec);
      EXPECT_LT(sec, 10.0) << label;
    }
  }
}

}  // namespace
}  // namespace specinfer
