// `specinfer cluster` and `specinfer worker`: distributed serving from a cluster config
// (dist/cluster_config.h, examples in configs/).
//
//   specinfer cluster --config FILE [--role all|manager] [--model PATH [--tokenizer PATH]]
//                     [--http-port P] [--any-ports] [--chat-template chatml|llama2|llama3|gemma]
//       all (default): the whole deployment on this machine: every worker of the config as a
//       child process, then the request manager with its HTTP and gRPC frontends in this one;
//       manager: only the manager, connecting to workers started elsewhere (multi-host).
//   specinfer worker --config FILE --role ssm|llm --index N [--port P] [--model PATH ...]
//       one worker of the config on this host.
// --model replaces every model of the config (e.g. a small model for a smoke test).
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace specinfer {

struct ClusterArgs {
  std::string config;
  std::string role = "all";
  int index = 0;
  int port = -1;
  std::string model, tokenizer;
  int http_port = -1;      // cluster: >= 0 replaces manager.http_port
  bool any_ports = false;  // cluster: every worker on a free port, no gRPC
  std::string chat_template;  // cluster: replaces manager.chat_template
  bool no_prefix_cache = false;  // cluster: limits.prefix_cache = false
};

// Adds the subcommands' options; `cluster_args` and `worker_args` receive them.
CLI::App* AddClusterCommand(CLI::App& app, ClusterArgs& cluster_args);
CLI::App* AddWorkerCommand(CLI::App& app, ClusterArgs& worker_args);

int RunClusterCommand(const ClusterArgs& args, const char* argv0);
int RunWorkerCommand(const ClusterArgs& args);

}  // namespace specinfer
