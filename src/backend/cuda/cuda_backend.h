// The CUDA backend's entry in the backend registry (backend/registry.h). This header has no CUDA
// types; it exists only in builds with SPECINFER_WITH_CUDA.
#pragma once

namespace specinfer::cuda {

// Registers the "cuda" backend: a CudaModelRunner on GPU RunnerOptions::device (0 unless asked)
// with the KV capacity asked for (RunnerOptions' threads and pool do not concern it). Programs
// built with the CUDA library call it at start; calling it again is harmless.
void RegisterCudaBackend();

}  // namespace specinfer::cuda
