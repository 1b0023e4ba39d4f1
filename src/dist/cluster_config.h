// Cluster configuration files (YAML): what a deployment runs where.
//
//   hosts:   {NAME: ADDRESS, ...}            machines by name (default: local: 127.0.0.1)
//   models:  {NAME: PATH | {path: P, tokenizer: T}, ...}
//   limits:  {max_batch, max_batch_tokens, max_queue, context, max_body_bytes, prefix_cache}
//   manager: {host, bind, http_port, grpc_port, threads, tree,
//             spec_budget: auto | static | dynamic, served_model_name, chat_template,
//             rpc_timeout_ms, probe_interval_ms, drain_timeout_s,
//             request_defaults: {temperature, top_p, top_k, max_tokens}}  what requests that
//             leave those fields out get (server/generation_defaults.h; `serve --temperature`...)
//   ssm:     - {spec, model, backend: cpu | cuda, max_sessions, idle_timeout_s,
//               replicas: [{host, port, threads, gpu}, ...]}  one entry per logical speculator;
//             backend: where each replica runs a model: or layers: draft (ngram runs no model:
//             cpu only); gpu (backend cuda only): the replica's device (default: its place
//             among the replicas of cuda ssm entries on its host, in config order, 0, 1, ...;
//             SSM replicas and LLM workers are counted apart, so by default they share GPUs)
//   llm:     {model, placement: in-process | workers, backend: cpu | cuda, tp, pp, threads,
//             dequantize, cuda_graphs, workers: [{host, port, gpu}, ...]}  tp * pp workers,
//             stage-major; gpu: the device of a cuda worker (default: its place among the
//             workers on its host, 0, 1, ...); cuda_graphs (default true): backend cuda replays
//             CUDA graphs of decode and tree passes (false: every pass eager, the CLI's
//             --enforce-eager)
//   restart_workers: true | false            the one-machine launcher restarts a dead worker
//
// Unknown keys are refused (a typo must not silently fall back to a default), as are ports
// outside [0, 65535] (0: any free port, one-machine deployments only), degrees below 1, a worker
// list that does not hold tp * pp entries, unknown hosts and models, an ssm replica's gpu without
// backend: cuda, and an ngram entry on a GPU. Relative model paths are relative to the working
// directory, as on the command line. Errors name the key path, e.g.
// "configs/x.yaml: ssm[0].replicas[1].port: 70000 is outside [0, 65535]".
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "server/generation_defaults.h"
#include "spec/spec_grammar.h"
#include "specinfer/status.h"

namespace specinfer {

struct ClusterModel {
  std::string path;
  std::string tokenizer;  // "": the model's own
};

struct ClusterEndpoint {
  std::string host;     // a name from `hosts`
  std::string address;  // what it resolves to
  int32_t port = 0;
  int32_t threads = 1;  // CPU threads of the process serving it (0: all cores)
  int32_t gpu = -1;     // workers with backend cuda: the device (-1: by place on the host)
  std::string HostPort() const { return address + ":" + std::to_string(port); }
};

struct ClusterLimits {
  int32_t max_batch = 8;           // sequences running at once
  int32_t max_batch_tokens = 512;  // tokens per LLM pass
  int32_t max_queue = 64;          // sequences waiting
  int32_t context = 0;             // 0: the model's own (may only shrink it)
  int64_t max_body_bytes = 4 << 20;
  bool prefix_cache = true;        // automatic prefix caching in the manager's KV cache
};

struct ClusterManager {
  ClusterEndpoint endpoint;  // host and threads; endpoint.port is the HTTP port
  std::string bind;          // address the frontends bind ("": the host's address)
  int32_t grpc_port = 0;     // 0: no gRPC API
  std::string tree = std::string(kDefaultTreeShape);
  std::string spec_budget = "auto";  // engine/spec_controller.h: auto | static | dynamic
  std::string served_model_name;
  std::string chat_template;  // chatml | llama2 | llama3 | gemma; "": the model's own
  int32_t rpc_timeout_ms = 5000;
  int32_t probe_interval_ms = 1000;
  int32_t drain_timeout_s = 10;
  GenerationDefaults request_defaults;
};

struct ClusterSsmGroup {
  std::string spec;   // spec/speculator.h: ngram[:N], layers:K, model:PATH
  std::string model;  // a name from `models`: the model the workers load (vocabulary, layers)
  std::string backend = "cpu";  // cpu | cuda: where the replicas run a model or layers draft
  int32_t max_sessions = 0;  // per replica; 0: limits.max_batch
  int32_t idle_timeout_s = 300;
  std::vector<ClusterEndpoint> replicas;
};

struct ClusterLlm {
  enum class Placement { kInProcess, kWorkers };
  std::string model;
  Placement placement = Placement::kInProcess;
  std::string backend = "cpu";  // cpu | cuda
  int32_t tp = 1, pp = 1;
  int32_t threads = 0;          // in-process: the manager's runner; workers: each worker's
  bool dequantize = false;
  bool cuda_graphs = true;      // backend cuda: CUDA graphs (false: --enforce-eager)
  std::vector<ClusterEndpoint> workers;  // tp * pp, stage-major: (stage s, rank r) at s * tp + r
};

struct ClusterConfig {
  std::string source;  // the file it came from (for messages)
  std::map<std::string, std::string> hosts;
  std::map<std::string, ClusterModel> models;
  ClusterLimits limits;
  ClusterManager manager;
  std::vector<ClusterSsmGroup> ssm;
  ClusterLlm llm;
  bool restart_workers = false;

  const ClusterModel& model(const std::string& name) const { return models.at(name); }
  // Every port is fixed (none is 0): what a multi-host deployment needs.
  bool all_ports_fixed() const;
};

// Parses and validates a configuration; `source` names it in messages. InvalidArgument with the
// key path for anything wrong (see the file comment).
StatusOr<ClusterConfig> ParseClusterConfig(const std::string& yaml_text,
                                           const std::string& source);
// Reads and parses a file. NotFound if it cannot be read.
StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path);

// The GPU of a worker with backend cuda: its `gpu`, else its place on its host (see the file
// comment). LLM worker `worker` is stage-major; SSM replica `replica` of ssm entry `group`.
int32_t LlmWorkerGpu(const ClusterConfig& config, size_t worker);
int32_t SsmReplicaGpu(const ClusterConfig& config, size_t group, size_t replica);

// Whether this build has the LLM worker role (tensor- and pipeline-parallel LLM workers).
inline constexpr bool kClusterHasLlmWorkers = true;

// Whether this program can run the configuration: every backend named must be registered
// (backend/registry.h: `cuda` only in programs built with the CUDA backend: llm.backend and
// every ssm[i].backend), and LLM workers (`placement: workers`) need the LLM worker role in this
// build.
// FailedPrecondition, naming the key, otherwise.
Status CheckClusterRunnable(const ClusterConfig& config);

}  // namespace specinfer
