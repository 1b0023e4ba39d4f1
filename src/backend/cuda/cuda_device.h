// Host-side glue to the CUDA kernels. This header has no CUDA types, so code outside
// backend/cuda can call it; it exists only in builds with SPECINFER_WITH_CUDA.
#pragma once

#include <span>
#include <string>

#include "specinfer/status.h"

namespace specinfer::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no device.
int DeviceCount();

// Name and compute capability of device 0, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
StatusOr<std::string> DeviceDescription(int device);

// RMSNorm of `rows` rows of x ([rows, w.size()]) on the GPU; copies in and out (for tests).
Status RmsNormOnDevice(std::span<const float> x, std::span<const float> w, std::span<float> out,
                       int rows, float eps);

}  // namespace specinfer::cuda
