// Entry point of the GPU test binary: exits 77 (CTest's SKIP_RETURN_CODE for this test) when no
// CUDA device is present, so CPU-only machines report the GPU tests as skipped, not passed.
// `--host-only` runs just the tests of host-side code (CudaHost*), which need no device.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_device.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--host-only") == 0) {
      ::testing::GTEST_FLAG(filter) = "CudaHost*";
      ::testing::InitGoogleTest(&argc, argv);
      return RUN_ALL_TESTS();
    }
  }
  if (specinfer::cuda::DeviceCount() == 0) {
    std::printf("no CUDA device found: skipping the GPU tests\n");
    return 77;
  }
  auto desc = specinfer::cuda::DeviceDescription(0);
  std::printf("CUDA device 0: %s\n", desc.ok() ? desc->c_str() : "?");
  ::testing::GTEST_FLAG(filter) = "-CudaHost*";  // run by cuda_host_tests
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
