// The speculation grammar: draft specs and tree shapes, under the engine's limits and the
// stricter serving policy.
#include "spec/spec_grammar.h"

#include <gtest/gtest.h>

namespace specinfer {
namespace {

TEST(DraftSpec, ParsesTheThreeKinds) {
  auto ngram = ParseDraftSpec("ngram:3");
  ASSERT_TRUE(ngram.ok()) << ngram.status().ToString();
  EXPECT_EQ(ngram->kind, DraftSpec::Kind::kNgram);
  EXPECT_EQ(ngram->n, 3);
  EXPECT_EQ(ngram->ToString(), "ngram:3");

  auto bare = ParseDraftSpec("ngram");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->n, 0);
  EXPECT_EQ(bare->ToString(), "ngram");

  auto layers = ParseDraftSpec("layers:4");
  ASSERT_TRUE(layers.ok());
  EXPECT_EQ(layers->kind, DraftSpec::Kind::kLayers);
  EXPECT_EQ(layers->n, 4);
  EXPECT_EQ(layers->ToString(), "layers:4");

  auto model = ParseDraftSpec("model:/models/draft.gguf");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->kind, DraftSpec::Kind::kModel);
  EXPECT_EQ(model->model_path, "/models/draft.gguf");
  EXPECT_EQ(model->ToString(), "model:/models/draft.gguf");
}

TEST(DraftSpec, RejectsBadSyntax) {
  for (const char* bad : {"",         "ngram:",   "ngram:0",   "ngram:-1",
                          "ngram:+3", "ngram:3x", "ngram:17",  "ngram:99999999999",
                          "layers",   "layers:",  "layers:0",  "layers:1.5",
                          "model:",   "model",    "foo:1",     "NGRAM:3",
                          " ngram:3", "ngram:3 ", "model:a b", "model:a\nb",
                          "ngram :3", ":3"}) {
    auto r = ParseDraftSpec(bad, kServingLimits);
    EXPECT_FALSE(r.ok()) << "'" << bad << "' was accepted";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  EXPECT_TRUE(ParseDraftSpec("ngram:16", kServingLimits).ok());
  EXPECT_FALSE(ParseDraftSpec("model:" + std::string(5000, 'a'), kServingLimits).ok());
}

TEST(DraftSpec, EngineLimitsDifferFromServingOnlyWhereNamed) {
  // The engine (CLI flags, cluster configs) takes paths with spaces; clients of the servers cannot.
  auto spaced = ParseDraftSpec("model:/models/my draft.gguf");
  ASSERT_TRUE(spaced.ok()) << spaced.status().ToString();
  EXPECT_EQ(spaced->model_path, "/models/my draft.gguf");
  EXPECT_FALSE(ParseDraftSpec("model:/models/my draft.gguf", kServingLimits).ok());
  // Everything else is refused under both.
  for (const char* bad : {"", "ngram:", "ngram:0", "ngram:17", "layers", "layers:x", "model:",
                          "model", "turbo", " ngram:3", "ngram:3 ", "model:a\nb", "ngram :3"}) {
    EXPECT_FALSE(ParseDraftSpec(bad).ok()) << "'" << bad << "' was accepted";
  }
  EXPECT_EQ(ParseDraftSpec("ngram")->ngram(), kDefaultMaxNgram);
  EXPECT_EQ(ParseDraftSpec("ngram:5")->ngram(), 5);
}

TEST(DraftSpec, MessagesNameTheSpec) {
  auto unknown = ParseDraftSpec("eagle");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown draft 'eagle'"), std::string::npos)
      << unknown.status().ToString();
  auto range = ParseDraftSpec("ngram:99");
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("'ngram:99'"), std::string::npos);

  const DraftSpec layers = *ParseDraftSpec("layers:5");
  EXPECT_TRUE(CheckDraftFitsModel(layers, 6).ok());
  Status s = CheckDraftFitsModel(layers, 5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'layers:5'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("1 to 4"), std::string::npos) << s.ToString();
}

TEST(DraftSpec, ValidatesTheDraftsOfARequest) {
  std::vector<DraftSpec> drafts = {*ParseDraftSpec("ngram:3"), *ParseDraftSpec("layers:4")};
  EXPECT_TRUE(ValidateDrafts(drafts, kServingLimits, /*num_layers=*/30).ok());
  EXPECT_FALSE(ValidateDrafts(drafts, kServingLimits, /*num_layers=*/4).ok());
  drafts.push_back(drafts[0]);
  Status twice = ValidateDrafts(drafts, kEngineLimits);
  EXPECT_NE(twice.message().find("'ngram:3' appears twice"), std::string::npos) << twice.ToString();
  drafts.clear();
  for (int i = 1; i <= 9; ++i) drafts.push_back(*ParseDraftSpec("ngram:" + std::to_string(i)));
  EXPECT_FALSE(ValidateDrafts(drafts, kServingLimits).ok());  // 9 > 8
  EXPECT_TRUE(ValidateDrafts(drafts, kEngineLimits).ok());
}

TEST(TreeShape, ParsesAndCountsNodes) {
  auto s = TreeShape::Parse("1,1,3,1,1,1,1,1");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->depth(), 8);
  EXPECT_EQ(s->MaxNodes(), 1 + 1 + 3 + 3 * 5);
  EXPECT_EQ(s->ToString(), "1,1,3,1,1,1,1,1");
  EXPECT_TRUE(TreeShape::Parse(" 2, 2 ,1").ok());
  EXPECT_EQ(TreeShape::Parse("4")->MaxNodes(), 4);
}

TEST(TreeShape, RefusesZerosAbsurdWidthsAndGarbage) {
  for (const char* bad : {"", "0", "1,0,1", "-1", "17", "1,,1", "1,", "a", "1;2", "2.5", "16,16,16",
                          "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
                          "1,1,1,1,1"}) {
    auto s = TreeShape::Parse(bad);
    EXPECT_FALSE(s.ok()) << "accepted '" << bad << "'";
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(TreeShape, ServingLimitsAreStricter) {
  // 16 deep and 128 nodes serve; 17 deep or 144 nodes only run on the engine's own settings.
  EXPECT_TRUE(TreeShape::Parse("8,15", kServingLimits).ok());
  EXPECT_FALSE(TreeShape::Parse("16,8", kServingLimits).ok());
  EXPECT_TRUE(TreeShape::Parse("16,8").ok());
  EXPECT_TRUE(TreeShape::Chain(16).Validate(kServingLimits).ok());
  EXPECT_FALSE(TreeShape::Chain(17).Validate(kServingLimits).ok());
  EXPECT_TRUE(TreeShape::Chain(17).Validate().ok());
  Status width = TreeShape{{1, 0, 1}}.Validate(kServingLimits);
  EXPECT_NE(width.message().find("tree width 0 (entry 1)"), std::string::npos) << width.ToString();
}

TEST(TreeShape, TheDefaultIsSpecInfersExample) {
  EXPECT_EQ(TreeShape::Default().ToString(), kDefaultTreeShape);
  EXPECT_TRUE(TreeShape::Default().Validate(kServingLimits).ok());
}

}  // namespace
}  // namespace specinfer
