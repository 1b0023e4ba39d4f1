// Fuzz target: the validation of the distributed workers' protos. The first byte picks the
// message; the rest is its wire encoding (ParseFromArray), fed to the checks its receiver runs:
//   0  LlmForwardRequest  -> ParseForwardRequest (LLM worker, dist/llm_wire.h)
//   1  LlmMoveKvRequest   -> CheckMoveKvRequest  (LLM worker)
//   2  SpeculateRequest   -> ValidateSpeculateItem for each item (SSM worker, dist/ssm_wire.h)
//   3  SpeculateResponse  -> TreeFromProto for each tree (the SSM client, checking a worker)
// Against a small fixed worker: vocabulary 512, 64 KV blocks of 16 positions, context 256.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dist/llm_wire.h"
#include "dist/ssm_wire.h"
#include "proto/llm_worker.pb.h"
#include "proto/ssm_worker.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specinfer;
  // Protobuf logs every string field of invalid UTF-8 it parses: keep the fuzzer's output quiet.
  static const bool quiet =
      (google::protobuf::SetLogHandler(
           +[](google::protobuf::LogLevel, const char*, int, const std::string&) {}),
       true);
  (void)quiet;
  if (size < 1 || size - 1 > (1u << 20)) return 0;
  const uint8_t* body = data + 1;
  const int len = static_cast<int>(size - 1);
  constexpr int32_t kVocab = 512, kContext = 256;
  const LlmWireLimits limits{
      .forward = {.vocab_size = kVocab, .num_kv_blocks = 64, .kv_block_size = 16},
      .logits_vocab = kVocab,
      .last_stage = true};
  switch (data[0] % 4) {
    case 0: {
      worker::LlmForwardRequest req;
      if (!req.ParseFromArray(body, len)) return 0;
      ForwardBatch batch;
      std::vector<TreeMask> masks;
      std::vector<std::span<const int32_t>> tables;
      (void)ParseForwardRequest(req, limits, batch, masks, tables);
      break;
    }
    case 1: {
      worker::LlmMoveKvRequest req;
      if (req.ParseFromArray(body, len)) (void)CheckMoveKvRequest(req, limits);
      break;
    }
    case 2: {
      worker::SpeculateRequest req;
      if (!req.ParseFromArray(body, len)) return 0;
      for (const worker::SpeculateItem& item : req.items()) {
        if (ValidateSpeculateItem(item, kVocab, kContext).ok()) {
          (void)SamplingFromProto(item.sampling());
        }
      }
      break;
    }
    case 3: {
      worker::SpeculateResponse resp;
      if (!resp.ParseFromArray(body, len)) return 0;
      for (const worker::SpeculateResult& r : resp.results()) {
        auto tree = TreeFromProto(r.tree(), kVocab, /*root_token=*/7, /*max_depth=*/8);
        if (tree.ok()) {
          worker::TokenTreeProto back;
          TreeToProto(*tree, &back);
        }
      }
      break;
    }
  }
  return 0;
}
