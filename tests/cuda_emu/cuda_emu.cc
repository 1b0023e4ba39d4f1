// The CPU emulator's scheduler (fibers per CUDA thread, see cuda_emu.h), and the CUDA runtime and
// cuBLAS entry points the backend uses, over host memory.
#include "cuda_emu.h"

#include <cblas.h>
#include <cublas_v2.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace specinfer::emu {
namespace {

namespace ctx = boost::context;

constexpr size_t kDefaultSharedLimit = 48 * 1024;  // without cudaFuncAttributeMaxDynamic...
constexpr size_t kSharedOptinLimit = 227 * 1024;   // H100: 227 KiB per block with the opt-in
constexpr int kMaxThreadsPerBlock = 1024;

thread_local cudaError_t g_last_error = cudaSuccess;
constexpr int kDevices = 8;
thread_local int g_device = 0;
// Whether this thread is running a host function (cudaLaunchHostFunc): it may not call CUDA.
thread_local bool g_in_host_function = false;

[[noreturn]] void Fatal(const std::string& what) {
  std::fprintf(stderr, "CUDA emulator: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string Dim(dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

// One block in flight: its threads (fibers) and their barriers.
class Block {
 public:
  Block(dim3 grid, dim3 block, uint3 block_idx, size_t shared_bytes,
        const std::function<void()>& body, ctx::pooled_fixedsize_stack& stacks)
      : grid_(grid), block_(block), block_idx_(block_idx), body_(body) {
    n_ = static_cast<int>(block.x * block.y * block.z);
    live_ = n_;
    threads_.resize(n_);
    warps_.resize((n_ + 31) / 32);
    for (size_t w = 0; w < warps_.size(); ++w) {
      const int size = WarpSize(static_cast<int>(w));
      warps_[w].present = size == 32 ? 0xffffffffu : ((1u << size) - 1);
    }
    slots_[0].assign(warps_.size() * 32, 0);
    slots_[1].assign(warps_.size() * 32, 0);
    shared_.assign(shared_bytes + 16, 0xff);  // NaN bytes: reading what nobody wrote shows
    for (int i = 0; i < n_; ++i) {
      Thread& t = threads_[i];
      t.idx =
          uint3{static_cast<unsigned>(i % block.x), static_cast<unsigned>((i / block.x) % block.y),
                static_cast<unsigned>(i / (block.x * block.y))};
      t.fiber = ctx::fiber(std::allocator_arg, stacks, [this, i](ctx::fiber&& from) {
        Arrived(std::move(from));
        body_();
        Exit(i);
        // Straight on to the next thread that can run (or back to the scheduler).
        const int next = NextRunnable(i);
        prev_ = i;
        current_ = next;
        return std::move(next < 0 ? scheduler_ : threads_[next].fiber);
      });
    }
  }

  // Runs every thread to its end. Threads pass control to each other directly at barriers (one
  // context switch each); the scheduler only starts the block and sees it end, or deadlock.
  void Run() {
    for (;;) {
      const int next = NextRunnable(-1);
      if (next < 0) {
        if (live_ == 0) break;
        Fatal(DeadlockReport());
      }
      prev_ = -1;
      current_ = next;
      Arrived(std::move(threads_[next].fiber).resume());
    }
    current_ = -1;
  }

  static Block* current_block;

  const uint3& thread_idx() const { return threads_[current_].idx; }
  const uint3& block_idx() const { return block_idx_; }
  const dim3& block_dim() const { return block_; }
  const dim3& grid_dim() const { return grid_; }
  void* shared() { return shared_.data(); }
  int lane() const { return current_ % 32; }

  void SyncThreads() {
    Thread& t = threads_[current_];
    if (++bar_arrived_ == live_) {
      Release();
      return;
    }
    t.wait = Wait::kBlock;
    t.wait_gen = bar_gen_;
    Yield();
  }

  uint64_t Exchange(unsigned mask, uint64_t value, int src_lane) {
    const int src = current_ / 32 * 32 + src_lane;
    const std::vector<uint64_t>& slots = Publish(mask, value, "a shuffle");
    return src < n_ ? slots[src] : value;
  }

  // Every lane of the current (full) warp gives `value` and gets all 32, by lane.
  const uint64_t* Gather(uint64_t value, const char* what) {
    const int w = current_ / 32;
    if (WarpSize(w) != 32) Fatal(std::string(what) + " in a partial warp of " + Where());
    return Publish(0xffffffffu, value, what).data() + w * 32;
  }

  unsigned Ballot(unsigned mask, bool pred) {
    const int w = current_ / 32;
    const std::vector<uint64_t>& slots = Publish(mask, pred ? 1 : 0, "a ballot");
    unsigned bits = 0;
    for (int l = 0; l < WarpSize(w); ++l)
      if (slots[w * 32 + l]) bits |= 1u << l;
    return bits & mask;
  }

 private:
  enum class Wait { kNone, kBlock, kWarp };
  struct Thread {
    ctx::fiber fiber;  // the thread, while suspended
    uint3 idx{};
    bool done = false;
    Wait wait = Wait::kNone;
    uint64_t wait_gen = 0;
  };
  struct Warp {
    int arrived = 0;
    uint64_t gen = 0;
    unsigned present = 0;  // lanes that exist (a block's last warp may be partial)
    unsigned exited = 0;   // lanes that have returned
  };

  bool Runnable(const Thread& t) const {
    switch (t.wait) {
      case Wait::kNone:
        return true;
      case Wait::kBlock:
        return bar_gen_ != t.wait_gen;
      case Wait::kWarp:
        return warps_[(&t - threads_.data()) / 32].gen != t.wait_gen;
    }
    return true;
  }

  // The first runnable thread after `from` in scheduling order (not `from` itself), or -1;
  // from = -1 starts the order. The order is by thread index, or the reverse with
  // SPECINFER_CUDA_EMU_ORDER=reverse: a kernel that is right only in one order depends on what
  // CUDA leaves unordered (threads between barriers).
  int NextRunnable(int from) const {
    static const bool reverse = [] {
      const char* env = std::getenv("SPECINFER_CUDA_EMU_ORDER");
      return env != nullptr && std::string(env) == "reverse";
    }();
    const int start = from < 0 ? (reverse ? n_ : -1) : from;
    for (int k = 1; k <= n_; ++k) {
      const int j = reverse ? ((start - k) % n_ + n_) % n_ : (start + k) % n_;
      if (j == from) break;
      const Thread& t = threads_[j];
      if (!t.done && Runnable(t)) return j;
    }
    return -1;
  }

  // Whoever switched to this context left its own continuation: keep it where it belongs.
  void Arrived(ctx::fiber&& from) {
    if (prev_ < 0) {
      scheduler_ = std::move(from);
    } else {
      threads_[prev_].fiber = std::move(from);
    }
  }

  // The current thread waits: control goes to the next runnable thread, or to the scheduler
  // (which reports a deadlock) when there is none. Returns once the wait is over.
  void Yield() {
    const int me = current_;
    const int next = NextRunnable(me);
    prev_ = me;
    current_ = next;
    Arrived(std::move(next < 0 ? scheduler_ : threads_[next].fiber).resume());
    current_ = me;
    threads_[me].wait = Wait::kNone;
  }

  void Release() {
    bar_arrived_ = 0;
    ++bar_gen_;
  }

  int WarpSize(int w) const { return std::min(32, n_ - w * 32); }

  void CheckMask(unsigned mask, int w, const char* what) {
    const Warp& warp = warps_[w];
    if ((mask & warp.present) != warp.present)
      Fatal(std::string(what) + " with a partial mask (not emulated) in " + Where());
    if (warp.exited != 0)
      Fatal(std::string(what) + " in warp " + std::to_string(w) + " of " + Where() +
            " while lane " + std::to_string(std::countr_zero(warp.exited)) +
            " has exited (undefined on a GPU)");
  }

  // The current thread gives `value` to its warp and waits for every lane to give theirs; returns
  // the slots holding them (by thread index). They stay intact until the warp's next-but-one
  // operation, which no lane can reach before all have read these: slots alternate by the
  // warp's generation.
  const std::vector<uint64_t>& Publish(unsigned mask, uint64_t value, const char* what) {
    const int i = current_, w = i / 32;
    CheckMask(mask, w, what);
    std::vector<uint64_t>& slots = slots_[warps_[w].gen & 1];
    slots[i] = value;
    WarpBarrier(w);
    return slots;
  }

  void WarpBarrier(int w) {
    Warp& warp = warps_[w];
    if (++warp.arrived == WarpSize(w)) {
      warp.arrived = 0;
      ++warp.gen;
      return;
    }
    Thread& t = threads_[current_];
    t.wait = Wait::kWarp;
    t.wait_gen = warp.gen;
    Yield();
  }

  void Exit(int i) {
    threads_[i].done = true;
    --live_;
    const int w = i / 32;
    warps_[w].exited |= 1u << (i % 32);
    if (warps_[w].arrived > 0)
      Fatal("thread " + std::to_string(i) + " of " + Where() +
            " exited while its warp waits in a shuffle");
    if (bar_arrived_ > 0 && bar_arrived_ == live_) Release();
  }

  std::string Where() const {
    return "block " + Dim(dim3(block_idx_.x, block_idx_.y, block_idx_.z));
  }

  std::string DeadlockReport() const {
    int at_block = 0, at_warp = 0;
    for (const Thread& t : threads_) {
      if (t.done) continue;
      if (t.wait == Wait::kBlock) ++at_block;
      if (t.wait == Wait::kWarp) ++at_warp;
    }
    return "deadlock in " + Where() + ": " + std::to_string(at_block) +
           " threads wait in __syncthreads(), " + std::to_string(at_warp) +
           " in warp operations, " + std::to_string(live_) + " live";
  }

  dim3 grid_, block_;
  uint3 block_idx_;
  const std::function<void()>& body_;
  int n_ = 0;
  int live_ = 0;
  int current_ = -1;
  int prev_ = -1;  // the context that switched to the one now running (-1: the scheduler)
  ctx::fiber scheduler_;
  std::vector<Thread> threads_;
  std::vector<Warp> warps_;
  std::vector<uint64_t> slots_[2];  // warp exchange, by generation parity
  std::vector<uint8_t> shared_;
  int bar_arrived_ = 0;
  uint64_t bar_gen_ = 0;
};

Block* Block::current_block = nullptr;

Block& Current() {
  if (Block::current_block == nullptr) Fatal("a device function was called outside a kernel");
  return *Block::current_block;
}

std::mutex& LaunchMutex() {
  static std::mutex m;
  return m;
}

std::map<const void*, int>& DynamicSharedOptin() {
  static std::map<const void*, int> m;
  return m;
}

}  // namespace

const uint3& ThreadIdx() { return Current().thread_idx(); }
const uint3& BlockIdx() { return Current().block_idx(); }
const dim3& BlockDim() { return Current().block_dim(); }
const dim3& GridDim() { return Current().grid_dim(); }
void* DynamicShared() { return Current().shared(); }
void SyncThreads() { Current().SyncThreads(); }
int LaneId() { return Current().lane(); }
uint64_t WarpExchange(unsigned mask, uint64_t value, int src_lane) {
  return Current().Exchange(mask, value, src_lane);
}
unsigned WarpBallot(unsigned mask, bool predicate) { return Current().Ballot(mask, predicate); }

// s + a[0] b[0] + ... + a[15] b[15], fused multiply-adds in index order: the emulator's tensor-core
// accumulation. A clone for CPUs with FMA instructions (the same bits as libm's fmaf, without its
// call per element).
[[gnu::target_clones("fma", "default")]] float FmaChain16(const float* a, const float* b,
                                                         float s) {
  for (int k = 0; k < 16; ++k) s = std::fma(a[k], b[k], s);
  return s;
}

// The warp's whole product is computed once, by the first lane to run after all 32 have given
// their fragments (the others are still suspended in the exchange, so every lane's a, b and d are
// alive): it writes each lane's accumulators and marks them done, and the other lanes, when they
// resume, find their d already updated. One exchange per product, and each fragment element
// converted once instead of once per lane.
void WarpMma16816(bool bf16, float* d, const uint32_t* a, const uint32_t* b) {
  struct Fragments {
    const uint32_t* a;
    const uint32_t* b;
    float* d;
    bool done;
  };
  Fragments mine{a, b, d, false};
  const uint64_t* all =
      Current().Gather(reinterpret_cast<uint64_t>(&mine), "a warp matrix product");
  if (mine.done) return;
  // Element e (0: low 16 bits) of a register holding two fp16 or bf16 values.
  auto element = [bf16](uint32_t reg, int e) {
    const uint16_t bits = static_cast<uint16_t>(e == 0 ? reg & 0xffffu : reg >> 16);
    return bf16 ? std::bit_cast<float>(static_cast<uint32_t>(bits) << 16)
                : __half2float(__ushort_as_half(bits));
  };
  // The PTX ISA's fragment layout of mma.m16n8k16 (.f16 and .bf16 inputs), lane L = 4 g + q.
  float am[16][16], bt[8][16];  // a, and b transposed (column g of b is row g of bt)
  Fragments* lanes[32];
  for (int l = 0; l < 32; ++l) {
    Fragments* f = lanes[l] = reinterpret_cast<Fragments*>(all[l]);
    const int g = l / 4, q = l % 4;
    for (int e = 0; e < 2; ++e) {
      am[g][2 * q + e] = element(f->a[0], e);
      am[g + 8][2 * q + e] = element(f->a[1], e);
      am[g][2 * q + 8 + e] = element(f->a[2], e);
      am[g + 8][2 * q + 8 + e] = element(f->a[3], e);
      bt[g][2 * q + e] = element(f->b[0], e);
      bt[g][2 * q + 8 + e] = element(f->b[1], e);
    }
  }
  for (int l = 0; l < 32; ++l) {
    Fragments* f = lanes[l];
    const int g = l / 4, q = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + (i >= 2 ? 8 : 0), col = 2 * q + (i & 1);
      f->d[i] = FmaChain16(am[row], bt[col], f->d[i]);
    }
    f->done = true;
  }
}

namespace {

// ---- streams and graphs --------------------------------------------------------------------
// A graph is the list of operations a capture recorded, run in order (the emulator's streams are
// synchronous, so a captured stream's order is the only dependency there is).
struct Graph {
  std::vector<std::function<cudaError_t()>> nodes;
};
struct Stream {
  Graph* capture = nullptr;  // the graph being recorded, or null
  bool invalidated = false;  // a prohibited call broke the capture: EndCapture fails
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id owner;  // the thread that began the capture
};

std::mutex& CaptureMutex() {
  static std::mutex m;
  return m;
}
std::vector<Stream*>& Capturing() {  // streams capturing now, under CaptureMutex
  static std::vector<Stream*> v;
  return v;
}

Stream* AsStream(cudaStream_t s) { return reinterpret_cast<Stream*>(s); }

// A synchronous or otherwise unsafe call (cudaMemcpy, cudaMalloc, a synchronisation) while a
// capture forbids it: cudaStreamCaptureModeGlobal captures forbid it on every thread,
// ThreadLocal ones on the thread that began them. Such a call fails and invalidates those
// captures, as on a GPU.
// A host function (cudaLaunchHostFunc) may not call CUDA at all: such calls fail too.
bool ProhibitedByCapture() {
  if (g_in_host_function) return true;
  std::lock_guard<std::mutex> lock(CaptureMutex());
  bool prohibited = false;
  for (Stream* s : Capturing()) {
    const bool applies =
        s->mode == cudaStreamCaptureModeGlobal ||
        (s->mode == cudaStreamCaptureModeThreadLocal && s->owner == std::this_thread::get_id());
    if (applies) {
      s->invalidated = true;
      prohibited = true;
    }
  }
  return prohibited;
}

// Runs `op` now, or records it when `stream` is capturing. Work for the legacy default stream
// (0) while anything captures would synchronise with the capture: refused, as on a GPU.
cudaError_t Issue(cudaStream_t stream, std::function<cudaError_t()> op) {
  if (g_in_host_function) {
    g_last_error = cudaErrorNotPermitted;
    return cudaErrorNotPermitted;
  }
  if (stream == nullptr) {
    bool any;
    {
      std::lock_guard<std::mutex> lock(CaptureMutex());
      any = !Capturing().empty();
    }
    if (any && ProhibitedByCapture()) {
      g_last_error = cudaErrorStreamCaptureImplicit;
      return cudaErrorStreamCaptureImplicit;
    }
    return op();
  }
  Stream* s = AsStream(stream);
  if (s->capture == nullptr) return op();
  s->capture->nodes.push_back(std::move(op));
  return cudaSuccess;
}

}  // namespace

namespace {

cudaError_t RunLaunch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                      const std::function<void()>& body);

}  // namespace

void Launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::function<void()> body) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || grid.y > 65535 ||
      grid.z > 65535 || block.z > 64 || threads > kMaxThreadsPerBlock) {
    g_last_error = cudaErrorInvalidConfiguration;
    if (stream != nullptr && AsStream(stream)->capture) AsStream(stream)->invalidated = true;
    return;
  }
  const cudaError_t err =
      Issue(stream, [kernel, grid, block, shared_bytes, body = std::move(body)] {
        return RunLaunch(kernel, grid, block, shared_bytes, body);
      });
  if (err != cudaSuccess) g_last_error = err;
}

namespace {

cudaError_t RunLaunch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                      const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(LaunchMutex());
  if (shared_bytes > kDefaultSharedLimit) {
    auto it = DynamicSharedOptin().find(kernel);
    if (it == DynamicSharedOptin().end() || static_cast<size_t>(it->second) < shared_bytes) {
      g_last_error = cudaErrorInvalidValue;  // what a GPU says: too much shared memory
      return cudaErrorInvalidValue;
    }
  }
  static ctx::pooled_fixedsize_stack stacks(256 * 1024);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        Block b(grid, block, uint3{x, y, z}, shared_bytes, body, stacks);
        Block::current_block = &b;
        b.Run();
        Block::current_block = nullptr;
      }
  return cudaSuccess;
}

}  // namespace

namespace {

// Device memory: host memory, counted against an emulated capacity (SPECINFER_CUDA_EMU_MIB,
// default 16 GiB) so that out-of-memory paths can be tested.
struct Memory {
  struct Block {
    size_t bytes = 0;  // as asked
    void* base = nullptr;
    size_t mapped = 0;  // the mapping, guard page included
  };
  std::mutex mu;
  std::map<void*, Block> blocks;
  size_t used = 0;
  size_t capacity = 0;
  Memory() {
    const char* env = std::getenv("SPECINFER_CUDA_EMU_MIB");
    capacity = (env ? std::strtoull(env, nullptr, 10) : 16384) << 20;
  }
};
Memory& Mem() {
  static Memory m;
  return m;
}

cudaError_t Fail(cudaError_t e) {
  g_last_error = e;
  return e;
}

struct Event {
  std::chrono::steady_clock::time_point t;
};

}  // namespace
}  // namespace specinfer::emu

using specinfer::emu::Fail;
using specinfer::emu::Mem;

// ---- CUDA runtime ------------------------------------------------------------------------------
extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t e = specinfer::emu::g_last_error;
  specinfer::emu::g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return specinfer::emu::g_last_error; }

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    default:
      return "CUDA error (emulated)";
  }
}
const char* cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }

// kDevices devices, so that multi-GPU code (ranks as threads, each on its own device) runs: they
// share one host memory and its capacity; the current device is per thread, as in CUDA.
cudaError_t cudaGetDeviceCount(int* count) {
  *count = specinfer::emu::kDevices;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= specinfer::emu::kDevices) return Fail(cudaErrorInvalidDevice);
  specinfer::emu::g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = specinfer::emu::g_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties_v2(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= specinfer::emu::kDevices) return Fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "CUDA emulator on the CPU");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->totalGlobalMem = Mem().capacity;
  prop->sharedMemPerBlock = specinfer::emu::kDefaultSharedLimit;
  prop->sharedMemPerBlockOptin = specinfer::emu::kSharedOptinLimit;
  prop->maxThreadsPerBlock = specinfer::emu::kMaxThreadsPerBlock;
  prop->warpSize = 32;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  return cudaGetDeviceProperties_v2(prop, device);
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= specinfer::emu::kDevices) return Fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(specinfer::emu::kSharedOptinLimit);
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = specinfer::emu::kMaxThreadsPerBlock;
      return cudaSuccess;
    default:
      return Fail(cudaErrorInvalidValue);
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > specinfer::emu::kSharedOptinLimit)
      return Fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(specinfer::emu::LaunchMutex());
    specinfer::emu::DynamicSharedOptin()[func] = value;
  }
  return cudaSuccess;
}

// Each buffer ends where an inaccessible guard page begins (less the rounding to cudaMalloc's
// 256-byte alignment): a kernel reading or writing past the end of its buffer crashes, as the
// GPU's memory checker would report it, instead of reading a neighbour's data.
cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (specinfer::emu::ProhibitedByCapture()) return Fail(cudaErrorStreamCaptureUnsupported);
  auto& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  *ptr = nullptr;
  if (bytes > m.capacity - m.used) return Fail(cudaErrorMemoryAllocation);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
  const size_t mapped = (rounded + page - 1) / page * page + page;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return Fail(cudaErrorMemoryAllocation);
  uint8_t* guard = static_cast<uint8_t*>(base) + mapped - page;
  mprotect(guard, page, PROT_NONE);
  uint8_t* p = guard - rounded;
  std::memset(p, 0xff, rounded);  // NaN bytes: fresh device memory holds no zeros to rely on
  m.blocks[p] = specinfer::emu::Memory::Block{bytes, base, mapped};
  m.used += bytes;
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  if (specinfer::emu::ProhibitedByCapture()) return Fail(cudaErrorStreamCaptureUnsupported);
  if (ptr == nullptr) return cudaSuccess;
  auto& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.blocks.find(ptr);
  if (it == m.blocks.end()) return Fail(cudaErrorInvalidValue);
  m.used -= it->second.bytes;
  munmap(it->second.base, it->second.mapped);
  m.blocks.erase(it);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  auto& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  *free_bytes = m.capacity - m.used;
  *total_bytes = m.capacity;
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int /*flags*/) {
  if (specinfer::emu::ProhibitedByCapture()) return Fail(cudaErrorStreamCaptureUnsupported);
  *ptr = std::malloc(bytes == 0 ? 1 : bytes);
  return *ptr ? cudaSuccess : Fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }
cudaError_t cudaFreeHost(void* ptr) {
  if (specinfer::emu::ProhibitedByCapture()) return Fail(cudaErrorStreamCaptureUnsupported);
  std::free(ptr);
  return cudaSuccess;
}

}  // extern "C"

namespace specinfer::emu {
namespace {

cudaError_t Copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return Fail(cudaErrorInvalidValue);
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t Copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                   size_t height) {
  if (width > dpitch || width > spitch) return Fail(cudaErrorInvalidValue);
  if (width > 0 && height > 0 && (dst == nullptr || src == nullptr))
    return Fail(cudaErrorInvalidValue);
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<uint8_t*>(dst) + r * dpitch,
                 static_cast<const uint8_t*>(src) + r * spitch, width);
  return cudaSuccess;
}
cudaError_t Set(void* dst, int value, size_t bytes) {
  if (bytes > 0 && dst == nullptr) return Fail(cudaErrorInvalidValue);
  if (bytes > 0) std::memset(dst, value, bytes);
  return cudaSuccess;
}
// A synchronous call: refused while a capture forbids it.
cudaError_t Unsafe() {
  return ProhibitedByCapture() ? Fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

}  // namespace
}  // namespace specinfer::emu

using specinfer::emu::AsStream;
using specinfer::emu::Issue;
using specinfer::emu::Unsafe;

extern "C" {

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind /*kind*/) {
  if (cudaError_t e = Unsafe(); e != cudaSuccess) return e;
  return specinfer::emu::Copy(dst, src, bytes);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  return Issue(stream, [=] { return specinfer::emu::Copy(dst, src, bytes); });
}
cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height, cudaMemcpyKind /*kind*/) {
  if (cudaError_t e = Unsafe(); e != cudaSuccess) return e;
  return specinfer::emu::Copy2D(dst, dpitch, src, spitch, width, height);
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind, cudaStream_t stream) {
  if (width > dpitch || width > spitch) return Fail(cudaErrorInvalidValue);
  return Issue(stream,
               [=] { return specinfer::emu::Copy2D(dst, dpitch, src, spitch, width, height); });
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (cudaError_t e = Unsafe(); e != cudaSuccess) return e;
  return specinfer::emu::Set(dst, value, bytes);
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  return Issue(stream, [=] { return specinfer::emu::Set(dst, value, bytes); });
}

// Streams are synchronous: work runs when it is issued, unless the stream is capturing.
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(new specinfer::emu::Stream());
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s != nullptr && AsStream(s)->capture != nullptr) return Fail(cudaErrorStreamCaptureUnmatched);
  delete AsStream(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s != nullptr && AsStream(s)->capture != nullptr) {
    AsStream(s)->invalidated = true;
    return Fail(cudaErrorStreamCaptureUnsupported);
  }
  return Unsafe();
}
cudaError_t cudaDeviceSynchronize() { return Unsafe(); }

// A host function runs on the issuing thread (streams are synchronous) or, captured, as a node
// of the graph at every launch; while it runs, its thread's CUDA calls fail (on a GPU a host
// function may not call CUDA either).
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return Fail(cudaErrorInvalidValue);
  return Issue(stream, [fn, user_data] {
    specinfer::emu::g_in_host_function = true;
    fn(user_data);
    specinfer::emu::g_in_host_function = false;
    return cudaSuccess;
  });
}

// Device memory is host memory here: a cudaMalloc buffer (any address inside it) is device
// memory that the host can address too (hostPointer == devicePointer, as managed memory on a
// GPU); anything else is taken for host memory, which kernels here can address as well.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr || ptr == nullptr) return Fail(cudaErrorInvalidValue);
  auto& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  auto* p = const_cast<void*>(ptr);
  auto it = m.blocks.upper_bound(p);
  const bool device =
      it != m.blocks.begin() &&
      static_cast<const uint8_t*>(ptr) <
          static_cast<const uint8_t*>(std::prev(it)->first) + std::prev(it)->second.bytes;
  attributes->type = device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  attributes->device = specinfer::emu::g_device;
  attributes->devicePointer = p;
  attributes->hostPointer = p;
  return cudaSuccess;
}

// ---- stream capture and graphs -----------------------------------------------------------------
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (stream == nullptr) return Fail(cudaErrorStreamCaptureUnsupported);
  specinfer::emu::Stream* s = AsStream(stream);
  if (s->capture != nullptr) return Fail(cudaErrorIllegalState);
  std::lock_guard<std::mutex> lock(specinfer::emu::CaptureMutex());
  s->capture = new specinfer::emu::Graph();
  s->invalidated = false;
  s->mode = mode;
  s->owner = std::this_thread::get_id();
  specinfer::emu::Capturing().push_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (stream == nullptr || graph == nullptr) return Fail(cudaErrorInvalidValue);
  specinfer::emu::Stream* s = AsStream(stream);
  if (s->capture == nullptr) return Fail(cudaErrorIllegalState);
  if (s->owner != std::this_thread::get_id() && s->mode != cudaStreamCaptureModeRelaxed)
    return Fail(cudaErrorStreamCaptureWrongThread);
  std::unique_ptr<specinfer::emu::Graph> g(s->capture);
  {
    std::lock_guard<std::mutex> lock(specinfer::emu::CaptureMutex());
    auto& v = specinfer::emu::Capturing();
    v.erase(std::find(v.begin(), v.end(), s));
    s->capture = nullptr;
  }
  *graph = nullptr;
  if (s->invalidated) return Fail(cudaErrorStreamCaptureInvalidated);
  *graph = reinterpret_cast<cudaGraph_t>(g.release());
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return Fail(cudaErrorInvalidValue);
  const specinfer::emu::Stream* s = stream == nullptr ? nullptr : AsStream(stream);
  *status = s == nullptr || s->capture == nullptr ? cudaStreamCaptureStatusNone
            : s->invalidated                      ? cudaStreamCaptureStatusInvalidated
                                                  : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  if (graph == nullptr || count == nullptr) return Fail(cudaErrorInvalidValue);
  const auto* g = reinterpret_cast<const specinfer::emu::Graph*>(graph);
  if (nodes != nullptr) return Fail(cudaErrorNotSupported);  // only the count
  *count = g->nodes.size();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return Fail(cudaErrorInvalidValue);
  if (cudaError_t e = Unsafe(); e != cudaSuccess) return e;
  *exec = reinterpret_cast<cudaGraphExec_t>(
      new specinfer::emu::Graph(*reinterpret_cast<const specinfer::emu::Graph*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return Fail(cudaErrorInvalidValue);
  const auto* g = reinterpret_cast<const specinfer::emu::Graph*>(exec);
  return Issue(stream, [g] {
    for (const auto& node : g->nodes)
      if (cudaError_t e = node(); e != cudaSuccess) return Fail(e);
    return cudaSuccess;
  });
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<specinfer::emu::Graph*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<specinfer::emu::Graph*>(exec);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new specinfer::emu::Event());
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<specinfer::emu::Event*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  auto* ev = reinterpret_cast<specinfer::emu::Event*>(e);
  return Issue(stream, [ev] {
    ev->t = std::chrono::steady_clock::now();
    return cudaSuccess;
  });
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return Unsafe(); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const auto d = reinterpret_cast<specinfer::emu::Event*>(end)->t -
                 reinterpret_cast<specinfer::emu::Event*>(start)->t;
  *ms = std::chrono::duration<float, std::milli>(d).count();
  return cudaSuccess;
}

}  // extern "C"

// ---- cuBLAS: the two column-major GEMMs the backend calls, through OpenBLAS in float32 ----------
namespace {

struct CublasHandle {
  cudaStream_t stream = nullptr;
};

// A column-major matrix of `type` with `cols` columns of leading dimension `ld`, as float32.
bool ToFloat(const void* src, cudaDataType_t type, int64_t ld, int64_t cols,
             std::vector<float>& out) {
  const int64_t n = ld * cols;
  out.resize(static_cast<size_t>(n));
  switch (type) {
    case CUDA_R_32F:
      std::memcpy(out.data(), src, static_cast<size_t>(n) * sizeof(float));
      return true;
    case CUDA_R_16F:
      for (int64_t i = 0; i < n; ++i) out[i] = __half2float(static_cast<const __half*>(src)[i]);
      return true;
    case CUDA_R_16BF:
      for (int64_t i = 0; i < n; ++i)
        out[i] = __bfloat162float(static_cast<const __nv_bfloat16*>(src)[i]);
      return true;
    default:
      return false;
  }
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = reinterpret_cast<cublasHandle_t>(new CublasHandle());
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete reinterpret_cast<CublasHandle*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  reinterpret_cast<CublasHandle*>(handle)->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasSgemm_v2(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb,
                              int m, int n, int k, const float* alpha, const float* A, int lda,
                              const float* B, int ldb, const float* beta, float* C, int ldc) {
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  cblas_sgemm(CblasColMajor, transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
              transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, *alpha, A, lda, B, ldb,
              *beta, C, ldc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void* alpha, const void* A,
                            cudaDataType_t Atype, int lda, const void* B, cudaDataType_t Btype,
                            int ldb, const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t) {
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (computeType != CUBLAS_COMPUTE_32F || Ctype != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  std::vector<float> a, b;
  if (!ToFloat(A, Atype, lda, transa == CUBLAS_OP_N ? k : m, a) ||
      !ToFloat(B, Btype, ldb, transb == CUBLAS_OP_N ? n : k, b))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  cblas_sgemm(CblasColMajor, transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
              transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k,
              *static_cast<const float*>(alpha), a.data(), lda, b.data(), ldb,
              *static_cast<const float*>(beta), static_cast<float*>(C), ldc);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
