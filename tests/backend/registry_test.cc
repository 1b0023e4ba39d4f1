// The backend registry: "cpu" is built in, unknown names are clear errors, and a runner reports
// the KV geometry it was created for.
#include "backend/registry.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "model/loader.h"
#include "test_util.h"

namespace specinfer {
namespace {

TEST(BackendRegistry, CpuIsBuiltIn) {
  const std::vector<std::string> names = BackendNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
  auto cpu = FindBackend("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ(cpu->name, "cpu");
  EXPECT_TRUE(cpu->reads_weights);
}

TEST(BackendRegistry, UnknownNamesAreClearErrors) {
  auto nope = FindBackend("nope");
  ASSERT_FALSE(nope.ok());
  EXPECT_EQ(nope.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(nope.status().message().find("unknown backend 'nope'"), std::string::npos);
  EXPECT_NE(nope.status().message().find("cpu"), std::string::npos) << "lists what there is";
  // This test binary has no CUDA library: "cuda" is a known name this build lacks.
  auto cuda = FindBackend("cuda");
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(cuda.status().message().find("no CUDA backend"), std::string::npos);
  auto model = LoadModel(testing::Stories260KModel());
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(CreateRunner("nope", std::move(model).value(), RunnerOptions{}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(BackendRegistry, CpuRunnerReportsTheGeometryAskedFor) {
  auto model = LoadModel(testing::Stories260KModel());
  ASSERT_TRUE(model.ok());
  RunnerOptions o;
  o.num_kv_blocks = 7;
  o.kv_block_size = 8;
  o.num_threads = 1;
  auto runner = CreateRunner("cpu", std::move(model).value(), o);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  EXPECT_EQ((*runner)->name(), "cpu");
  EXPECT_EQ((*runner)->num_kv_blocks(), 7);
  EXPECT_EQ((*runner)->kv_block_size(), 8);
}

TEST(BackendRegistry, RegisteredBackendsAreFoundAndAFactoryWithoutRunnerIsAnError) {
  Backend b;
  b.name = "test-nothing";
  b.create = [](std::shared_ptr<const Model>,
                const RunnerOptions&) -> StatusOr<std::unique_ptr<ModelRunner>> {
    return std::unique_ptr<ModelRunner>();
  };
  RegisterBackend(b);
  const std::vector<std::string> names = BackendNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "test-nothing"), names.end());
  auto model = LoadModel(testing::Stories260KModel());
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(CreateRunner("test-nothing", std::move(model).value(), RunnerOptions{})
                .status()
                .code(),
            StatusCode::kInternal);
}

}  // namespace
}  // namespace specinfer
