// What a runner that holds one share of a model needs from its peers: the place of the share in a
// tensor-parallel (TP) x pipeline-parallel (PP) group, and the three collectives its forward pass
// uses. The core library defines only this interface; dist/collective.h implements it over Gloo.
// A 1 x 1 layout (the whole model in one process) needs no collective at all.
//
// Thread safety: an implementation is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "specinfer/status.h"

namespace specinfer {

// This worker's place: pipeline stage `stage` of `num_stages`, rank `tp_rank` of the `tp_size`
// workers of that stage.
struct CollectiveLayout {
  int32_t stage = 0, num_stages = 1;
  int32_t tp_rank = 0, tp_size = 1;
};

class Collective {
 public:
  virtual ~Collective() = default;

  // TP all-gather: `out` receives every TP rank's `in` in rank order, counts[r] floats from rank
  // r (counts.size() == tp_size; this rank sends counts[tp_rank] floats from `in`).
  virtual Status AllGather(const float* in, float* out, std::span<const size_t> counts) = 0;
  // Pipeline: `count` floats to the same tp rank of the next stage / from the previous one.
  virtual Status SendToNextStage(const float* data, size_t count) = 0;
  virtual Status RecvFromPrevStage(float* data, size_t count) = 0;
};

}  // namespace specinfer
