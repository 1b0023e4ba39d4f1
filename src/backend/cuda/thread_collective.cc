#include "backend/cuda/thread_collective.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/device_buffer.h"

namespace specinfer::cuda {

struct ThreadCollectiveGroup::State {
  // One stage's TP group: a reusable barrier (arrivals counted per generation) and the input
  // each rank posted for the current all-gather.
  struct TpGroup {
    int32_t arrived = 0;
    uint64_t generation = 0;
    std::vector<const float*> in;
    std::vector<std::vector<size_t>> counts;  // each rank's view of every rank's count
  };

  int32_t num_stages = 1, tp_size = 1;
  std::chrono::milliseconds timeout{30000};
  std::mutex mu;
  std::condition_variable cv;
  Status failed;                                   // guarded by mu; OK while the group is usable
  std::vector<TpGroup> tp;                         // [stage], guarded by mu
  std::vector<std::deque<std::vector<float>>> to;  // [stage * tp_size + tp_rank]: its inbox

  // Marks the group failed (the first reason wins) and wakes every waiter.
  void Fail(const Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failed.ok())
        failed = Status(StatusCode::kAborted, "collective group failed: " + why.ToString());
    }
    cv.notify_all();
  }

  // Waits under `lock` until `ready()`; the group's failure or its timeout (which fails the
  // group) end the wait with an error.
  template <typename Pred>
  Status WaitLocked(std::unique_lock<std::mutex>& lock, const char* what, Pred ready) {
    const bool done = cv.wait_for(lock, timeout, [&] { return !failed.ok() || ready(); });
    if (!failed.ok()) return failed;
    if (done) return Status::Ok();
    failed = Status(StatusCode::kDeadlineExceeded,
                    std::string("collective group: no peer progress in ") + what + " within " +
                        std::to_string(timeout.count()) + " ms");
    cv.notify_all();
    return failed;
  }

  // Barrier of the TP ranks of `stage`.
  Status Barrier(std::unique_lock<std::mutex>& lock, int32_t stage, const char* what) {
    if (!failed.ok()) return failed;
    TpGroup& g = tp[static_cast<size_t>(stage)];
    const uint64_t gen = g.generation;
    if (++g.arrived == tp_size) {
      g.arrived = 0;
      ++g.generation;
      cv.notify_all();
      return Status::Ok();
    }
    return WaitLocked(lock, what, [&] { return g.generation != gen; });
  }
};

namespace {

class ThreadRank final : public DeviceCollective {
 public:
  using State = ThreadCollectiveGroup::State;
  ThreadRank(std::shared_ptr<State> state, CollectiveLayout layout)
      : s_(std::move(state)), layout_(layout) {}

  const CollectiveLayout& layout() const override { return layout_; }

  Status AllGather(const float* in, float* out, std::span<const size_t> counts,
                   CUstream_st* stream) override {
    if (counts.size() != static_cast<size_t>(layout_.tp_size))
      return Fail(InternalError("all-gather: one count per TP rank"));
    SI_ASSIGN_OR_RETURN(const bool capturing, Capturing(stream));
    if (capturing) return Record({Op::kAllGather, in, out, {counts.begin(), counts.end()}}, stream);
    SI_RETURN_IF_ERROR(Local(cudaStreamSynchronize(stream), "all-gather input"));
    SI_ASSIGN_OR_RETURN(const std::vector<const float*> in_ptrs, MeetForAllGather(in, counts));
    size_t off = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      SI_RETURN_IF_ERROR(Local(cudaMemcpyAsync(out + off, in_ptrs[r], counts[r] * sizeof(float),
                                               cudaMemcpyDefault, stream),
                               "all-gather copy"));
      off += counts[r];
    }
    SI_RETURN_IF_ERROR(Local(cudaStreamSynchronize(stream), "all-gather copy"));
    return LeaveAllGather();
  }

  Status SendToNextStage(const float* data, size_t count, CUstream_st* stream) override {
    if (layout_.stage + 1 >= layout_.num_stages)
      return Fail(InternalError("send from the last pipeline stage"));
    SI_ASSIGN_OR_RETURN(const bool capturing, Capturing(stream));
    if (capturing) return Record({Op::kSend, data, nullptr, {count}}, stream);
    std::vector<float> msg(count);
    SI_RETURN_IF_ERROR(Local(cudaStreamSynchronize(stream), "pipeline send"));
    SI_RETURN_IF_ERROR(Local(cudaMemcpy(msg.data(), data, count * sizeof(float), cudaMemcpyDefault),
                             "pipeline send"));
    return PostMessage(std::move(msg));
  }

  Status RecvFromPrevStage(float* data, size_t count, CUstream_st* stream) override {
    if (layout_.stage == 0) return Fail(InternalError("receive on the first pipeline stage"));
    SI_ASSIGN_OR_RETURN(const bool capturing, Capturing(stream));
    if (capturing) return Record({Op::kRecv, nullptr, data, {count}}, stream);
    SI_ASSIGN_OR_RETURN(const std::vector<float> msg, TakeMessage(count));
    SI_RETURN_IF_ERROR(
        Local(cudaMemcpyAsync(data, msg.data(), count * sizeof(float), cudaMemcpyDefault, stream),
              "pipeline receive"));
    return Local(cudaStreamSynchronize(stream), "pipeline receive");  // before msg is freed
  }

  // Recorded operations are host functions that copy with memcpy, so they need device memory
  // the host can address: the emulator's (host memory), not a GPU's cudaMalloc memory (a host
  // function may not call CUDA to copy it). Probed once, with a small allocation.
  bool capturable() override {
    if (!capturable_.has_value()) {
      void* probe = nullptr;
      capturable_ = cudaMalloc(&probe, 256) == cudaSuccess && HostAddressable(probe);
      if (probe != nullptr) cudaFree(probe);
      cudaGetLastError();
    }
    return *capturable_;
  }

  Status Synchronize(CUstream_st* stream) override {
    SI_RETURN_IF_ERROR(Local(cudaStreamSynchronize(stream), "synchronize"));
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->failed;
  }

  void Abort(const Status& why) override {
    s_->Fail(why.WithContext("stage " + std::to_string(layout_.stage) + " tp rank " +
                             std::to_string(layout_.tp_rank)));
  }

 private:
  // An operation recorded into a CUDA graph: what it was called with (sizes: the all-gather's
  // counts, or the message's length).
  struct Op {
    enum Kind { kAllGather, kSend, kRecv } kind;
    const float* in = nullptr;
    float* out = nullptr;
    std::vector<size_t> sizes;
    auto Key() const { return std::tie(kind, in, out, sizes); }
    bool operator<(const Op& o) const { return Key() < o.Key(); }
  };
  struct Recorded {
    ThreadRank* rank;
    Op op;
  };

  static bool HostAddressable(const void* p) {
    cudaPointerAttributes a{};
    const bool ok = cudaPointerGetAttributes(&a, p) == cudaSuccess && a.hostPointer == p;
    cudaGetLastError();
    return ok;
  }

  // Whether `stream` is capturing a graph.
  StatusOr<bool> Capturing(CUstream_st* stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    SI_RETURN_IF_ERROR(Local(cudaStreamIsCapturing(stream, &status), "capture status"));
    return status != cudaStreamCaptureStatusNone;
  }

  // Records `op` as a host function on the capturing stream; an error if its buffers are not
  // host-addressable (see capturable()). One record per distinct call (a graph captured again
  // for the same buffers and sizes reuses it): they live as long as this rank, which outlives
  // the graphs that hold them (a runner drops its graphs before it lets go of its group).
  Status Record(Op op, CUstream_st* stream) {
    for (const void* b : {static_cast<const void*>(op.in), static_cast<const void*>(op.out)})
      if (b != nullptr && !HostAddressable(b))
        return Fail(UnimplementedError(
            "the in-process collective cannot be captured into a CUDA graph here (device memory "
            "the host cannot address); NCCL can"));
    auto [it, added] = recorded_.try_emplace(op, nullptr);
    if (added) it->second.reset(new Recorded{this, std::move(op)});
    return Local(cudaLaunchHostFunc(stream, &ThreadRank::RunRecorded, it->second.get()),
                 "recording a collective");
  }

  // A recorded operation, run by a graph launch once the stream's earlier work is done. It may
  // not call CUDA: copies are memcpy (capturable() made sure the host addresses these buffers).
  // Its errors fail the group (Synchronize returns them); the graph's later work runs on
  // whatever the buffers hold, and the pass's result is not used.
  static void RunRecorded(void* p) {
    auto* r = static_cast<Recorded*>(p);
    ThreadRank& self = *r->rank;
    const Op& op = r->op;
    switch (op.kind) {
      case Op::kAllGather: {
        StatusOr<std::vector<const float*>> in = self.MeetForAllGather(op.in, op.sizes);
        if (!in.ok()) return;
        size_t off = 0;
        for (size_t i = 0; i < op.sizes.size(); ++i) {
          std::memcpy(op.out + off, (*in)[i], op.sizes[i] * sizeof(float));
          off += op.sizes[i];
        }
        (void)self.LeaveAllGather();
        return;
      }
      case Op::kSend:
        (void)self.PostMessage(std::vector<float>(op.in, op.in + op.sizes[0]));
        return;
      case Op::kRecv: {
        StatusOr<std::vector<float>> msg = self.TakeMessage(op.sizes[0]);
        if (msg.ok()) std::memcpy(op.out, msg->data(), msg->size() * sizeof(float));
        return;
      }
    }
  }

  // Posts this rank's all-gather input and meets the stage's TP ranks: every rank's input.
  StatusOr<std::vector<const float*>> MeetForAllGather(const float* in,
                                                       std::span<const size_t> counts) {
    const int32_t me = layout_.tp_rank, stage = layout_.stage;
    std::unique_lock<std::mutex> lock(s_->mu);
    State::TpGroup& g = s_->tp[static_cast<size_t>(stage)];
    g.in[static_cast<size_t>(me)] = in;
    g.counts[static_cast<size_t>(me)].assign(counts.begin(), counts.end());
    SI_RETURN_IF_ERROR(s_->Barrier(lock, stage, "all-gather"));
    // Every rank compares all views, so all of them see a mismatch and none copies.
    for (size_t r = 0; r < counts.size(); ++r)
      if (!std::equal(counts.begin(), counts.end(), g.counts[r].begin(), g.counts[r].end()))
        return FailLocked(lock,
                          InternalError("all-gather: TP ranks " + std::to_string(me) + " and " +
                                        std::to_string(r) + " disagree on the counts"));
    return g.in;
  }
  // After this rank's copies: nobody may overwrite its input before every peer has copied it.
  Status LeaveAllGather() {
    std::unique_lock<std::mutex> lock(s_->mu);
    return s_->Barrier(lock, layout_.stage, "all-gather");
  }
  Status PostMessage(std::vector<float> msg) {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (!s_->failed.ok()) return s_->failed;
      s_->to[Index(layout_.stage + 1)].push_back(std::move(msg));
    }
    s_->cv.notify_all();
    return Status::Ok();
  }
  StatusOr<std::vector<float>> TakeMessage(size_t count) {
    std::unique_lock<std::mutex> lock(s_->mu);
    auto& inbox = s_->to[Index(layout_.stage)];
    SI_RETURN_IF_ERROR(s_->WaitLocked(lock, "pipeline receive", [&] { return !inbox.empty(); }));
    std::vector<float> msg = std::move(inbox.front());
    inbox.pop_front();
    if (msg.size() != count)
      return FailLocked(lock,
                        InternalError("pipeline receive: " + std::to_string(msg.size()) +
                                      " floats arrived, " + std::to_string(count) + " expected"));
    return msg;
  }

  size_t Index(int32_t stage) const {
    return static_cast<size_t>(stage) * layout_.tp_size + layout_.tp_rank;
  }
  // A failure of this rank's own CUDA work: the group cannot go on without it.
  Status Local(cudaError_t err, const char* what) {
    Status s = CudaStatus(err, what);
    if (!s.ok()) return Fail(s);
    return s;
  }
  Status Fail(const Status& why) {
    Abort(why);
    return why;
  }
  Status FailLocked(std::unique_lock<std::mutex>& lock, const Status& why) {
    lock.unlock();
    return Fail(why);
  }

  std::shared_ptr<State> s_;
  CollectiveLayout layout_;
  std::optional<bool> capturable_;
  std::map<Op, std::unique_ptr<Recorded>> recorded_;
};

}  // namespace

ThreadCollectiveGroup::ThreadCollectiveGroup(std::shared_ptr<State> state)
    : state_(std::move(state)) {}
ThreadCollectiveGroup::~ThreadCollectiveGroup() = default;

StatusOr<std::shared_ptr<ThreadCollectiveGroup>> ThreadCollectiveGroup::Create(
    int32_t num_stages, int32_t tp_size, std::chrono::milliseconds timeout) {
  if (num_stages < 1 || tp_size < 1 || num_stages * tp_size > 1024)
    return InvalidArgumentError("a collective group needs 1..1024 ranks");
  if (timeout.count() <= 0) return InvalidArgumentError("a collective group needs a timeout");
  auto s = std::make_shared<State>();
  s->num_stages = num_stages;
  s->tp_size = tp_size;
  s->timeout = timeout;
  s->tp.resize(static_cast<size_t>(num_stages));
  for (State::TpGroup& g : s->tp) {
    g.in.assign(static_cast<size_t>(tp_size), nullptr);
    g.counts.resize(static_cast<size_t>(tp_size));
  }
  s->to.resize(static_cast<size_t>(num_stages) * tp_size);
  return std::shared_ptr<ThreadCollectiveGroup>(new ThreadCollectiveGroup(std::move(s)));
}

StatusOr<std::unique_ptr<DeviceCollective>> ThreadCollectiveGroup::Rank(int32_t stage,
                                                                        int32_t tp_rank) {
  if (stage < 0 || stage >= state_->num_stages || tp_rank < 0 || tp_rank >= state_->tp_size)
    return InvalidArgumentError("rank outside the group's layout");
  CollectiveLayout l;
  l.stage = stage;
  l.num_stages = state_->num_stages;
  l.tp_rank = tp_rank;
  l.tp_size = state_->tp_size;
  return std::unique_ptr<DeviceCollective>(new ThreadRank(state_, l));
}

void ThreadCollectiveGroup::Abort(const Status& why) { state_->Fail(why); }

StatusOr<std::unique_ptr<DeviceCollective>> ThreadCollectiveGroup::JoinNamed(
    const std::string& name, const CollectiveLayout& layout, std::chrono::milliseconds timeout) {
  struct Named {
    std::weak_ptr<State> state;
    std::set<std::pair<int32_t, int32_t>> taken;  // (stage, tp rank) handed out
  };
  static std::mutex mu;
  static std::map<std::string, Named> groups;  // guarded by mu
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = groups.begin(); it != groups.end();)  // forget the groups nobody holds
    it = it->second.state.expired() ? groups.erase(it) : std::next(it);
  Named& n = groups[name];
  std::shared_ptr<State> state = n.state.lock();
  if (!state) {
    SI_ASSIGN_OR_RETURN(std::shared_ptr<ThreadCollectiveGroup> g,
                        Create(layout.num_stages, layout.tp_size, timeout));
    state = g->state_;
    n.state = state;
    n.taken.clear();
  }
  if (state->num_stages != layout.num_stages || state->tp_size != layout.tp_size)
    return InvalidArgumentError("collective group " + name + " has another shape");
  if (!n.taken.insert({layout.stage, layout.tp_rank}).second)
    return InvalidArgumentError("collective group " + name + ": stage " +
                                std::to_string(layout.stage) + " tp rank " +
                                std::to_string(layout.tp_rank) + " joined twice");
  ThreadCollectiveGroup g(state);
  return g.Rank(layout.stage, layout.tp_rank);
}

}  // namespace specinfer::cuda
