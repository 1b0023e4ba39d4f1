// The two tree-attention kernels (tree_attention.cu: CUDA cores; tree_attention_mma.cu: tensor
// cores) that LaunchTreeAttention (tree_attention.cuh) dispatches to, launched directly.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tree_attention.cuh"

namespace specinfer::kernels {

// The CUDA-core kernel (and the merge) whatever the input type: what 16-bit inputs with head_dim
// 64 or 128 ran before the tensor-core kernel, kept for benchmarks (bench_cuda_attention
// --kernel cuda-cores) and for the other types and sizes. params.rows_per_item must be 16.
cudaError_t LaunchTreeAttentionCudaCores(const TreeAttentionParams& params, AttnType in_type,
                                         bool out_float, cudaStream_t stream);

// The tensor-core kernel alone (TreeAttentionUsesMma(in_type, head_dim) must hold; no merge).
cudaError_t LaunchTreeAttentionMma(const TreeAttentionParams& params, AttnType in_type,
                                   bool out_float, cudaStream_t stream);

}  // namespace specinfer::kernels
