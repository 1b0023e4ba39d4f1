// The CUDA emulator itself: thread and block indices, barriers, warp operations and the checks it
// promises (a missing __syncthreads() shows, launch limits, the shared-memory opt-in, exited
// lanes in a shuffle, deadlocks, out of memory). Compiled like the kernels (cuda_emu.h forced in).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "launch.cuh"

namespace {

__global__ void WriteIds(int* out) {
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[block * blockDim.x * blockDim.y * blockDim.z + thread] = block * 1000 + thread;
}

// Thread 0 sums what the others wrote to shared memory, after a barrier or (wrongly) without.
__global__ void SharedSum(float* out, bool sync) {
  SPECINFER_DYNAMIC_SHARED(float, s);
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  if (sync) __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (unsigned i = 0; i < blockDim.x; ++i) sum += s[i];
    *out = sum;
  }
}

__global__ void WarpOps(float* sums, int* broadcast, unsigned* ballots) {
  float v = static_cast<float>(threadIdx.x % 32);
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  sums[threadIdx.x] = v;
  broadcast[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x), 5);
  ballots[threadIdx.x] = __ballot_sync(0xffffffffu, threadIdx.x % 2 == 1);
}

__global__ void BigShared(float* out) {
  SPECINFER_DYNAMIC_SHARED(float, s);
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

__global__ void ShuffleAfterExit(float* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
}

__global__ void WriteAt(float* p, int i) { p[i] = 1.0f; }

__global__ void AddTo(float* p, float v) { p[threadIdx.x] += v; }

// Lane 0 waits for its warp in a shuffle, the rest of the block waits for lane 0 in a barrier.
__global__ void Deadlock(float* out) {
  if (threadIdx.x == 0) {
    out[0] = __shfl_sync(0xffffffffu, 1.0f, 0);
  } else {
    __syncthreads();
  }
}

TEST(CudaEmulator, IndicesCoverEveryThreadOfEveryBlock) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const int n = 12 * 24;
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(int)), cudaSuccess);
  SPECINFER_LAUNCH(grid, block, 0, nullptr, WriteIds)(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int b = 0; b < 12; ++b)
    for (int t = 0; t < 24; ++t) EXPECT_EQ(got[b * 24 + t], b * 1000 + t);
  cudaFree(d);
}

TEST(CudaEmulator, MissingBarrierShows) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float)), cudaSuccess);
  for (bool sync : {true, false}) {
    SPECINFER_LAUNCH(1, 64, 64 * sizeof(float), nullptr, SharedSum)(d, sync);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    float got = 0;
    cudaMemcpy(&got, d, sizeof(float), cudaMemcpyDeviceToHost);
    if (sync) {
      EXPECT_EQ(got, 2016.0f);
    } else {
      // Thread 0 reads before the others have written: shared memory starts as NaN bytes.
      EXPECT_TRUE(std::isnan(got)) << got;
    }
  }
  cudaFree(d);
}

TEST(CudaEmulator, WarpShufflesAndBallots) {
  const int n = 96;  // three warps
  float* sums = nullptr;
  int* bc = nullptr;
  unsigned* ballots = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&sums), n * sizeof(float));
  cudaMalloc(reinterpret_cast<void**>(&bc), n * sizeof(int));
  cudaMalloc(reinterpret_cast<void**>(&ballots), n * sizeof(unsigned));
  SPECINFER_LAUNCH(1, n, 0, nullptr, WarpOps)(sums, bc, ballots);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int t = 0; t < n; ++t) {
    EXPECT_EQ(sums[t], 496.0f) << t;  // 0 + 1 + ... + 31 in every lane
    EXPECT_EQ(bc[t], t / 32 * 32 + 5) << t;
    EXPECT_EQ(ballots[t], 0xaaaaaaaau) << t;
  }
  cudaFree(sums);
  cudaFree(bc);
  cudaFree(ballots);
}

TEST(CudaEmulator, SharedMemoryAbove48KiBNeedsTheOptIn) {
  float* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), 128 * sizeof(float));
  const size_t bytes = 64 * 1024;
  SPECINFER_LAUNCH(1, 128, bytes, nullptr, BigShared)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(
      cudaFuncSetAttribute(reinterpret_cast<const void*>(&BigShared),
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
      cudaSuccess);
  SPECINFER_LAUNCH(1, 128, bytes, nullptr, BigShared)(d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(d[5], 1.0f);
  EXPECT_EQ(cudaFuncSetAttribute(reinterpret_cast<const void*>(&BigShared),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024),
            cudaErrorInvalidValue);
  cudaFree(d);
}

TEST(CudaEmulator, BadLaunchShapesAreErrors) {
  float* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float));
  SPECINFER_LAUNCH(1, 2048, 0, nullptr, BigShared)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  SPECINFER_LAUNCH(dim3(1, 70000), 32, 0, nullptr, BigShared)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  SPECINFER_LAUNCH(0, 32, 0, nullptr, BigShared)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, then cleared
  cudaFree(d);
}

TEST(CudaEmulator, DeviceMemoryIsBoundedAndStartsAsNaN) {
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(p, nullptr);
  cudaGetLastError();
  float* f = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&f), 4 * sizeof(float)), cudaSuccess);
  EXPECT_TRUE(std::isnan(f[0]));
  size_t after = 0;
  cudaMemGetInfo(&after, &total);
  EXPECT_EQ(after, free_bytes - 4 * sizeof(float));
  cudaFree(f);
}

using CudaEmulatorDeathTest = ::testing::Test;

// One block of `threads` threads of `kernel` on a fresh buffer of as many floats.
void LaunchOnBuffer(void (*kernel)(float*), int threads) {
  float* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), threads * sizeof(float));
  SPECINFER_LAUNCH(1, threads, 0, nullptr, kernel)(d);
}

TEST(CudaEmulatorDeathTest, ShuffleWithAnExitedLaneAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(LaunchOnBuffer(ShuffleAfterExit, 32), "exited");
}

TEST(CudaEmulatorDeathTest, WritingPastTheEndOfABufferCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float)), cudaSuccess);
  SPECINFER_LAUNCH(1, 1, 0, nullptr, WriteAt)(d, 63);  // the last element: fine
  EXPECT_EQ(d[63], 1.0f);
  EXPECT_DEATH(SPECINFER_LAUNCH(1, 1, 0, nullptr, WriteAt)(d, 64), "");
  cudaFree(d);
}

TEST(CudaEmulatorDeathTest, DeadlockAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(LaunchOnBuffer(Deadlock, 64), "deadlock");
}

}  // namespace

// Stream capture: a captured stream records its launches and copies (arguments by value) instead
// of running them; the instantiated graph runs them, in order, at every cudaGraphLaunch, on what
// the buffers hold then; a synchronous call from the capturing thread fails and invalidates it.
TEST(CudaEmulator, GraphsReplayWhatACaptureRecorded) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 4 * sizeof(float)), cudaSuccess);
  float* h = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&h), 4 * sizeof(float)), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::fill_n(h, 4, 1.0f);

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemcpyAsync(d, h, 4 * sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
  float v = 2.0f;
  SPECINFER_LAUNCH(1, 4, 0, stream, AddTo)(d, v);
  v = 100.0f;  // the node keeps the value the launch had
  ASSERT_EQ(cudaMemcpyAsync(h, d, 4 * sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(h[0], 1.0f);  // nothing ran
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 3u);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h[i], 3.0f);
  h[2] = 10.0f;  // a replay reads the inputs as they are now
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(h[0], 5.0f);
  EXPECT_EQ(h[2], 12.0f);

  // A synchronous copy from the capturing thread is refused and spoils the capture.
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  SPECINFER_LAUNCH(1, 4, 0, stream, AddTo)(d, 1.0f);
  EXPECT_EQ(cudaMemcpy(h, d, sizeof(float), cudaMemcpyDeviceToHost),
            cudaErrorStreamCaptureUnsupported);
  cudaGraph_t bad = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &bad), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(bad, nullptr);
  cudaGetLastError();
  // The stream works normally again, and nothing of the spoilt capture ran.
  ASSERT_EQ(cudaMemcpyAsync(h, d, 4 * sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  EXPECT_EQ(h[0], 5.0f);
  // Nested captures and captures of the legacy stream are refused.
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeThreadLocal),
            cudaErrorStreamCaptureUnsupported);
  cudaGetLastError();

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFreeHost(h);
  cudaFree(d);
}

namespace {

// A host function's argument: it doubles *value, and records what a CUDA call from it returned.
struct HostCall {
  float* value = nullptr;
  float* device = nullptr;
  cudaError_t from_inside = cudaSuccess;
};
void DoubleOnHost(void* p) {
  auto* call = static_cast<HostCall*>(p);
  *call->value *= 2.0f;
  call->from_inside = cudaMemsetAsync(call->device, 0, sizeof(float), nullptr);
}

}  // namespace

// Host functions (cudaLaunchHostFunc) run in stream order, and captured they run at every launch
// of the graph, after the nodes before them; CUDA calls from one fail, as on a GPU. Device
// memory here reports a host pointer (it is host memory).
TEST(CudaEmulator, HostFunctionsRunInStreamOrderAndInGraphs) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 4 * sizeof(float)), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  float h = 1.0f;
  HostCall call{&h, d};
  ASSERT_EQ(cudaLaunchHostFunc(stream, DoubleOnHost, &call), cudaSuccess);
  EXPECT_EQ(h, 2.0f);
  EXPECT_EQ(call.from_inside, cudaErrorNotPermitted);
  cudaGetLastError();

  ASSERT_EQ(cudaMemcpyAsync(d, &h, sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  SPECINFER_LAUNCH(1, 1, 0, stream, AddTo)(d, 1.0f);
  ASSERT_EQ(cudaMemcpyAsync(&h, d, sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(stream, DoubleOnHost, &call), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(h, 2.0f);  // nothing ran
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(h, 6.0f);  // (2 + 1) * 2
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(h, 8.0f);  // (3 + 1) * 2: the device value, not the host's
  cudaGetLastError();

  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, d + 3), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.hostPointer, static_cast<void*>(d + 3));
  ASSERT_EQ(cudaPointerGetAttributes(&a, &h), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(d);
}
