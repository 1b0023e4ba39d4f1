// Cluster configs: the shipped examples parse and say what they mean; bad configs are refused
// with the key path in the message; configs this build cannot run are refused clearly.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "dist/cluster_config.h"
#include "test_util.h"

namespace specinfer {
namespace {

const char* kGood = R"(
hosts: {a: 10.0.0.1, b: 10.0.0.2}
models:
  llm: /m/llm.gguf
  tiny: {path: /m/tiny.bin, tokenizer: /m/tok.bin}
limits: {max_batch: 16, max_batch_tokens: 1024, max_queue: 10, context: 2048}
manager: {host: a, http_port: 8080, grpc_port: 0, threads: 2, tree: [1, 2, 1],
          rpc_timeout_ms: 250, spec_budget: static,
          request_defaults: {temperature: 0.2, top_p: 0.9, top_k: 40, max_tokens: 256}}
ssm:
  - spec: layers:4
    model: llm
    replicas: [{host: a, port: 5101, threads: 3}, {host: b, port: 5101}]
  - spec: model:/m/tiny.bin
    model: llm
    max_sessions: 4
    replicas: [{host: b, port: 5102}]
llm:
  model: llm
  placement: workers
  tp: 2
  pp: 1
  threads: 4
  cuda_graphs: false
  workers: [{host: a, port: 5201}, {host: b, port: 5201, gpu: 1}]
restart_workers: true
)";

TEST(ClusterConfig, ParsesEveryField) {
  auto c = ParseClusterConfig(kGood, "good.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->hosts.at("a"), "10.0.0.1");
  EXPECT_EQ(c->hosts.at("local"), "127.0.0.1");
  EXPECT_EQ(c->model("tiny").tokenizer, "/m/tok.bin");
  EXPECT_EQ(c->limits.max_batch, 16);
  EXPECT_EQ(c->limits.context, 2048);
  EXPECT_EQ(c->manager.endpoint.address, "10.0.0.1");
  EXPECT_EQ(c->manager.endpoint.port, 8080);
  EXPECT_EQ(c->manager.grpc_port, 0);
  EXPECT_EQ(c->manager.tree, "1,2,1");
  EXPECT_EQ(c->manager.rpc_timeout_ms, 250);
  EXPECT_EQ(c->manager.spec_budget, "static");
  EXPECT_FLOAT_EQ(c->manager.request_defaults.temperature, 0.2f);
  EXPECT_FLOAT_EQ(c->manager.request_defaults.top_p, 0.9f);
  EXPECT_EQ(c->manager.request_defaults.top_k, 40);
  EXPECT_EQ(c->manager.request_defaults.max_tokens, 256);
  ASSERT_EQ(c->ssm.size(), 2u);
  EXPECT_EQ(c->ssm[0].spec, "layers:4");
  EXPECT_EQ(c->ssm[0].max_sessions, 16) << "defaults to limits.max_batch";
  ASSERT_EQ(c->ssm[0].replicas.size(), 2u);
  EXPECT_EQ(c->ssm[0].replicas[0].threads, 3);
  EXPECT_EQ(c->ssm[0].replicas[1].HostPort(), "10.0.0.2:5101");
  EXPECT_EQ(c->ssm[1].max_sessions, 4);
  EXPECT_EQ(c->llm.placement, ClusterLlm::Placement::kWorkers);
  EXPECT_EQ(c->llm.tp, 2);
  ASSERT_EQ(c->llm.workers.size(), 2u);
  EXPECT_EQ(c->llm.workers[1].address, "10.0.0.2");
  EXPECT_EQ(c->llm.workers[1].gpu, 1);
  EXPECT_EQ(c->llm.workers[0].gpu, -1);
  EXPECT_FALSE(c->llm.cuda_graphs);
  auto defaults = ParseClusterConfig("models: {llm: /m/llm.gguf}\nllm: {model: llm}\n", "x.yaml");
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_TRUE(defaults->llm.cuda_graphs) << "on by default";
  EXPECT_TRUE(defaults->manager.request_defaults == GenerationDefaults{}) << "OpenAI's";
  EXPECT_TRUE(c->restart_workers);
  EXPECT_TRUE(c->all_ports_fixed());
  EXPECT_TRUE(CheckClusterRunnable(*c).ok());
}

TEST(ClusterConfig, ShippedExamples) {
  for (const char* name : {"single-cpu", "multi-process-cpu", "multi-gpu-node", "two-node"}) {
    auto c = LoadClusterConfig(testing::SourcePath(std::string("configs/") + name + ".yaml"));
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
  }
  auto single = LoadClusterConfig(testing::SourcePath("configs/single-cpu.yaml"));
  EXPECT_EQ(single->llm.placement, ClusterLlm::Placement::kInProcess);
  EXPECT_TRUE(single->ssm.empty());
  EXPECT_FLOAT_EQ(single->manager.request_defaults.temperature, 0.2f);
  EXPECT_FLOAT_EQ(single->manager.request_defaults.top_p, 0.9f);
  EXPECT_TRUE(CheckClusterRunnable(*single).ok());

  auto multi = LoadClusterConfig(testing::SourcePath("configs/multi-process-cpu.yaml"));
  EXPECT_EQ(multi->model(multi->llm.model).path, "models/SmolLM2-135M-Instruct.Q4_1.gguf");
  ASSERT_EQ(multi->ssm.size(), 1u);
  EXPECT_EQ(multi->ssm[0].replicas.size(), 2u);
  EXPECT_EQ(multi->llm.tp, 3);  // SmolLM2-135M's 3 KV heads
  EXPECT_EQ(multi->llm.pp, 2);
  EXPECT_EQ(multi->llm.workers.size(), 6u);
  EXPECT_EQ(multi->llm.backend, "cpu");
  EXPECT_TRUE(CheckClusterRunnable(*multi).ok());

  // backend: cuda needs the CUDA backend, which this test program (no CUDA library) lacks: the
  // key is named.
  for (const char* name : {"multi-gpu-node", "two-node"}) {
    auto c = LoadClusterConfig(testing::SourcePath(std::string("configs/") + name + ".yaml"));
    EXPECT_EQ(c->llm.backend, "cuda");
    const Status s = CheckClusterRunnable(*c);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << name;
    EXPECT_NE(s.message().find("llm.backend: cuda"), std::string::npos) << s.message();
  }
  auto gpus = LoadClusterConfig(testing::SourcePath("configs/multi-gpu-node.yaml"));
  ASSERT_EQ(gpus->ssm.size(), 1u);
  EXPECT_EQ(gpus->ssm[0].backend, "cuda");
  ASSERT_EQ(gpus->ssm[0].replicas.size(), 2u);
  EXPECT_EQ(SsmReplicaGpu(*gpus, 0, 0), 0);
  EXPECT_EQ(SsmReplicaGpu(*gpus, 0, 1), 1);
  auto two = LoadClusterConfig(testing::SourcePath("configs/two-node.yaml"));
  EXPECT_EQ(two->llm.workers[2].address, "10.0.0.2");
  EXPECT_EQ(two->llm.workers[2].gpu, -1);  // by place on its host
  EXPECT_EQ(two->manager.bind, "0.0.0.0");
}

// configs/single-gpu.yaml's comment shows how to add a GPU draft: uncommented, it parses.
TEST(ClusterConfig, SingleGpuCommentExampleParses) {
  std::ifstream file(testing::SourcePath("configs/single-gpu.yaml"));
  std::stringstream ss;
  ss << file.rdbuf();
  const std::string text = ss.str();
  ASSERT_FALSE(text.empty());
  std::istringstream in(text);
  std::string line, example;
  bool in_example = false;
  while (std::getline(in, line)) {
    if (line == "#   ssm:") in_example = true;
    if (in_example && line.rfind("#   ", 0) != 0) break;
    if (in_example) example += line.substr(4) + "\n";
  }
  ASSERT_FALSE(example.empty()) << "the comment has no ssm example";
  auto c = ParseClusterConfig(text + example, "single-gpu.yaml + its comment");
  ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << example;
  ASSERT_EQ(c->ssm.size(), 1u);
  EXPECT_EQ(c->ssm[0].backend, "cuda");
  EXPECT_EQ(SsmReplicaGpu(*c, 0, 0), 0);
}

// Applies `edit` (a YAML fragment replacing or adding top-level keys) to a valid config.
std::string Minimal(const std::string& extra = "", const std::string& llm = "llm: {}") {
  return "models: {llm: /m/llm.gguf}\n" + llm + "\n" + extra;
}

TEST(ClusterConfig, BadConfigsAreRefusedNamingTheKey) {
  ASSERT_TRUE(ParseClusterConfig(Minimal(), "x.yaml").ok());
  struct Case {
    std::string yaml;
    std::string expect;  // in the message
  };
  const std::vector<Case> cases = {
      {Minimal("colour: blue"), "colour: unknown key"},
      {Minimal("manager: {http_prot: 80}"), "manager.http_prot: unknown key"},
      {Minimal("manager: {http_port: 70000}"), "manager.http_port: 70000 is outside [0, 65535]"},
      {Minimal("manager: {http_port: -1}"), "manager.http_port"},
      {Minimal("manager: {http_port: eighty}"), "not an integer"},
      {Minimal("manager: {tree: '0,1'}"), "manager.tree"},
      {Minimal("manager: {spec_budget: 4}"),
       "manager.spec_budget: '4' is not auto, static or dynamic"},
      {Minimal("manager: {host: nowhere}"), "unknown host 'nowhere'"},
      {Minimal("manager: {request_defaults: {temperature: 3}}"),
       "manager.request_defaults: default temperature must be between 0 and 2, got 3"},
      {Minimal("manager: {request_defaults: {top_p: high}}"),
       "manager.request_defaults.top_p: 'high' is not a number"},
      {Minimal("manager: {request_defaults: {top_p: 0}}"), "default top_p must be in (0, 1]"},
      {Minimal("manager: {request_defaults: {max_tokens: 0}}"),
       "manager.request_defaults.max_tokens: 0 is outside"},
      {Minimal("manager: {request_defaults: {temp: 0.5}}"),
       "manager.request_defaults.temp: unknown key"},
      {Minimal("manager: {request_defaults: 0.5}"), "manager.request_defaults: expected a mapping"},
      {Minimal("limits: {max_batch: 0}"), "limits.max_batch: 0 is outside"},
      {Minimal("", "llm: {cuda_graphs: sometimes}"), "llm.cuda_graphs"},
      {Minimal("", "llm: {placement: workers, tp: 0, workers: []}"), "llm.tp: 0 is outside"},
      {Minimal("", "llm: {placement: workers, tp: 2, pp: 2, workers: [{port: 1}]}"),
       "llm.workers: 1 workers for tp 2 x pp 2 (needs 4"},
      {Minimal("", "llm: {tp: 2}"), "need placement: workers"},
      {Minimal("", "llm: {backend: rocm}"), "llm.backend: 'rocm'"},
      {Minimal("ssm: [{spec: ngram, backend: tpu, replicas: [{port: 1}]}]"),
       "ssm[0].backend: 'tpu'"},
      {Minimal("", "llm: {placement: sideways}"), "llm.placement"},
      {Minimal("", "llm: {model: other}"), "unknown model 'other'"},
      {Minimal("", "llm: {placement: workers, workers: [{port: 5, thread: 1}]}"),
       "llm.workers[0].thread: unknown key"},
      {Minimal("", "llm: {placement: workers, workers: [{port: 5, gpu: -1}]}"),
       "llm.workers[0].gpu"},
      {Minimal("ssm: [{spec: 'layers:1', replicas: [{port: 1, gpu: 0}]}]"),
       "ssm[0].replicas[0].gpu: given, but ssm[0].backend is cpu"},
      {Minimal("ssm: [{spec: 'layers:1', backend: cpu, replicas: [{port: 1}, {port: 2, gpu: 1}]}]"),
       "ssm[0].replicas[1].gpu: given, but ssm[0].backend is cpu"},
      {Minimal("ssm: [{spec: 'layers:1', backend: cuda, replicas: [{port: 1, gpu: -1}]}]"),
       "ssm[0].replicas[0].gpu: -1 is outside [0, 1023]"},
      {Minimal("ssm: [{spec: 'layers:1', backend: cuda, replicas: [{port: 1, gpu: one}]}]"),
       "ssm[0].replicas[0].gpu: 'one' is not an integer"},
      {Minimal("ssm: [{spec: 'layers:1', backend: cuda, replicas: [{port: 1, gpus: 1}]}]"),
       "ssm[0].replicas[0].gpus: unknown key"},
      {Minimal("ssm: [{spec: 'layers:1', backend: CUDA, replicas: [{port: 1}]}]"),
       "ssm[0].backend: 'CUDA' (expected cpu or cuda)"},
      {Minimal("ssm: [{spec: 'ngram:3', backend: cuda, replicas: [{port: 1}]}]"),
       "ssm[0].backend: cuda: ngram:3 runs no model"},
      {Minimal("ssm: [{spec: 'foo:1', replicas: [{port: 1}]}]"), "ssm[0].spec"},
      {Minimal("ssm: [{spec: ngram, replicas: []}]"), "ssm[0].replicas"},
      {Minimal("ssm: [{spec: ngram, replicas: [{port: 5, host: mars}]}]"),
       "ssm[0].replicas[0].host: unknown host 'mars'"},
      {Minimal("ssm: [{spec: ngram, replicas: [{port: 5101}, {port: 5101}]}]"),
       "port 127.0.0.1:5101 is also used by ssm[0].replicas[0]"},
      {Minimal("ssm: [{spec: ngram, replicas: [{port: 1}]}, {spec: ngram, replicas: [{port: 2}]}]"),
       "appears twice"},
      {Minimal("restart_workers: maybe"), "restart_workers: 'maybe' is not true or false"},
      {"models: {llm: /m/a}\n", "llm: required"},
      {"llm: {}\n", "models: required"},
      {"models: {llm: /m/a}\nllm: {\n", "x.yaml"},  // YAML syntax error
      {"- just\n- a list\n", "expected a YAML mapping"},
  };
  for (const Case& c : cases) {
    auto r = ParseClusterConfig(c.yaml, "x.yaml");
    ASSERT_FALSE(r.ok()) << "accepted:\n" << c.yaml;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << "message: " << r.status().message() << "\nexpected: " << c.expect;
    EXPECT_EQ(r.status().message().rfind("x.yaml", 0), 0u) << "names the file";
  }
  auto missing = LoadClusterConfig("/nonexistent/cluster.yaml");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// Backends come from the registry (backend/registry.h): one this program has not registered
// (tests register no CUDA backend) is refused, naming the key, wherever it is used.
TEST(ClusterConfig, UnregisteredBackendsAreRefused) {
  for (const char* yaml : {"llm: {backend: cuda}", "llm: {}\nssm: [{spec: 'layers:1', "
                                                   "backend: cuda, replicas: [{port: 1}]}]"}) {
    auto c = ParseClusterConfig(Minimal("", yaml), "x.yaml");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const Status s = CheckClusterRunnable(*c);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << yaml;
    EXPECT_NE(s.message().find("backend: cuda: this build has no CUDA backend"), std::string::npos)
        << s.message();
  }
}

// SSM entries on GPUs: backend and gpu per replica; a replica without gpu takes its place among
// the replicas of cuda entries on its host (config order; CPU entries and LLM workers do not
// count), as LLM workers do among themselves.
TEST(ClusterConfig, SsmReplicasOnGpus) {
  const char* yaml = R"(
hosts: {a: 10.0.0.1, b: 10.0.0.2}
models: {llm: /m/llm.gguf}
ssm:
  - spec: 'layers:2'
    backend: cuda
    replicas: [{host: a, port: 5101}, {host: b, port: 5101}, {host: a, port: 5102, gpu: 5},
               {host: a, port: 5103}]
  - spec: ngram
    replicas: [{host: a, port: 5104}]
  - spec: 'model:/m/draft.gguf'
    backend: cuda
    max_sessions: 2
    replicas: [{host: a, port: 5105, threads: 2}, {host: b, port: 5105}]
llm:
  placement: workers
  backend: cuda
  tp: 2
  workers: [{host: a, port: 5201}, {host: a, port: 5202}]
)";
  auto c = ParseClusterConfig(yaml, "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->ssm.size(), 3u);
  EXPECT_EQ(c->ssm[0].backend, "cuda");
  EXPECT_EQ(c->ssm[1].backend, "cpu") << "the default";
  EXPECT_EQ(c->ssm[2].backend, "cuda");
  EXPECT_EQ(c->ssm[0].replicas[0].gpu, -1);
  EXPECT_EQ(c->ssm[0].replicas[2].gpu, 5);
  EXPECT_EQ(c->ssm[2].replicas[0].threads, 2);
  // Host a: ssm[0] replicas 0, 2 (gpu 5 given, still counted), 3, then ssm[2] replica 0.
  EXPECT_EQ(SsmReplicaGpu(*c, 0, 0), 0);
  EXPECT_EQ(SsmReplicaGpu(*c, 0, 1), 0) << "first on host b";
  EXPECT_EQ(SsmReplicaGpu(*c, 0, 2), 5) << "as configured";
  EXPECT_EQ(SsmReplicaGpu(*c, 0, 3), 2);
  EXPECT_EQ(SsmReplicaGpu(*c, 2, 0), 3) << "after ssm[0]'s three on host a; ngram not counted";
  EXPECT_EQ(SsmReplicaGpu(*c, 2, 1), 1) << "after ssm[0]'s one on host b";
  EXPECT_EQ(LlmWorkerGpu(*c, 0), 0) << "LLM workers count apart from SSM replicas";
  EXPECT_EQ(LlmWorkerGpu(*c, 1), 1);
  EXPECT_TRUE(c->all_ports_fixed());

  // This program has no CUDA backend: the first ssm entry on a GPU is named.
  auto ssm_only = ParseClusterConfig(
      Minimal("ssm: [{spec: ngram, replicas: [{port: 1}]}, {spec: 'layers:1', backend: cuda, "
              "replicas: [{port: 2, gpu: 1}]}]"),
      "x.yaml");
  ASSERT_TRUE(ssm_only.ok()) << ssm_only.status().ToString();
  const Status s = CheckClusterRunnable(*ssm_only);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("x.yaml: ssm[1].backend: cuda: this build has no CUDA backend"),
            std::string::npos)
      << s.message();
}

TEST(ClusterConfig, PortZeroIsOnlyForOneMachine) {
  auto c = ParseClusterConfig(Minimal("ssm: [{spec: ngram, replicas: [{port: 0}]}]"), "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->all_ports_fixed());
}

}  // namespace
}  // namespace specinfer
