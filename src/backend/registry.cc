#include "backend/registry.h"

#include <map>
#include <mutex>

#include "backend/cpu/cpu_runner.h"

namespace specinfer {

namespace {

// The core library's own backend.
Backend CpuBackend() {
  Backend b;
  b.name = "cpu";
  b.create = [](std::shared_ptr<const Model> model,
                const RunnerOptions& o) -> StatusOr<std::unique_ptr<ModelRunner>> {
    CpuRunnerOptions co;
    co.num_threads = o.num_threads;
    co.pool = o.pool;
    co.num_kv_blocks = o.num_kv_blocks;
    co.kv_block_size = o.kv_block_size;
    SI_ASSIGN_OR_RETURN(auto runner, CpuModelRunner::Create(std::move(model), co));
    return std::unique_ptr<ModelRunner>(std::move(runner));
  };
  return b;
}

struct Registry {
  std::mutex mu;
  std::map<std::string, Backend, std::less<>> backends;  // guarded by mu
};

Registry& TheRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: no destruction-order hazard at exit
    reg->backends.emplace("cpu", CpuBackend());
    return reg;
  }();
  return *r;
}

}  // namespace

void RegisterBackend(Backend backend) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string name = backend.name;
  r.backends[name] = std::move(backend);
}

StatusOr<Backend> FindBackend(std::string_view name) {
  Registry& r = TheRegistry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (auto it = r.backends.find(name); it != r.backends.end()) return it->second;
  }
  if (name == "cuda")
    return FailedPreconditionError(
        "this build has no CUDA backend (rebuild where the CUDA toolkit is installed)");
  std::string known;
  for (const std::string& n : BackendNames()) known += (known.empty() ? "" : ", ") + n;
  return InvalidArgumentError("unknown backend '" + std::string(name) + "' (this build has " +
                              known + ")");
}

std::vector<std::string> BackendNames() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, b] : r.backends) names.push_back(name);
  return names;
}

StatusOr<std::unique_ptr<ModelRunner>> CreateRunner(const Backend& backend,
                                                    std::shared_ptr<const Model> model,
                                                    const RunnerOptions& options) {
  if (!backend.create) return InternalError("backend '" + backend.name + "' has no factory");
  SI_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                      backend.create(std::move(model), options));
  if (!runner) return InternalError("backend '" + backend.name + "' created no runner");
  return runner;
}

StatusOr<std::unique_ptr<ModelRunner>> CreateRunner(std::string_view backend,
                                                    std::shared_ptr<const Model> model,
                                                    const RunnerOptions& options) {
  SI_ASSIGN_OR_RETURN(Backend b, FindBackend(backend));
  return CreateRunner(b, std::move(model), options);
}

}  // namespace specinfer
