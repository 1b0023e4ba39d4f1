#include "dist/model_identity.h"

#include <gtest/gtest.h>

#include "model/loader.h"
#include "tokenizer/llama2c_tokenizer.h"
#include "test_util.h"

namespace specinfer {
namespace {

TEST(ModelIdentityTest, FingerprintIsStableAndTellsVocabulariesApart) {
  auto stories = LoadModelAndTokenizer(testing::Stories260KModel(), testing::Stories260KTokenizer());
  ASSERT_TRUE(stories.ok()) << stories.status().ToString();
  auto again = LoadModelAndTokenizer(testing::Stories260KModel(), testing::Stories260KTokenizer());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(VocabFingerprint(*stories->tokenizer), VocabFingerprint(*again->tokenizer));

  // The Llama 2 vocabulary (32000 pieces) differs from stories260K's 512.
  if (testing::Llama2TokenizerBin().empty()) GTEST_SKIP() << "no Llama 2 tokenizer beside the checkout";
  auto llama2 = Llama2cTokenizer::Load(testing::Llama2TokenizerBin(), 32000);
  ASSERT_TRUE(llama2.ok()) << llama2.status().ToString();
  EXPECT_NE(VocabFingerprint(*stories->tokenizer), VocabFingerprint(**llama2));
  EXPECT_EQ(ModelShapeString(stories->model->config()),
            "llama dim=64 hidden=172 layers=5 heads=8/4 vocab=512");
}

}  // namespace
}  // namespace specinfer
