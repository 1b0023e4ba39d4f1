#include "model/llama2c_loader.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/mapped_file.h"
#include "model/loader.h"
#include "test_util.h"

namespace specinfer {
namespace {

std::string TempFile(const std::string& name, const std::string& bytes) {
  // This process's own scratch folder: the isa_* ctest entries run this binary beside itself.
  static const std::filesystem::path dir = testing::ScratchDir("specinfer_loader_test");
  auto path = (dir / name).string();
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  return path;
}

std::string ReadAll(const std::string& path) {
  auto s = ReadFileToString(path);
  EXPECT_TRUE(s.ok());
  return s.ok() ? *s : "";
}

TEST(Llama2cLoader, LoadsStories260K) {
  auto m = LoadModel(testing::Stories260KModel());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tied_output);
  const ModelWeights& w = (*m)->weights();
  EXPECT_EQ(w.layers.size(), 5u);
  EXPECT_EQ(w.output.data, w.token_embedding.data);
  EXPECT_EQ(w.layers[0].wk.rows, 32);
  EXPECT_EQ(w.layers[0].wk.cols, 64);
}

TEST(Llama2cLoader, MissingFileIsNotFound) {
  auto m = LoadModel("/nonexistent/model.bin");
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
}

TEST(Llama2cLoader, EveryTruncationIsDataLoss) {
  const std::string full = ReadAll(testing::Stories260KModel());
  for (size_t cut : {size_t{1}, size_t{27}, size_t{28}, size_t{1000}, full.size() / 2,
                     full.size() - 1}) {
    auto path = TempFile("truncated.bin", full.substr(0, cut));
    auto m = LoadModel(path);
    ASSERT_FALSE(m.ok()) << "cut " << cut;
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().ToString();
    EXPECT_NE(m.status().message().find("truncated"), std::string::npos)
        << m.status().ToString();
  }
}

TEST(Llama2cLoader, ImpossibleHeadersAreRejected) {
  std::string full = ReadAll(testing::Stories260KModel());
  auto with_field = [&](int index, int32_t value) {
    std::string s = full;
    std::memcpy(&s[index * 4], &value, 4);
    return s;
  };
  struct Case {
    int field;
    int32_t value;
  } cases[] = {
      {0, 0},          {0, -64},   {0, 1 << 30},  // dim
      {1, -1},                                    // hidden_dim
      {2, 0},          {2, 100000},               // n_layers
      {3, 0},          {3, 7},                    // n_heads: 64 % 7 != 0
      {4, 3},          {4, 16},                   // n_kv_heads: 8 % 3, more than heads
      {5, 0},          {5, INT32_MIN},            // vocab (INT32_MIN: UBSan checks no -INT32_MIN)
      {6, 0},          {6, -5},                   // seq_len
      {5, 1 << 21},                               // plausible header, file far too short
  };
  for (const Case& c : cases) {
    auto path = TempFile("bad_header.bin", with_field(c.field, c.value));
    auto m = LoadModel(path);
    ASSERT_FALSE(m.ok()) << "field " << c.field << " = " << c.value;
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().ToString();
    if (c.value == INT32_MIN) {
      EXPECT_NE(m.status().message().find("vocab_size is INT32_MIN"), std::string::npos)
          << m.status().ToString();
    }
  }
}

}  // namespace
}  // namespace specinfer
