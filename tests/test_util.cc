#include "test_util.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "backend/cpu/cpu_runner.h"

namespace specinfer::testing {

std::string SourcePath(const std::string& relative) {
  return std::string(SPECINFER_SOURCE_DIR) + "/" + relative;
}

std::string Stories260KModel() { return SourcePath("tests/data/stories260K/stories260K.bin"); }
std::string Stories260KTokenizer() { return SourcePath("tests/data/stories260K/tok512.bin"); }

static std::string FirstExisting(const std::string& a, const std::string& b) {
  if (std::filesystem::exists(a)) return a;
  if (std::filesystem::exists(b)) return b;
  return "";
}

std::string Llama2TokenizerBin() {
  return FirstExisting(SourcePath("tests/data/llama2-tokenizer/tokenizer.bin"),
                       SourcePath("../shared/models/llama2-tokenizer/tokenizer.bin"));
}
std::string Llama2TokenizerModel() {
  return FirstExisting(SourcePath("tests/data/llama2-tokenizer/tokenizer.model"),
                       SourcePath("../shared/models/llama2-tokenizer/tokenizer.model"));
}

std::vector<float> PromptLogits(ModelRunner& runner, KvCacheManager& kv,
                                const std::vector<int32_t>& tokens,
                                const std::vector<int32_t>& rows) {
  SeqId s = kv.AddSequence();
  Status reserved = kv.Reserve(s, static_cast<int32_t>(tokens.size()));
  EXPECT_TRUE(reserved.ok()) << reserved.ToString();
  if (!reserved.ok()) return {};
  ForwardBatch b;
  std::vector<int32_t> pos(tokens.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  b.AddSequence(s, tokens, pos, 0, nullptr);
  b.logit_rows = rows;
  std::vector<float> logits(rows.size() * runner.model().config().vocab_size);
  Status st = runner.Forward(b, kv, logits);
  kv.RemoveSequence(s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return st.ok() ? logits : std::vector<float>();
}

std::vector<float> LastLogits(std::shared_ptr<const Model> model,
                              const std::vector<int32_t>& tokens) {
  CpuRunnerOptions o;
  o.num_threads = 1;
  o.kv_block_size = 16;
  o.num_kv_blocks = static_cast<int32_t>(tokens.size()) / 16 + 1;
  auto runner = CpuModelRunner::Create(std::move(model), o);
  EXPECT_TRUE(runner.ok()) << runner.status().ToString();
  if (!runner.ok()) return {};
  KvCacheManager kv(o.num_kv_blocks, o.kv_block_size);
  return PromptLogits(**runner, kv, tokens, {static_cast<int32_t>(tokens.size()) - 1});
}

}  // namespace specinfer::testing
