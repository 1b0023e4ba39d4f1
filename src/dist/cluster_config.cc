#include "dist/cluster_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "backend/registry.h"
#include "spec/spec_grammar.h"
#include "spec/speculator.h"
#include "engine/spec_controller.h"
#include "spec/token_tree.h"

namespace specinfer {

namespace {

// Reads one YAML mapping with a fixed set of keys; errors name the key path.
class Reader {
 public:
  Reader(const YAML::Node& node, std::string path, const std::string& source)
      : node_(node), path_(std::move(path)), source_(source) {}

  Status Error(const std::string& key, const std::string& what) const {
    return InvalidArgumentError(source_ + ": " + Join(key) + ": " + what);
  }
  std::string Join(const std::string& key) const {
    return path_.empty() ? key : key.empty() ? path_ : path_ + "." + key;
  }

  // Refuses keys outside `allowed`, and a node that is not a mapping.
  Status Keys(std::initializer_list<const char*> allowed) const {
    if (!node_.IsMap()) return Error("", "expected a mapping");
    std::set<std::string> ok(allowed.begin(), allowed.end());
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      if (!ok.count(key)) {
        std::string list;
        for (const auto& k : ok) list += (list.empty() ? "" : ", ") + k;
        return Error(key, "unknown key (expected one of: " + list + ")");
      }
    }
    return Status::Ok();
  }

  bool Has(const char* key) const { return node_[key] && !node_[key].IsNull(); }
  YAML::Node Get(const char* key) const { return node_[key]; }

  Status Int(const char* key, int64_t lo, int64_t hi, int64_t* out) const {
    if (!Has(key)) return Status::Ok();
    const YAML::Node n = node_[key];
    int64_t v = 0;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v))
      return Error(key, "'" + Scalar(n) + "' is not an integer");
    if (v < lo || v > hi)
      return Error(key, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
    *out = v;
    return Status::Ok();
  }
  Status Int32(const char* key, int64_t lo, int64_t hi, int32_t* out) const {
    int64_t v = *out;
    SI_RETURN_IF_ERROR(Int(key, lo, hi, &v));
    *out = static_cast<int32_t>(v);
    return Status::Ok();
  }
  Status Float(const char* key, float* out) const {
    if (!Has(key)) return Status::Ok();
    const YAML::Node n = node_[key];
    double v = 0;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v))
      return Error(key, "'" + Scalar(n) + "' is not a number");
    *out = static_cast<float>(v);
    return Status::Ok();
  }
  Status Str(const char* key, std::string* out, bool required = false) const {
    if (!Has(key)) {
      if (required) return Error(key, "required");
      return Status::Ok();
    }
    const YAML::Node n = node_[key];
    if (!n.IsScalar()) return Error(key, "expected a string");
    *out = n.as<std::string>();
    if (required && out->empty()) return Error(key, "must not be empty");
    return Status::Ok();
  }
  Status Bool(const char* key, bool* out) const {
    if (!Has(key)) return Status::Ok();
    bool v = false;
    if (!node_[key].IsScalar() || !YAML::convert<bool>::decode(node_[key], v))
      return Error(key, "'" + Scalar(node_[key]) + "' is not true or false");
    *out = v;
    return Status::Ok();
  }

  static std::string Scalar(const YAML::Node& n) {
    return n.IsScalar() ? n.Scalar() : std::string("(not a scalar)");
  }

 private:
  const YAML::Node node_;
  const std::string path_;
  const std::string& source_;
};

Status ReadEndpoint(const YAML::Node& node, const std::string& path, const std::string& source,
                    const ClusterConfig& c, bool with_threads, ClusterEndpoint* e) {
  Reader r(node, path, source);
  if (with_threads) {  // an SSM replica
    SI_RETURN_IF_ERROR(r.Keys({"host", "port", "threads", "gpu"}));
  } else {  // an LLM worker
    SI_RETURN_IF_ERROR(r.Keys({"host", "port", "gpu"}));
  }
  SI_RETURN_IF_ERROR(r.Int32("gpu", 0, 1023, &e->gpu));
  e->host = "local";
  SI_RETURN_IF_ERROR(r.Str("host", &e->host));
  auto it = c.hosts.find(e->host);
  if (it == c.hosts.end()) return r.Error("host", "unknown host '" + e->host + "' (not in hosts)");
  e->address = it->second;
  if (!r.Has("port")) return r.Error("port", "required");
  SI_RETURN_IF_ERROR(r.Int32("port", 0, 65535, &e->port));
  SI_RETURN_IF_ERROR(r.Int32("threads", 0, 1024, &e->threads));
  return Status::Ok();
}

StatusOr<ClusterConfig> Parse(const YAML::Node& root, const std::string& source) {
  ClusterConfig c;
  c.source = source;
  Reader top(root, "", source);
  SI_RETURN_IF_ERROR(top.Keys({"hosts", "models", "limits", "manager", "ssm", "llm",
                               "restart_workers"}));

  // hosts
  c.hosts["local"] = "127.0.0.1";
  if (top.Has("hosts")) {
    const YAML::Node hosts = top.Get("hosts");
    if (!hosts.IsMap()) return top.Error("hosts", "expected a mapping of name: address");
    for (const auto& kv : hosts) {
      const std::string name = kv.first.as<std::string>();
      if (!kv.second.IsScalar() || kv.second.Scalar().empty())
        return top.Error("hosts." + name, "expected an address");
      c.hosts[name] = kv.second.Scalar();
    }
  }

  // models
  if (!top.Has("models")) return top.Error("models", "required (at least the LLM's)");
  const YAML::Node models = top.Get("models");
  if (!models.IsMap() || models.size() == 0)
    return top.Error("models", "expected a mapping of name: path");
  for (const auto& kv : models) {
    const std::string name = kv.first.as<std::string>();
    ClusterModel m;
    if (kv.second.IsScalar()) {
      m.path = kv.second.Scalar();
    } else {
      Reader r(kv.second, "models." + name, source);
      SI_RETURN_IF_ERROR(r.Keys({"path", "tokenizer"}));
      SI_RETURN_IF_ERROR(r.Str("path", &m.path, /*required=*/true));
      SI_RETURN_IF_ERROR(r.Str("tokenizer", &m.tokenizer));
    }
    if (m.path.empty()) return top.Error("models." + name, "empty path");
    c.models[name] = m;
  }
  // Whether a backend exists in this program is CheckClusterRunnable's question, not parsing's.
  auto backend_ref = [](const Reader& r, std::string* out) -> Status {
    SI_RETURN_IF_ERROR(r.Str("backend", out));
    if (*out != "cpu" && *out != "cuda")
      return r.Error("backend", "'" + *out + "' (expected cpu or cuda)");
    return Status::Ok();
  };
  auto model_ref = [&](const Reader& r, const char* key, std::string* out) -> Status {
    if (!r.Has(key)) {
      if (c.models.size() == 1) {
        *out = c.models.begin()->first;
        return Status::Ok();
      }
      return r.Error(key, "required (several models are defined)");
    }
    SI_RETURN_IF_ERROR(r.Str(key, out));
    if (!c.models.count(*out)) return r.Error(key, "unknown model '" + *out + "' (not in models)");
    return Status::Ok();
  };

  // limits
  if (top.Has("limits")) {
    Reader r(top.Get("limits"), "limits", source);
    SI_RETURN_IF_ERROR(
        r.Keys({"max_batch", "max_batch_tokens", "max_queue", "context", "max_body_bytes",
                "prefix_cache"}));
    SI_RETURN_IF_ERROR(r.Int32("max_batch", 1, 1024, &c.limits.max_batch));
    SI_RETURN_IF_ERROR(r.Int32("max_batch_tokens", 1, 1 << 16, &c.limits.max_batch_tokens));
    SI_RETURN_IF_ERROR(r.Int32("max_queue", 1, 1 << 20, &c.limits.max_queue));
    SI_RETURN_IF_ERROR(r.Int32("context", 0, 1 << 24, &c.limits.context));
    SI_RETURN_IF_ERROR(r.Int("max_body_bytes", 1024, int64_t{1} << 30, &c.limits.max_body_bytes));
    SI_RETURN_IF_ERROR(r.Bool("prefix_cache", &c.limits.prefix_cache));
  }

  // manager
  c.manager.endpoint.host = "local";
  c.manager.endpoint.address = c.hosts["local"];
  c.manager.endpoint.port = 8000;
  c.manager.endpoint.threads = 0;
  if (top.Has("manager")) {
    Reader r(top.Get("manager"), "manager", source);
    SI_RETURN_IF_ERROR(r.Keys({"host", "bind", "http_port", "grpc_port", "threads", "tree",
                               "spec_budget", "served_model_name", "chat_template", "rpc_timeout_ms",
                               "probe_interval_ms", "drain_timeout_s", "request_defaults"}));
    SI_RETURN_IF_ERROR(r.Str("host", &c.manager.endpoint.host));
    auto it = c.hosts.find(c.manager.endpoint.host);
    if (it == c.hosts.end())
      return r.Error("host", "unknown host '" + c.manager.endpoint.host + "' (not in hosts)");
    c.manager.endpoint.address = it->second;
    SI_RETURN_IF_ERROR(r.Str("bind", &c.manager.bind));
    SI_RETURN_IF_ERROR(r.Int32("http_port", 0, 65535, &c.manager.endpoint.port));
    SI_RETURN_IF_ERROR(r.Int32("grpc_port", 0, 65535, &c.manager.grpc_port));
    SI_RETURN_IF_ERROR(r.Int32("threads", 0, 1024, &c.manager.endpoint.threads));
    if (r.Has("tree")) {
      const YAML::Node t = r.Get("tree");
      if (t.IsSequence()) {
        std::string s;
        for (const auto& w : t) s += (s.empty() ? "" : ",") + Reader::Scalar(w);
        c.manager.tree = s;
      } else {
        SI_RETURN_IF_ERROR(r.Str("tree", &c.manager.tree));
      }
      auto shape = TreeShape::Parse(c.manager.tree);
      if (!shape.ok()) return r.Error("tree", shape.status().message());
    }
    SI_RETURN_IF_ERROR(r.Str("spec_budget", &c.manager.spec_budget));
    if (SpecBudgetMode m; !ParseSpecBudgetMode(c.manager.spec_budget, &m))
      return r.Error("spec_budget",
                     "'" + c.manager.spec_budget + "' is not auto, static or dynamic");
    SI_RETURN_IF_ERROR(r.Str("served_model_name", &c.manager.served_model_name));
    SI_RETURN_IF_ERROR(r.Str("chat_template", &c.manager.chat_template));
    SI_RETURN_IF_ERROR(r.Int32("rpc_timeout_ms", 10, 600000, &c.manager.rpc_timeout_ms));
    SI_RETURN_IF_ERROR(r.Int32("probe_interval_ms", 10, 600000, &c.manager.probe_interval_ms));
    SI_RETURN_IF_ERROR(r.Int32("drain_timeout_s", 0, 3600, &c.manager.drain_timeout_s));
    if (r.Has("request_defaults")) {
      Reader d(r.Get("request_defaults"), "manager.request_defaults", source);
      GenerationDefaults& g = c.manager.request_defaults;
      SI_RETURN_IF_ERROR(d.Keys({"temperature", "top_p", "top_k", "max_tokens"}));
      SI_RETURN_IF_ERROR(d.Float("temperature", &g.temperature));
      SI_RETURN_IF_ERROR(d.Float("top_p", &g.top_p));
      SI_RETURN_IF_ERROR(d.Int32("top_k", -1, 1 << 30, &g.top_k));
      SI_RETURN_IF_ERROR(d.Int("max_tokens", 1, int64_t{1} << 40, &g.max_tokens));
      if (Status s = g.Validate(); !s.ok()) return d.Error("", s.message());
    }
  }

  // llm
  if (!top.Has("llm")) return top.Error("llm", "required");
  {
    Reader r(top.Get("llm"), "llm", source);
    SI_RETURN_IF_ERROR(r.Keys({"model", "placement", "backend", "tp", "pp", "threads",
                               "dequantize", "cuda_graphs", "workers"}));
    SI_RETURN_IF_ERROR(model_ref(r, "model", &c.llm.model));
    std::string placement = "in-process";
    SI_RETURN_IF_ERROR(r.Str("placement", &placement));
    if (placement == "in-process") c.llm.placement = ClusterLlm::Placement::kInProcess;
    else if (placement == "workers") c.llm.placement = ClusterLlm::Placement::kWorkers;
    else return r.Error("placement", "'" + placement + "' (expected in-process or workers)");
    SI_RETURN_IF_ERROR(backend_ref(r, &c.llm.backend));
    SI_RETURN_IF_ERROR(r.Int32("tp", 1, 64, &c.llm.tp));
    if (r.Has("tp") && c.llm.tp < 1) return r.Error("tp", "must be >= 1");
    SI_RETURN_IF_ERROR(r.Int32("pp", 1, 64, &c.llm.pp));
    SI_RETURN_IF_ERROR(r.Int32("threads", 0, 1024, &c.llm.threads));
    SI_RETURN_IF_ERROR(r.Bool("dequantize", &c.llm.dequantize));
    SI_RETURN_IF_ERROR(r.Bool("cuda_graphs", &c.llm.cuda_graphs));
    if (r.Has("workers")) {
      const YAML::Node w = r.Get("workers");
      if (!w.IsSequence()) return r.Error("workers", "expected a list of {host, port}");
      for (size_t i = 0; i < w.size(); ++i) {
        ClusterEndpoint e;
        e.threads = c.llm.threads;
        SI_RETURN_IF_ERROR(ReadEndpoint(w[i], "llm.workers[" + std::to_string(i) + "]", source,
                                        c, /*with_threads=*/false, &e));
        c.llm.workers.push_back(e);
      }
    }
    if (c.llm.placement == ClusterLlm::Placement::kWorkers) {
      const size_t want = static_cast<size_t>(c.llm.tp) * static_cast<size_t>(c.llm.pp);
      if (c.llm.workers.size() != want)
        return r.Error("workers", std::to_string(c.llm.workers.size()) + " workers for tp " +
                                      std::to_string(c.llm.tp) + " x pp " +
                                      std::to_string(c.llm.pp) + " (needs " +
                                      std::to_string(want) + ", stage-major)");
    } else {
      if (!c.llm.workers.empty())
        return r.Error("workers", "given, but placement is in-process");
      if (c.llm.tp != 1 || c.llm.pp != 1)
        return r.Error("tp", "tensor and pipeline parallelism need placement: workers");
    }
  }

  // ssm
  if (top.Has("ssm")) {
    const YAML::Node groups = top.Get("ssm");
    if (!groups.IsSequence()) return top.Error("ssm", "expected a list of speculators");
    std::set<std::string> specs;
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::string path = "ssm[" + std::to_string(g) + "]";
      Reader r(groups[g], path, source);
      SI_RETURN_IF_ERROR(
          r.Keys({"spec", "model", "backend", "max_sessions", "idle_timeout_s", "replicas"}));
      ClusterSsmGroup grp;
      SI_RETURN_IF_ERROR(r.Str("spec", &grp.spec, /*required=*/true));
      if (auto d = ParseDraftSpec(grp.spec); !d.ok()) return r.Error("spec", d.status().message());
      if (!specs.insert(grp.spec).second)
        return r.Error("spec", "'" + grp.spec + "' appears twice (replicas go in one entry)");
      SI_RETURN_IF_ERROR(model_ref(r, "model", &grp.model));
      SI_RETURN_IF_ERROR(backend_ref(r, &grp.backend));
      if (grp.backend != "cpu" && ParseDraftSpec(grp.spec)->kind == DraftSpec::Kind::kNgram)
        return r.Error("backend", grp.backend + ": " + grp.spec +
                                      " runs no model (model: and layers: drafts run on a "
                                      "GPU); use backend: cpu");
      SI_RETURN_IF_ERROR(r.Int32("max_sessions", 1, 4096, &grp.max_sessions));
      SI_RETURN_IF_ERROR(r.Int32("idle_timeout_s", 1, 86400, &grp.idle_timeout_s));
      if (!r.Has("replicas")) return r.Error("replicas", "required (at least one)");
      const YAML::Node reps = r.Get("replicas");
      if (!reps.IsSequence() || reps.size() == 0)
        return r.Error("replicas", "expected a non-empty list of {host, port, threads}");
      for (size_t i = 0; i < reps.size(); ++i) {
        ClusterEndpoint e;
        SI_RETURN_IF_ERROR(ReadEndpoint(reps[i], path + ".replicas[" + std::to_string(i) + "]",
                                        source, c, /*with_threads=*/true, &e));
        if (e.gpu >= 0 && grp.backend != "cuda")
          return r.Error("replicas[" + std::to_string(i) + "].gpu",
                         "given, but " + path + ".backend is " + grp.backend +
                             " (a gpu is for backend: cuda)");
        grp.replicas.push_back(e);
      }
      if (grp.max_sessions == 0) grp.max_sessions = c.limits.max_batch;
      c.ssm.push_back(std::move(grp));
    }
  }
  SI_RETURN_IF_ERROR(top.Bool("restart_workers", &c.restart_workers));

  // No two listeners on one fixed address.
  std::map<std::string, std::string> used;
  auto claim = [&](const std::string& address, int32_t port, const std::string& who) -> Status {
    if (port == 0) return Status::Ok();
    const std::string key = address + ":" + std::to_string(port);
    auto [it, fresh] = used.emplace(key, who);
    if (!fresh) return top.Error(who, "port " + key + " is also used by " + it->second);
    return Status::Ok();
  };
  SI_RETURN_IF_ERROR(claim(c.manager.endpoint.address, c.manager.endpoint.port, "manager.http_port"));
  SI_RETURN_IF_ERROR(claim(c.manager.endpoint.address, c.manager.grpc_port, "manager.grpc_port"));
  for (size_t g = 0; g < c.ssm.size(); ++g)
    for (size_t i = 0; i < c.ssm[g].replicas.size(); ++i)
      SI_RETURN_IF_ERROR(claim(c.ssm[g].replicas[i].address, c.ssm[g].replicas[i].port,
                               "ssm[" + std::to_string(g) + "].replicas[" + std::to_string(i) + "]"));
  for (size_t i = 0; i < c.llm.workers.size(); ++i)
    SI_RETURN_IF_ERROR(claim(c.llm.workers[i].address, c.llm.workers[i].port,
                             "llm.workers[" + std::to_string(i) + "]"));
  return c;
}

}  // namespace

int32_t LlmWorkerGpu(const ClusterConfig& c, size_t worker) {
  const ClusterEndpoint& e = c.llm.workers.at(worker);
  if (e.gpu >= 0) return e.gpu;
  int32_t place = 0;
  for (size_t i = 0; i < worker; ++i) place += c.llm.workers[i].host == e.host;
  return place;
}

int32_t SsmReplicaGpu(const ClusterConfig& c, size_t group, size_t replica) {
  const ClusterEndpoint& e = c.ssm.at(group).replicas.at(replica);
  if (e.gpu >= 0) return e.gpu;
  int32_t place = 0;
  for (size_t g = 0; g <= group; ++g) {
    if (c.ssm[g].backend != "cuda") continue;
    const size_t end = g == group ? replica : c.ssm[g].replicas.size();
    for (size_t i = 0; i < end; ++i) place += c.ssm[g].replicas[i].host == e.host;
  }
  return place;
}

bool ClusterConfig::all_ports_fixed() const {
  for (const auto& g : ssm)
    for (const auto& e : g.replicas)
      if (e.port == 0) return false;
  for (const auto& e : llm.workers)
    if (e.port == 0) return false;
  return true;
}

StatusOr<ClusterConfig> ParseClusterConfig(const std::string& yaml_text,
                                           const std::string& source) {
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap()) return InvalidArgumentError(source + ": expected a YAML mapping at the top");
    return Parse(root, source);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(source + ": " + e.what());
  } catch (const std::exception& e) {
    return InvalidArgumentError(source + ": " + e.what());
  }
}

StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read cluster config '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseClusterConfig(ss.str(), path);
}

Status CheckClusterRunnable(const ClusterConfig& c) {
  auto registered = [&](const std::string& key, const std::string& backend) -> Status {
    const Status s = FindBackend(backend).status();
    if (s.ok()) return s;
    return FailedPreconditionError(c.source + ": " + key + ": " + backend + ": " + s.message() +
                                   "; use backend: cpu");
  };
  SI_RETURN_IF_ERROR(registered("llm.backend", c.llm.backend));
  for (size_t i = 0; i < c.ssm.size(); ++i)
    SI_RETURN_IF_ERROR(registered("ssm[" + std::to_string(i) + "].backend", c.ssm[i].backend));
  if (c.llm.placement == ClusterLlm::Placement::kWorkers && !kClusterHasLlmWorkers)
    return FailedPreconditionError(c.source +
                                   ": llm.placement: workers: this build has no LLM worker role "
                                   "yet; use placement: in-process");
  return Status::Ok();
}

}  // namespace specinfer
