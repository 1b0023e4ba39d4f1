#include "test_util.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

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

std::string DefaultModel() {
  std::string p = SourcePath("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  return std::filesystem::exists(p) ? p : "";
}

std::vector<float> DecodeBase64Floats(std::string_view b64) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : b64) {
    size_t v = kAlphabet.find(ch);
    if (v == std::string_view::npos) continue;  // '=' padding
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

namespace {
std::filesystem::path ScratchRoot() {
  return std::filesystem::temp_directory_path() /
         ("specinfer_test_" + std::to_string(::getpid()));
}
// Removes this process's scratch folder when the test binary exits.
struct RemoveScratchRoot {
  ~RemoveScratchRoot() {
    std::error_code ec;
    std::filesystem::remove_all(ScratchRoot(), ec);
  }
} remove_scratch_root;
}  // namespace

std::filesystem::path ScratchDir(const std::string& name) {
  std::filesystem::path dir = ScratchRoot() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
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
