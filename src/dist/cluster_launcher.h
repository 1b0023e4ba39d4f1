// Starting a deployment from a cluster config (dist/cluster_config.h): the bodies of the
// `specinfer cluster` and `specinfer worker` commands.
//
//   RunClusterWorker  one worker role (ssm replica N, or llm worker N) on this host, until
//                     SIGINT/SIGTERM. Prints one line on standard output once it listens:
//                       worker ssm[N] listening ADDRESS:PORT pid=PID
//                     and nothing more there (logs go to standard error).
//   RunCluster        the request manager and its gateway (OpenAI HTTP + gRPC), connecting to the
//                     workers in the config; with `spawn_workers` it first starts every worker of
//                     the config as a child process (fork/exec of `self_exe worker ...`, port 0
//                     resolved from the child's line), logs a child that dies (and restarts it on
//                     the same port when restart_workers is set), and stops them all on exit.
//                     Prints, once serving, one line per worker and then
//                       listening http=HOST:PORT grpc=HOST:PORT model=NAME
//                     On SIGINT/SIGTERM: stops admitting (new requests get 503/UNAVAILABLE),
//                     cancels the running ones (each gets its final event), tells the SSM
//                     workers to drain, then stops the children (SIGTERM, SIGKILL after
//                     manager.drain_timeout_s).
//
// Logs name workers as "ssm[1] 127.0.0.1:5102" / "llm[3] 127.0.0.1:5204 (stage 1, rank 1)".
//
// Both return a process exit status: 0 after a clean stop, 1 if the deployment cannot start (the
// reason on standard error).
#pragma once

#include <string>

#include "dist/cluster_config.h"

namespace specinfer {

struct ClusterOverrides {
  std::string model;      // non-empty: replaces every model's path (e.g. a small model for tests)
  std::string tokenizer;  // with `model`: its tokenizer
  int http_port = -1;     // >= 0: replaces manager.http_port (0: any free port)
  // Every worker on any free port and no gRPC frontend (one-machine runs beside other
  // deployments: tests, benchmarks). Workers are started with their resolved ports.
  bool any_ports = false;
  std::string chat_template;  // non-empty: replaces manager.chat_template
  bool no_prefix_cache = false;  // true: limits.prefix_cache = false
};

// Replaces every model of `config` as `overrides` says.
void ApplyClusterOverrides(const ClusterOverrides& overrides, ClusterConfig& config);

// role: "ssm" (index over every ssm group's replicas, in config order) or "llm" (index in
// llm.workers). port_override >= 0 replaces the configured port.
int RunClusterWorker(const ClusterConfig& config, const std::string& config_path,
                     const std::string& role, int index, int port_override,
                     const ClusterOverrides& overrides);

int RunCluster(const ClusterConfig& config, const std::string& config_path, bool spawn_workers,
               const ClusterOverrides& overrides, const std::string& self_exe);

}  // namespace specinfer
