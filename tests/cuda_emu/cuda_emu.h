// A CPU emulator for this project's CUDA kernels, so that the kernels/ sources and the CUDA
// backend's host code run, unchanged, on machines without a GPU (CI, laptops), checked by the same
// tests as on a GPU (tests/cuda).
//
// How: the kernels are compiled as C++ with this header forced in first (-include). Each block of
// a launch runs on the calling thread, one block after another; every CUDA thread of the block is
// a fiber (Boost.Context), switched only at __syncthreads() and at warp operations (__shfl*_sync,
// __ballot_sync), which are barriers over the warp. So a block's threads really interleave at
// every point where CUDA lets them communicate, and a missing __syncthreads() shows up as a wrong
// result (threads run in order up to a barrier, not all at once).
// The runtime (cudaMalloc, cudaMemcpy, streams, events, cudaFuncSetAttribute, stream capture
// into CUDA graphs) and the two cuBLAS GEMMs the backend calls are implemented over host memory
// in cuda_emu.cc: device pointers are host pointers; every stream is synchronous, except that a
// stream capturing a graph records its launches and copies (arguments by value) for
// cudaGraphLaunch to run later; synchronous calls from a capturing thread fail and invalidate
// the capture, as cudaStreamCaptureModeGlobal/ThreadLocal make them do on a GPU. There are 8
// devices (the current one per thread), one host memory under them, so multi-GPU code runs with
// ranks as threads (backend/cuda/thread_collective.h stands in for NCCL there).
//
// What it checks that a plain CPU port would not: launch shapes (block size, grid limits, dynamic
// shared memory above 48 KiB without the opt-in attribute), shared memory and fresh cudaMalloc
// memory poisoned with NaN bytes, warp operations with lanes that have exited (undefined on a
// GPU) or with partial masks (not emulated: an error), deadlocks (a __syncthreads() that not every
// live thread reaches), accesses past the end of a cudaMalloc buffer (a guard page follows it),
// and, with SPECINFER_CUDA_EMU_ORDER=reverse, results that depend on the order of a block's
// threads between barriers. It says nothing about speed, coalescing, bank conflicts, or races
// between blocks (blocks run one at a time); device math (exp2f, expf) is the host's, which may
// differ from the GPU's in the last bits.
#pragma once

// CUDA's host_defines.h keeps these when they are already defined.
#define __global__
#define __device__
#define __host__
#define __shared__ static  // one block runs at a time: a static is that block's shared memory
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>

namespace specinfer::emu {

const uint3& ThreadIdx();
const uint3& BlockIdx();
const dim3& BlockDim();
const dim3& GridDim();
void* DynamicShared();
void SyncThreads();
// The warp's lanes (all of them: partial masks are refused) exchange 8 bytes: returns what lane
// `src_lane` of this thread's warp gave.
uint64_t WarpExchange(unsigned mask, uint64_t value, int src_lane);
unsigned WarpBallot(unsigned mask, bool predicate);
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 with D = C = d: the full warp's
// fragments (PTX ISA layout: a[4] and b[2] registers of two 16-bit values, d[4] floats) are
// gathered, and each output is d + sum_k a b as float32 fmas in k order (a GPU's tensor cores
// sum in an order of their own: equal up to float32 rounding, not bit for bit).
void WarpMma16816(bool bf16, float* d, const uint32_t* a, const uint32_t* b);
int LaneId();

// Runs `body` once per thread of every block of the launch; sets the error cudaGetLastError
// returns. On a stream that is capturing a graph, the launch is checked and recorded instead
// (`body` holds the arguments by value, as a graph's kernel node does).
void Launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::function<void()> body);

template <typename... Params>
auto Launcher(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
              void (*kernel)(Params...)) {
  return [=](auto&&... args) {
    const std::tuple<std::decay_t<Params>...> params(args...);  // by value, as a launch does
    Launch(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, stream,
           [kernel, params] { std::apply(kernel, params); });
  };
}

template <typename T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
T FromBits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

}  // namespace specinfer::emu

#define threadIdx (::specinfer::emu::ThreadIdx())
#define blockIdx (::specinfer::emu::BlockIdx())
#define blockDim (::specinfer::emu::BlockDim())
#define gridDim (::specinfer::emu::GridDim())

inline void __syncthreads() { ::specinfer::emu::SyncThreads(); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  const int lane = ::specinfer::emu::LaneId();
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return ::specinfer::emu::FromBits<T>(
      ::specinfer::emu::WarpExchange(mask, ::specinfer::emu::ToBits(v), src));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::specinfer::emu::LaneId();
  int src = lane ^ lane_mask;
  if (src >= ((lane & ~(width - 1)) + width)) src = lane;  // outside the segment: own value
  return ::specinfer::emu::FromBits<T>(
      ::specinfer::emu::WarpExchange(mask, ::specinfer::emu::ToBits(v), src));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::specinfer::emu::WarpBallot(mask, predicate != 0);
}
// A barrier over the warp (what makes shared-memory writes of its lanes visible to the others).
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)::specinfer::emu::WarpBallot(mask, true);
}

inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }

// Round-to-nearest float arithmetic that the compiler must not contract: volatile keeps a + b * c
// from becoming one FMA where the kernel spelled two roundings.
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline float __fsub_rn(float a, float b) {
  volatile float r = a - b;
  return r;
}
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fdiv_rn(float a, float b) {
  volatile float r = a / b;
  return r;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

// CUDA's device min/max overloads.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
