// The per-request speculation extension: node counting and the serving limits it is held to
// (the grammar itself: tests/spec/spec_grammar_test.cc).
#include "server/speculation.h"

#include <gtest/gtest.h>

namespace specinfer {
namespace {

TEST(SpeculationRequest, CountsTreeNodes) {
  SpeculationRequest r;
  EXPECT_EQ(r.num_nodes(), 0);
  r.tree = {1, 1, 3, 1};  // SpecInfer's example: 1 + 1 + 3 + 3
  EXPECT_EQ(r.num_nodes(), 8);
  r.tree = {2, 2, 2};  // 2 + 4 + 8
  EXPECT_EQ(r.num_nodes(), 14);
  r.tree = std::vector<int32_t>(16, 16);  // saturates instead of overflowing
  EXPECT_EQ(r.num_nodes(), std::numeric_limits<int32_t>::max());
}

TEST(SpeculationRequest, ValidatesTreeAndDrafts) {
  SpeculationRequest r;
  EXPECT_TRUE(ValidateSpeculation(r).ok());  // empty: server defaults
  r.tree = {1, 1, 3, 1};
  r.drafts = {*ParseDraftSpec("ngram:3"), *ParseDraftSpec("layers:4")};
  EXPECT_TRUE(ValidateSpeculation(r, /*num_layers=*/30).ok());

  auto invalid = [](SpeculationRequest s, int32_t layers = 0) {
    Status st = ValidateSpeculation(s, layers);
    return !st.ok() && st.code() == StatusCode::kInvalidArgument;
  };
  SpeculationRequest bad = r;
  bad.tree = {1, 0};
  EXPECT_TRUE(invalid(bad));
  bad.tree = {17};
  EXPECT_TRUE(invalid(bad));
  bad.tree = {-1};
  EXPECT_TRUE(invalid(bad));
  bad.tree = std::vector<int32_t>(17, 1);  // depth 17
  EXPECT_TRUE(invalid(bad));
  bad.tree = std::vector<int32_t>(16, 1);  // depth 16 is fine
  EXPECT_FALSE(invalid(bad));
  bad.tree = {16, 8};  // 16 + 128 nodes
  EXPECT_TRUE(invalid(bad));
  bad.tree = {8, 15};  // 8 + 120 = 128 nodes: the limit
  EXPECT_FALSE(invalid(bad));

  bad = r;
  bad.drafts.push_back(*ParseDraftSpec("ngram:3"));  // duplicate
  EXPECT_TRUE(invalid(bad));
  bad = r;
  EXPECT_TRUE(invalid(bad, /*num_layers=*/4));  // layers:4 of a 4-layer model
  EXPECT_FALSE(invalid(bad, /*num_layers=*/5));
  bad.drafts.clear();
  for (int i = 1; i <= 9; ++i) bad.drafts.push_back(*ParseDraftSpec("ngram:" + std::to_string(i)));
  EXPECT_TRUE(invalid(bad));  // more than 8 drafts
}

}  // namespace
}  // namespace specinfer
