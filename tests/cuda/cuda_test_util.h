// Helpers of the GPU tests: device arrays that free themselves, and the element-by-element
// comparison every kernel test uses (|got - want| <= atol + rtol * |want| for 100% of elements;
// on failure the count, the largest error and the first mismatching index are reported).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace specinfer::testing {

// True where these tests run on the CPU emulator of tests/cuda_emu (cuda_emu_tests), some
// hundreds of times slower than a GPU: the longest end-to-end tests generate fewer tokens there.
#if defined(SPECINFER_CUDA_EMULATION)
inline constexpr bool kEmulated = true;
#else
inline constexpr bool kEmulated = false;
#endif

#define CUDA_OK(expr)                                                              \
  do {                                                                             \
    const cudaError_t si_err = (expr);                                             \
    ASSERT_EQ(si_err, cudaSuccess) << #expr << ": " << cudaGetErrorString(si_err); \
  } while (0)

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) { Resize(n); }
  explicit DeviceArray(const std::vector<T>& host) { Upload(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  void Resize(size_t n) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = n;
    if (n) {
      EXPECT_EQ(cudaMalloc(&ptr_, n * sizeof(T)), cudaSuccess);
      EXPECT_EQ(cudaMemset(ptr_, 0, n * sizeof(T)), cudaSuccess);
    }
  }
  void Upload(const std::vector<T>& host) {
    Resize(host.size());
    if (n_) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (n_) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }
  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return n_; }

 private:
  void* ptr_ = nullptr;
  size_t n_ = 0;
};

// Empty string when every element is within tolerance; else a description of the failure.
template <typename G, typename W>
std::string CompareAll(const std::vector<G>& got, const std::vector<W>& want, double atol,
                       double rtol) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  size_t bad = 0, first = 0, worst = 0;
  double worst_err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double err = std::fabs(g - w);
    const bool ok = err <= atol + rtol * std::fabs(w) || (std::isnan(g) && std::isnan(w));
    if (!ok || std::isnan(err)) {
      if (bad == 0) first = i;
      ++bad;
    }
    if (err > worst_err || std::isnan(err)) worst_err = err, worst = i;
  }
  if (bad == 0) return "";
  std::ostringstream os;
  os << bad << " of " << got.size() << " elements out of tolerance (atol " << atol << ", rtol "
     << rtol << "); first at index " << first << " (got " << static_cast<double>(got[first])
     << ", want " << static_cast<double>(want[first]) << "); max error " << worst_err
     << " at index " << worst;
  return os.str();
}

#define EXPECT_ALL_CLOSE(got, want, atol, rtol, what)                                   \
  do {                                                                                  \
    const std::string si_cmp = ::specinfer::testing::CompareAll(got, want, atol, rtol); \
    EXPECT_TRUE(si_cmp.empty()) << what << ": " << si_cmp;                              \
  } while (0)

}  // namespace specinfer::testing
