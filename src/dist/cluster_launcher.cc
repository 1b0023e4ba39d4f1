#include "dist/cluster_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/stop_signal.h"
#include "dist/llm_client.h"
#include "dist/llm_worker.h"
#include "dist/model_identity.h"
#include "dist/ssm_client.h"
#include "dist/ssm_worker.h"
#include "server/inference_server.h"

namespace specinfer {

namespace {

using Clock = std::chrono::steady_clock;

// A worker of the config, flattened: ssm replicas in config order, then llm workers.
struct WorkerSlot {
  std::string role;   // "ssm" or "llm"
  int index = 0;      // within the role
  std::string label;  // "ssm[1]", "llm[3]"
  ClusterEndpoint endpoint;
  size_t group = 0;   // ssm: its group
};

std::vector<WorkerSlot> WorkerSlots(const ClusterConfig& c) {
  std::vector<WorkerSlot> out;
  int n = 0;
  for (size_t g = 0; g < c.ssm.size(); ++g)
    for (const ClusterEndpoint& e : c.ssm[g].replicas) {
      out.push_back({"ssm", n, "ssm[" + std::to_string(n) + "]", e, g});
      ++n;
    }
  if (c.llm.placement == ClusterLlm::Placement::kWorkers)
    for (size_t i = 0; i < c.llm.workers.size(); ++i)
      out.push_back({"llm", static_cast<int>(i), "llm[" + std::to_string(i) + "]",
                     c.llm.workers[i], 0});
  return out;
}

std::string ExitDescription(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "stopped";
}

// ---- child processes ---------------------------------------------------------------------------

// This process's log level as `--log-level` spells it.
std::string LogLevelName() {
  switch (spdlog::get_level()) {
    case spdlog::level::trace: return "trace";
    case spdlog::level::debug: return "debug";
    case spdlog::level::info: return "info";
    case spdlog::level::warn: return "warn";
    case spdlog::level::err:
    case spdlog::level::critical: return "error";
    default: return "off";
  }
}

struct Child {
  WorkerSlot slot;
  pid_t pid = -1;
  int port = 0;  // resolved
  bool alive = false;
};

// A worker process started but not yet listening: its stdout pipe and what it wrote so far.
struct Starting {
  Child child;
  int fd = -1;
  std::string line;
  std::chrono::seconds timeout;
  Clock::time_point deadline;
};

// Starts `self_exe worker ...` for `slot`; it must say it listens before `timeout` passes.
StatusOr<Starting> StartChild(const std::string& self_exe, const std::string& config_path,
                              const WorkerSlot& slot, int port, const ClusterOverrides& ov,
                              std::chrono::seconds timeout) {
  std::vector<std::string> args = {self_exe,
                                   "--log-level",
                                   LogLevelName(),
                                   "worker",
                                   "--config",
                                   config_path,
                                   "--role",
                                   slot.role,
                                   "--index",
                                   std::to_string(slot.index),
                                   "--port",
                                   std::to_string(port)};
  if (!ov.model.empty()) {
    args.push_back("--model");
    args.push_back(ov.model);
    if (!ov.tokenizer.empty()) {
      args.push_back("--tokenizer");
      args.push_back(ov.tokenizer);
    }
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return InternalError("pipe failed");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return InternalError("fork failed");
  }
  if (pid == 0) {
    // Child: dies with the launcher, takes the stop signals again, writes its line to the pipe.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    // Its own process group: a Ctrl-C at the terminal reaches the launcher only, which stops
    // the workers in order (after draining them).
    setpgid(0, 0);
    ResetStopSignalsInChild();
    dup2(fds[1], STDOUT_FILENO);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(self_exe.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  return Starting{Child{slot, pid, 0, true}, fds[0], "", timeout, Clock::now() + timeout};
}

// Reads what a starting child wrote, waiting up to `wait_ms`: true once it says it listens
// (child.port resolved; the pipe is closed), false while it has not yet. An error when it exited
// or its deadline passed (it is then killed and reaped, and the pipe closed).
StatusOr<bool> PollListening(Starting& s, int wait_ms) {
  const WorkerSlot& slot = s.child.slot;
  Status error;
  bool listening = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(s.deadline - Clock::now()).count();
    if (left <= 0) {
      error = UnavailableError(slot.label + ": not listening after " +
                               std::to_string(s.timeout.count()) + " s");
      break;
    }
    pollfd p{s.fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, wait_ms)));
    if (r < 0 && errno != EINTR) {
      error = InternalError("poll failed");
      break;
    }
    if (r == 0) return false;
    if (r < 0) continue;
    char ch;
    const ssize_t got = read(s.fd, &ch, 1);
    if (got <= 0) {
      int status = 0;
      waitpid(s.child.pid, &status, 0);
      s.child.alive = false;
      error = UnavailableError(slot.label + " (pid " + std::to_string(s.child.pid) + ") " +
                               ExitDescription(status) + " before listening");
      break;
    }
    if (ch != '\n') {
      s.line += ch;
      continue;
    }
    // "worker LABEL listening ADDRESS:PORT pid=PID"
    const size_t at = s.line.find(" listening ");
    const size_t colon = s.line.rfind(':', s.line.find(" pid="));
    if (at == std::string::npos || colon == std::string::npos) {
      s.line.clear();
      continue;
    }
    s.child.port = std::atoi(s.line.c_str() + colon + 1);
    listening = true;
    break;
  }
  close(s.fd);
  s.fd = -1;
  if (!error.ok()) {
    if (s.child.alive) {
      kill(s.child.pid, SIGKILL);
      waitpid(s.child.pid, nullptr, 0);
      s.child.alive = false;
    }
    return error;
  }
  return listening;
}

// Starts `self_exe worker ...` for `slot` and waits (up to `timeout`) for its listening line.
StatusOr<Child> Spawn(const std::string& self_exe, const std::string& config_path,
                      const WorkerSlot& slot, int port, const ClusterOverrides& ov,
                      std::chrono::seconds timeout) {
  SI_ASSIGN_OR_RETURN(Starting s, StartChild(self_exe, config_path, slot, port, ov, timeout));
  for (;;) {
    SI_ASSIGN_OR_RETURN(const bool listening, PollListening(s, 1000));
    if (listening) return s.child;
  }
}

class ChildSet {
 public:
  ChildSet(std::string self_exe, std::string config_path, ClusterOverrides ov, bool restart)
      : self_exe_(std::move(self_exe)),
        config_path_(std::move(config_path)),
        ov_(std::move(ov)),
        restart_(restart) {}
  ~ChildSet() { StopAll(std::chrono::seconds(5)); }

  Status Start(const std::vector<WorkerSlot>& slots) {
    for (const WorkerSlot& slot : slots) {
      SI_ASSIGN_OR_RETURN(Child c, Spawn(self_exe_, config_path_, slot, slot.endpoint.port, ov_,
                                         std::chrono::seconds(300)));
      spdlog::info("{} {}:{} started (pid {})", slot.label, slot.endpoint.address, c.port, c.pid);
      std::lock_guard<std::mutex> lock(mu_);
      children_.push_back(c);
    }
    monitor_ = std::thread([this] { Monitor(); });
    return Status::Ok();
  }

  std::vector<Child> children() const {
    std::lock_guard<std::mutex> lock(mu_);
    return children_;
  }

  // No more restarts or exit reports (the launcher is stopping). The monitor thread stays alive
  // until StopAll has stopped the children: a child's PR_SET_PDEATHSIG fires when the *thread*
  // that forked it exits, and the monitor forked every restarted child. Had the thread ended here,
  // each restarted worker would stop before the manager's drain of it was over.
  void StopMonitoring() { stopping_ = true; }

  // SIGTERM to every child, SIGKILL to those still alive after `grace`; then the monitor ends.
  void StopAll(std::chrono::seconds grace) {
    StopMonitoring();
    StopChildren(grace);
    done_ = true;
    if (monitor_.joinable()) monitor_.join();
    StopChildren(grace);  // one the monitor was restarting meanwhile
  }

 private:
  void StopChildren(std::chrono::seconds grace) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Child& c : children_)
      if (c.alive) kill(c.pid, SIGTERM);
    const auto deadline = Clock::now() + grace;
    for (Child& c : children_) {
      while (c.alive) {
        int status = 0;
        const pid_t r = waitpid(c.pid, &status, WNOHANG);
        if (r == c.pid || r < 0) {
          c.alive = false;
          spdlog::info("{} {}:{} (pid {}) stopped: {}", c.slot.label, c.slot.endpoint.address,
                       c.port, c.pid, ExitDescription(status));
          break;
        }
        if (Clock::now() > deadline) {
          spdlog::warn("{} (pid {}) did not stop in time; killing it", c.slot.label, c.pid);
          kill(c.pid, SIGKILL);
          waitpid(c.pid, nullptr, 0);
          c.alive = false;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  // A dead worker being restarted: its slot in children_, tries so far, when the next may start,
  // and the process now starting, if any.
  struct Restart {
    size_t index = 0;
    Child old;
    int attempts = 0;
    Clock::time_point next_try;
    std::optional<Starting> starting;
  };

  // Moves one restart on without waiting: starts the worker when a try is due, reads what a
  // starting one wrote. True when the restart is over (the worker listens again, or the tries
  // ran out).
  bool Advance(Restart& r) {
    constexpr int kMaxAttempts = 20;
    const auto retry_later = [&r](const Status& s) {
      spdlog::error("{}: restart failed: {}", r.old.slot.label, s.ToString());
      r.starting.reset();
      r.next_try = Clock::now() + std::chrono::milliseconds(300);
    };
    if (!r.starting && Clock::now() >= r.next_try) {
      ++r.attempts;
      auto started = StartChild(self_exe_, config_path_, r.old.slot, r.old.port, ov_,
                                std::chrono::seconds(300));
      if (started.ok()) {
        r.starting = std::move(started).value();
      } else {
        retry_later(started.status());
      }
    }
    if (r.starting) {
      StatusOr<bool> listening = PollListening(*r.starting, 0);
      if (!listening.ok()) {
        retry_later(listening.status());
      } else if (*listening) {
        const Child& c = r.starting->child;
        spdlog::warn("{} {}:{} restarted (pid {})", c.slot.label, c.slot.endpoint.address, c.port,
                     c.pid);
        std::lock_guard<std::mutex> lock(mu_);
        children_[r.index] = c;
        return true;
      }
    }
    if (!r.starting && r.attempts >= kMaxAttempts) {
      spdlog::error("{}: giving up after {} restarts", r.old.slot.label, r.attempts);
      return true;
    }
    return false;
  }

  // Every 100 ms: reaps workers that died and moves their restarts on, each without waiting for
  // the others (a worker slow to load its model does not delay noticing or restarting another).
  void Monitor() {
    std::vector<Restart> restarts;
    while (!done_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (stopping_) continue;  // StopAll reaps and reports the children from now on
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t i = 0; i < children_.size(); ++i) {
          Child& c = children_[i];
          if (!c.alive) continue;
          int status = 0;
          if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
            c.alive = false;
            spdlog::error("{} {}:{} (pid {}) {}{}", c.slot.label, c.slot.endpoint.address, c.port,
                          c.pid, ExitDescription(status),
                          restart_ ? "; restarting it on the same port" : "");
            if (restart_)
              restarts.push_back(
                  Restart{i, c, 0, Clock::now() + std::chrono::milliseconds(300), std::nullopt});
          }
        }
      }
      std::erase_if(restarts, [this](Restart& r) { return !stopping_ && Advance(r); });
    }
    // Workers still starting when the launcher stops: StopAll stops them with the others.
    std::lock_guard<std::mutex> lock(mu_);
    for (Restart& r : restarts)
      if (r.starting) {
        close(r.starting->fd);
        children_[r.index] = r.starting->child;
      }
  }

  const std::string self_exe_, config_path_;
  const ClusterOverrides ov_;
  const bool restart_;
  mutable std::mutex mu_;
  std::vector<Child> children_;  // guarded by mu_
  std::atomic<bool> stopping_{false};  // no more restarts or exit reports
  std::atomic<bool> done_{false};      // the children are stopped: the monitor thread may end
  std::thread monitor_;
};

// ---- the manager ------------------------------------------------------------------------------

// The manager's server options for `c`, whose workers listen at `ssm_addresses` (flattened, in
// config order) and `llm_addresses`.
StatusOr<InferenceServerOptions> ManagerOptions(const ClusterConfig& c,
                                                const std::vector<std::string>& ssm_addresses,
                                                const std::vector<std::string>& llm_addresses) {
  InferenceServerOptions o;
  const ClusterModel& m = c.model(c.llm.model);
  o.engine.model_path = m.path;
  o.engine.tokenizer_path = m.tokenizer;
  o.engine.context_length = c.limits.context;
  o.engine.max_sequences = c.limits.max_batch;
  if (c.llm.placement == ClusterLlm::Placement::kInProcess) {
    o.engine.backend = c.llm.backend;
    o.engine.num_threads = c.llm.threads;
    o.engine.dequantize = c.llm.dequantize;
    o.engine.cuda_graphs = c.llm.cuda_graphs;
  } else {
    o.engine.num_threads = c.manager.endpoint.threads;
    LlmGroupOptions g;
    g.workers = llm_addresses;
    g.tp_size = c.llm.tp;
    g.num_stages = c.llm.pp;
    o.engine.custom_backend = LlmGroupBackend(g);
  }
  // One RemoteSpeculator per ssm group, named by its spec.
  std::vector<RemoteSpeculatorOptions> groups;
  size_t flat = 0;
  for (const ClusterSsmGroup& g : c.ssm) {
    RemoteSpeculatorOptions ro;
    ro.name = g.spec;
    for (size_t i = 0; i < g.replicas.size(); ++i, ++flat) {
      ro.replicas.push_back(ssm_addresses.at(flat));
      ro.labels.push_back("ssm[" + std::to_string(flat) + "]");
    }
    ro.rpc_timeout = std::chrono::milliseconds(c.manager.rpc_timeout_ms);
    ro.probe_interval = std::chrono::milliseconds(c.manager.probe_interval_ms);
    groups.push_back(std::move(ro));
  }
  if (!groups.empty()) {
    o.engine.speculator_factory = [groups](std::shared_ptr<const Model> model,
                                           const Tokenizer& tok)
        -> StatusOr<std::vector<std::unique_ptr<Speculator>>> {
      std::vector<std::unique_ptr<Speculator>> out;
      for (RemoteSpeculatorOptions ro : groups) {
        ro.vocab_size = model->config().vocab_size;
        ro.vocab_fingerprint = VocabFingerprint(tok);
        SI_ASSIGN_OR_RETURN(auto s, RemoteSpeculator::Connect(ro));
        out.push_back(std::move(s));
      }
      return out;
    };
  }
  o.served_model_name = c.manager.served_model_name;
  o.chat_template = c.manager.chat_template;
  o.defaults = c.manager.request_defaults;
  o.queue.max_queue = c.limits.max_queue;
  o.queue.batch.max_sequences = c.limits.max_batch;
  o.queue.batch.max_batch_tokens = c.limits.max_batch_tokens;
  o.queue.batch.prefix_cache = c.limits.prefix_cache;
  ParseSpecBudgetMode(c.manager.spec_budget, &o.queue.batch.spec_budget);  // checked at load
  SI_ASSIGN_OR_RETURN(o.queue.default_tree, TreeShape::Parse(c.manager.tree));
  const std::string bind = c.manager.bind.empty() ? c.manager.endpoint.address : c.manager.bind;
  o.http.host = bind;
  o.http.port = c.manager.endpoint.port;
  o.http.max_body_bytes = static_cast<size_t>(c.limits.max_body_bytes);
  if (const char* key = std::getenv("SPECINFER_API_KEY")) o.http.api_key = key;
  o.enable_grpc = c.manager.grpc_port != 0;
  o.grpc.host = bind;
  o.grpc.port = c.manager.grpc_port;
  o.grpc.api_key = o.http.api_key;
  return o;
}

}  // namespace

void ApplyClusterOverrides(const ClusterOverrides& ov, ClusterConfig& c) {
  if (ov.http_port >= 0) c.manager.endpoint.port = ov.http_port;
  if (!ov.chat_template.empty()) c.manager.chat_template = ov.chat_template;
  if (ov.no_prefix_cache) c.limits.prefix_cache = false;
  if (ov.any_ports) {
    c.manager.grpc_port = 0;
    for (auto& g : c.ssm)
      for (auto& e : g.replicas) e.port = 0;
    for (auto& e : c.llm.workers) e.port = 0;
  }
  if (ov.model.empty()) return;
  for (auto& [name, m] : c.models) {
    m.path = ov.model;
    m.tokenizer = ov.tokenizer;
  }
}

int RunClusterWorker(const ClusterConfig& c, const std::string& config_path,
                     const std::string& role, int index, int port_override,
                     const ClusterOverrides& ov) {
  InstallStopSignalHandlers();
  ClusterConfig config = c;
  ApplyClusterOverrides(ov, config);
  const std::vector<WorkerSlot> slots = WorkerSlots(config);
  const WorkerSlot* slot = nullptr;
  for (const WorkerSlot& s : slots)
    if (s.role == role && s.index == index) slot = &s;
  if (slot == nullptr) {
    std::fprintf(stderr, "error: %s has no %s worker %d\n", config_path.c_str(), role.c_str(),
                 index);
    return 1;
  }
  const int port = port_override >= 0 ? port_override : slot->endpoint.port;
  if (role == "ssm") {
    const ClusterSsmGroup& g = config.ssm[slot->group];
    const ClusterModel& m = config.model(g.model);
    SsmWorkerOptions o;
    o.model_path = m.path;
    o.tokenizer_path = m.tokenizer;
    o.speculator = g.spec;
    o.backend = g.backend;
    if (g.backend == "cuda") {
      size_t replica = 0;  // the slot's place within its group
      for (const WorkerSlot& s : slots)
        if (s.role == "ssm" && s.group == slot->group && s.index < index) ++replica;
      o.device = SsmReplicaGpu(config, slot->group, replica);
    }
    o.listen = slot->endpoint.address + ":" + std::to_string(port);
    o.label = slot->label;
    o.num_threads = slot->endpoint.threads;
    o.context_length = config.limits.context;
    o.max_sessions = g.max_sessions;
    o.idle_timeout = std::chrono::seconds(g.idle_timeout_s);
    auto server = SsmWorkerServer::Start(o);
    if (!server.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", slot->label.c_str(),
                   server.status().ToString().c_str());
      return 1;
    }
    std::printf("worker %s listening %s:%d pid=%d\n", slot->label.c_str(),
                slot->endpoint.address.c_str(), (*server)->port(), static_cast<int>(getpid()));
    std::fflush(stdout);
    // Nothing more goes to standard output (a launcher may have closed its end of the pipe).
    if (FILE* devnull = std::freopen("/dev/null", "w", stdout); devnull == nullptr) {
      spdlog::debug("cannot reopen stdout");
    }
    const int sig = WaitForStopSignal();
    spdlog::info("{}: signal {}, stopping", (*server)->label(), sig);
    (*server)->Shutdown();
    return 0;
  }
  // llm: one (stage, tensor-parallel rank) share of the LLM.
  const ClusterModel& m = config.model(config.llm.model);
  LlmWorkerOptions o;
  o.model_path = m.path;
  o.tokenizer_path = m.tokenizer;
  o.listen = slot->endpoint.address + ":" + std::to_string(port);
  o.stage = index / config.llm.tp;
  o.num_stages = config.llm.pp;
  o.tp_rank = index % config.llm.tp;
  o.tp_size = config.llm.tp;
  o.num_threads = config.llm.threads;
  o.context_length = config.limits.context;
  o.max_sequences = config.limits.max_batch;
  o.dequantize = config.llm.dequantize;
  o.backend = config.llm.backend;
  o.cuda_graphs = config.llm.cuda_graphs;
  // A GPU worker's device: as configured, else its place among the LLM workers on its host.
  o.device = LlmWorkerGpu(config, static_cast<size_t>(index));
  auto server = LlmWorkerServer::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", slot->label.c_str(),
                 server.status().ToString().c_str());
    return 1;
  }
  const std::string who = slot->label + " " + (*server)->address() + " (stage " +
                          std::to_string(o.stage) + ", rank " + std::to_string(o.tp_rank) + ")";
  spdlog::info("{}: serving {} layers' share of {}", who, o.num_stages > 1 ? "its stage's" : "all",
               o.model_path);
  std::printf("worker %s listening %s:%d pid=%d\n", slot->label.c_str(),
              slot->endpoint.address.c_str(), (*server)->port(), static_cast<int>(getpid()));
  std::fflush(stdout);
  if (FILE* devnull = std::freopen("/dev/null", "w", stdout); devnull == nullptr) {
    spdlog::debug("cannot reopen stdout");
  }
  const int sig = WaitForStopSignal();
  spdlog::info("{}: signal {}, stopping", who, sig);
  (*server)->Shutdown();
  return 0;
}

int RunCluster(const ClusterConfig& c, const std::string& config_path, bool spawn_workers,
               const ClusterOverrides& ov, const std::string& self_exe) {
  InstallStopSignalHandlers();
  ClusterConfig config = c;
  ApplyClusterOverrides(ov, config);
  if (Status s = CheckClusterRunnable(config); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  const std::vector<WorkerSlot> slots = WorkerSlots(config);
  if (!spawn_workers && !config.all_ports_fixed()) {
    std::fprintf(stderr,
                 "error: %s: port 0 (any free port) works only when `specinfer cluster` starts "
                 "the workers itself; give every worker a port\n",
                 config_path.c_str());
    return 1;
  }
  std::unique_ptr<ChildSet> children;
  std::vector<std::string> ssm_addresses, llm_addresses;
  if (spawn_workers && !slots.empty()) {
    children = std::make_unique<ChildSet>(self_exe, config_path, ov, config.restart_workers);
    if (Status s = children->Start(slots); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
      return 1;
    }
    for (const Child& ch : children->children()) {
      const std::string addr = ch.slot.endpoint.address + ":" + std::to_string(ch.port);
      (ch.slot.role == "ssm" ? ssm_addresses : llm_addresses).push_back(addr);
      std::printf("worker %s pid=%d address=%s\n", ch.slot.label.c_str(), ch.pid, addr.c_str());
    }
  } else {
    for (const WorkerSlot& s : slots)
      (s.role == "ssm" ? ssm_addresses : llm_addresses).push_back(s.endpoint.HostPort());
  }
  auto options = ManagerOptions(config, ssm_addresses, llm_addresses);
  if (!options.ok()) {
    std::fprintf(stderr, "error: %s\n", options.status().ToString().c_str());
    return 1;
  }
  auto server_or = InferenceServer::Start(std::move(*options));
  if (!server_or.ok()) {
    std::fprintf(stderr, "error: %s\n", server_or.status().ToString().c_str());
    return 1;
  }
  InferenceServer& server = **server_or;
  const std::string bind = config.manager.bind.empty() ? config.manager.endpoint.address
                                                       : config.manager.bind;
  const std::string grpc =
      server.grpc_port() ? bind + ":" + std::to_string(server.grpc_port()) : "off";
  std::printf("listening http=%s:%d grpc=%s model=%s\n", bind.c_str(), server.http_port(),
              grpc.c_str(), server.model_name().c_str());
  std::fflush(stdout);
  spdlog::warn("manager serving '{}' on http://{}:{} (gRPC {}) with {} SSM replica(s), LLM {}",
               server.model_name(), bind, server.http_port(), grpc, ssm_addresses.size(),
               config.llm.placement == ClusterLlm::Placement::kInProcess
                   ? std::string("in-process")
                   : std::to_string(llm_addresses.size()) + " workers");

  const int sig = WaitForStopSignal();
  spdlog::warn("manager: signal {}: no new requests; cancelling running ones, draining workers",
               sig);
  if (children) children->StopMonitoring();
  server.Shutdown();
  for (Speculator* s : server.queue().engine().speculators())
    if (auto* remote = dynamic_cast<RemoteSpeculator*>(s)) remote->DrainAll();
  if (children) children->StopAll(std::chrono::seconds(config.manager.drain_timeout_s));
  spdlog::warn("manager: stopped");
  return 0;
}

}  // namespace specinfer
