#include "cli/cluster.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "dist/cluster_config.h"
#include "dist/cluster_launcher.h"

namespace specinfer {

namespace {

void AddCommon(CLI::App* cmd, ClusterArgs& a) {
  cmd->add_option("--config", a.config, "Cluster config (YAML; see configs/)")->required();
  cmd->add_option("--model", a.model,
                  "Replace every model of the config with this one (e.g. for a smoke test)");
  cmd->add_option("--tokenizer", a.tokenizer, "Tokenizer of --model (llama2.c tokenizer.bin)");
}

StatusOr<ClusterConfig> Load(const ClusterArgs& a) { return LoadClusterConfig(a.config); }

// This program's own path, for the children it starts.
std::string SelfExe(const char* argv0) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) return p.string();
  return argv0;
}

}  // namespace

CLI::App* AddClusterCommand(CLI::App& app, ClusterArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "cluster", "Start a deployment from a cluster config: everything on this machine, or "
                 "only the request manager (--role manager)");
  AddCommon(cmd, a);
  cmd->add_option("--role", a.role, "all: workers as child processes + manager; manager: only "
                                    "the manager, workers started elsewhere")
      ->check(CLI::IsMember({"all", "manager"}))
      ->capture_default_str();
  cmd->add_option("--http-port", a.http_port, "Replace manager.http_port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  cmd->add_flag("--any-ports", a.any_ports,
                "Every worker on a free port and no gRPC frontend (one machine only: tests, "
                "benchmarks beside other deployments)");
  cmd->add_option("--chat-template", a.chat_template,
                  "Replace manager.chat_template: chatml, llama2, llama3 or gemma");
  cmd->add_flag("--no-prefix-cache", a.no_prefix_cache,
                "Turn the manager's automatic prefix caching off (limits.prefix_cache: false)");
  return cmd;
}

CLI::App* AddWorkerCommand(CLI::App& app, ClusterArgs& a) {
  CLI::App* cmd =
      app.add_subcommand("worker", "Run one worker of a cluster config on this host");
  AddCommon(cmd, a);
  cmd->add_option("--role", a.role, "ssm or llm")->required()->check(CLI::IsMember({"ssm", "llm"}));
  cmd->add_option("--index", a.index, "Which worker of that role (config order, from 0)")
      ->required()
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--port", a.port, "Listen on this port instead of the configured one")
      ->check(CLI::Range(0, 65535));
  return cmd;
}

int RunClusterCommand(const ClusterArgs& a, const char* argv0) {
  auto config = Load(a);
  if (!config.ok()) {
    std::fprintf(stderr, "error: %s\n", config.status().ToString().c_str());
    return 1;
  }
  ClusterOverrides ov{a.model, a.tokenizer, a.http_port, a.any_ports, a.chat_template,
                     a.no_prefix_cache};
  if (ov.any_ports && a.role != "all") {
    std::fprintf(stderr, "error: --any-ports needs --role all (the workers' ports must be known)\n");
    return 1;
  }
  return RunCluster(*config, a.config, a.role == "all", ov, SelfExe(argv0));
}

int RunWorkerCommand(const ClusterArgs& a) {
  auto config = Load(a);
  if (!config.ok()) {
    std::fprintf(stderr, "error: %s\n", config.status().ToString().c_str());
    return 1;
  }
  ClusterOverrides ov;
  ov.model = a.model;
  ov.tokenizer = a.tokenizer;
  return RunClusterWorker(*config, a.config, a.role, a.index, a.port, ov);
}

}  // namespace specinfer
