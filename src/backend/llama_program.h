// The Llama-family forward pass, written once: the sequence of steps every backend runs, over
// operations each backend supplies (backend/cpu/shard_runner.cc for the CPU, whole model or one
// TP x PP share of it; backend/cuda/cuda_runner.cc for one GPU). A backend keeps its own
// arithmetic inside the steps (the CPU adds the residual explicitly, CUDA fuses it into the
// product with beta = 1; the CPU's TP share all-gathers inside the projections), so the program
// fixes only the order, and results stay exactly what each backend computed before.
//
// Buffers named below belong to the Ops object: x [n, dim] the residual stream, xb [n, dim] the
// normed input of a block, q/k/v/att the attention block's activations, gate/up [n, hidden].
// The other decoder families (Qwen3, Mistral, Gemma 2/3) are switches of model/model_config.h that
// change what a step computes, not the order of the steps; a backend that lacks a switch refuses
// the model (ModelConfig::ExtendedFeatures).
// An Ops type provides, for `layer` in [0, num_layers) of the layers this runner holds:
//   Status Input();                       x = embedding of the tokens (or the previous stage's x)
//   Status Norm(int32_t layer, LlamaNorm); xb = rmsnorm(x) * gain of that block
//   Status ProjectQkv(int32_t layer);     q, k, v = xb W^T (+ bias) (q, k per-head normed: qk_norm)
//   Status RopeAndStoreKv(int32_t layer); rotate q and k; k, v into the layer's KV cache slots
//   Status Attend(int32_t layer);         att = attention of q over the cache, as masked
//   Status ProjectOutAdd(int32_t layer);  x += att Wo^T (normed first with post_norms)
//   Status ProjectGateUp(int32_t layer);  gate, up = xb Wg^T, xb Wu^T
//   Status SwiGlu();                      gate = act(gate) * up (SiLU, or GELU-tanh for Gemma)
//   Status ProjectDownAdd(int32_t layer); x += gate Wd^T (normed first with post_norms)
//   Status Output();                      final norm and classifier rows (or x to the next stage)
#pragma once

#include <cstdint>

#include "specinfer/status.h"

namespace specinfer {

enum class LlamaNorm { kAttention, kFfn };

template <typename Ops>
Status RunLlamaLayers(Ops& ops, int32_t num_layers) {
  for (int32_t layer = 0; layer < num_layers; ++layer) {
    // Attention block.
    SI_RETURN_IF_ERROR(ops.Norm(layer, LlamaNorm::kAttention));
    SI_RETURN_IF_ERROR(ops.ProjectQkv(layer));
    SI_RETURN_IF_ERROR(ops.RopeAndStoreKv(layer));
    SI_RETURN_IF_ERROR(ops.Attend(layer));
    SI_RETURN_IF_ERROR(ops.ProjectOutAdd(layer));
    // Feed-forward block.
    SI_RETURN_IF_ERROR(ops.Norm(layer, LlamaNorm::kFfn));
    SI_RETURN_IF_ERROR(ops.ProjectGateUp(layer));
    SI_RETURN_IF_ERROR(ops.SwiGlu());
    SI_RETURN_IF_ERROR(ops.ProjectDownAdd(layer));
  }
  return Status::Ok();
}

// The whole pass: input, the layers, output.
template <typename Ops>
Status RunLlamaProgram(Ops& ops, int32_t num_layers) {
  SI_RETURN_IF_ERROR(ops.Input());
  SI_RETURN_IF_ERROR(RunLlamaLayers(ops, num_layers));
  return ops.Output();
}

}  // namespace specinfer
