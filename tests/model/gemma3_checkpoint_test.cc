// A real K-quant checkpoint: gemma-3-270m Q4_K_M (scripts/fetch_model.sh gemma3; Q4_K, Q6_K,
// Q5_0 and Q8_0 tensors, the Gemma 3 architecture, a 262144-token SentencePiece vocabulary)
// against Hugging Face transformers running the same file dequantised in float32
// (tests/reference/gemma3_checkpoint_reference.py -> tests/data/gemma3/reference.json):
//   - the prompts encode to transformers' token ids;
//   - the last position's 8 largest reference logits are within 4% of the largest |logit| of
//     ours (we quantise activations to 8 bits, transformers does not), and the argmax is the same;
//   - the same file dequantised to float32 (--dequantize) gives transformers' logits within
//     0.1% of the largest |logit|: the architecture is exact, the 4% above is activation
//     quantisation;
// Why 4%: llama.cpp's own activation quantisation (Q8_0 for Q5_0/Q8_0 weights, Q8_K for
// K-quants) with exact products, in a NumPy forward (tests/reference/gemma3_act_quant_noise.py),
// puts the chat prompt's top-8 0.16 to 0.74 from transformers (up to 3.3% of max |logit| 22.5;
// median 0.42, half of 40 runs above 2%) when the embeddings are scaled by 1 + 1e-6 N(0,1):
// Gemma's outlier activations make some blocks' 8-bit step large, and which of their values round
// up flips with any ulp-level change, such as a kernel's summation order or Softmax's exp. Ours
// went 0.31 -> 0.64 with only such changes (the Q8_0 tile kernels' order, the AVX2 exp). This
// bound checks the quantised model end to end; it cannot see a small kernel error (the script's
// runs with a 1% activation scale error stay under 2%): the kernels' own tests pin them bit for
// bit, and the dequantised run below pins the architecture.
//   - greedy decoding reproduces transformers' first tokens (the first 6; later ones may part
//     where two candidates are within the 8-bit activations' error).
// And the chat path: the file ships no tokenizer.chat_template, so Engine::EncodeChat picks the
// built-in gemma format from the vocabulary's <start_of_turn>/<end_of_turn> tokens; the rendered
// conversation encodes to transformers' ids for the same turn text (the reference's second prompt)
// and <end_of_turn> becomes a stop token. (This checkpoint is the pretrained gemma-3-270m, not the
// instruction-tuned one: it continues a chat turn by echoing it, as transformers does too.)
// Skipped when the model file is absent: SPECINFER_GEMMA3_GGUF, or
// ../shared/models/gemma-3-270m-q4_k_m.gguf, or models/gemma-3-270m-q4_k_m.gguf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_runner.h"
#include "engine/engine.h"
#include "kv/kv_cache.h"
#include "model/dequantize.h"
#include "model/loader.h"
#include "test_util.h"

namespace specinfer {
namespace {

std::string Gemma3Path() {
  if (const char* p = std::getenv("SPECINFER_GEMMA3_GGUF"); p != nullptr && *p != '\0') return p;
  for (const char* rel : {"../shared/models/gemma-3-270m-q4_k_m.gguf",
                          "models/gemma-3-270m-q4_k_m.gguf"}) {
    const std::string p = testing::SourcePath(rel);
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

int32_t Argmax(const float* v, int32_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

TEST(Gemma3Checkpoint, MatchesTransformers) {
  const std::string path = Gemma3Path();
  if (path.empty())
    GTEST_SKIP() << "gemma-3-270m-q4_k_m.gguf absent (scripts/fetch_model.sh gemma3)";
  std::ifstream f(testing::SourcePath("tests/data/gemma3/reference.json"));
  ASSERT_TRUE(f) << "tests/data/gemma3/reference.json missing";
  const nlohmann::json ref = nlohmann::json::parse(f);

  StatusOr<LoadedModel> loaded = LoadModelAndTokenizer(path, "");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::shared_ptr<const Model> model = std::move(loaded->model);
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.architecture, "gemma3");
  EXPECT_TRUE(c.qk_norm && c.post_norms);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_TRUE(c.IsSlidingLayer(0) && !c.IsSlidingLayer(5) && c.IsSlidingLayer(6));
  const int32_t vocab = c.vocab_size;

  CpuRunnerOptions o;
  o.num_threads = 2;
  o.kv_block_size = 16;
  o.num_kv_blocks = 8;
  auto runner = CpuModelRunner::Create(model, o);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  KvCacheManager kv(o.num_kv_blocks, o.kv_block_size);
  StatusOr<std::unique_ptr<Model>> f32 = DequantizeToF32(*model);
  ASSERT_TRUE(f32.ok()) << f32.status().ToString();
  auto f32_runner = CpuModelRunner::Create(std::shared_ptr<const Model>(std::move(f32).value()), o);
  ASSERT_TRUE(f32_runner.ok()) << f32_runner.status().ToString();

  for (const auto& cs : ref["cases"]) {
    SCOPED_TRACE(cs["prompt"].get<std::string>());
    auto ids = loaded->tokenizer->Encode(cs["prompt"].get<std::string>(), /*add_bos=*/true,
                                         /*parse_special=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    const std::vector<int32_t> want_ids = cs["tokens"];
    EXPECT_EQ(*ids, want_ids);

    // Last-position logits.
    const int32_t n = static_cast<int32_t>(want_ids.size());
    const std::vector<float> logits = testing::PromptLogits(**runner, kv, want_ids, {n - 1});
    ASSERT_EQ(logits.size(), size_t(vocab));
    const std::vector<int32_t> top_ids = cs["top_ids"];
    const std::vector<float> top = cs["top_logits"];
    float max_abs = 0;
    for (float v : logits) max_abs = std::max(max_abs, std::fabs(v));
    double max_err = 0;
    for (size_t k = 0; k < top_ids.size(); ++k) {
      EXPECT_NEAR(logits[top_ids[k]], top[k], 0.04 * max_abs) << "token " << top_ids[k];
      max_err = std::max(max_err, std::fabs(double(logits[top_ids[k]]) - top[k]));
    }
    std::printf("gemma3 top-8 logits: max |ours - transformers| = %.4f (max |logit| %.2f)\n",
                max_err, max_abs);
    EXPECT_EQ(Argmax(logits.data(), vocab), top_ids[0]);
    {
      // The same weights dequantised (float32 activations, like transformers): only the
      // summation order differs.
      const std::vector<float> fl = testing::PromptLogits(**f32_runner, kv, want_ids, {n - 1});
      ASSERT_EQ(fl.size(), size_t(vocab));
      double err = 0;
      for (size_t k = 0; k < top_ids.size(); ++k) {
        EXPECT_NEAR(fl[top_ids[k]], top[k], 1e-3 * max_abs) << "dequantised, token " << top_ids[k];
        err = std::max(err, std::fabs(double(fl[top_ids[k]]) - top[k]));
      }
      std::printf("gemma3 dequantised top-8 logits: max |ours - transformers| = %.5f\n", err);
    }

    // Greedy continuation, one token per pass.
    SeqId s = kv.AddSequence();
    const std::vector<int32_t> greedy = cs["greedy"];
    ASSERT_TRUE(kv.Reserve(s, n + static_cast<int32_t>(greedy.size())).ok());
    std::vector<int32_t> pos(n);
    for (int32_t i = 0; i < n; ++i) pos[i] = i;
    std::vector<float> row(vocab);
    ForwardBatch b;
    b.AddSequence(s, want_ids, pos, 0, nullptr);
    b.logit_rows = {n - 1};
    ASSERT_TRUE((*runner)->Forward(b, kv, row).ok());
    std::vector<int32_t> got;
    for (size_t i = 0; i < 6; ++i) {
      got.push_back(Argmax(row.data(), vocab));
      ForwardBatch step;
      const std::vector<int32_t> tok = {got.back()}, p = {n + static_cast<int32_t>(i)};
      step.AddSequence(s, tok, p, n + static_cast<int32_t>(i), nullptr);
      step.logit_rows = {0};
      ASSERT_TRUE((*runner)->Forward(step, kv, row).ok());
    }
    kv.RemoveSequence(s);
    EXPECT_EQ(got, std::vector<int32_t>(greedy.begin(), greedy.begin() + 6));
  }
}

TEST(Gemma3Checkpoint, ChatTemplateFromTheVocabulary) {
  const std::string path = Gemma3Path();
  if (path.empty())
    GTEST_SKIP() << "gemma-3-270m-q4_k_m.gguf absent (scripts/fetch_model.sh gemma3)";
  std::ifstream f(testing::SourcePath("tests/data/gemma3/reference.json"));
  ASSERT_TRUE(f) << "tests/data/gemma3/reference.json missing";
  const nlohmann::json ref = nlohmann::json::parse(f);
  const nlohmann::json* chat_case = nullptr;
  for (const auto& cs : ref["cases"])
    if (cs["prompt"].get<std::string>().starts_with("<start_of_turn>user\n")) chat_case = &cs;
  ASSERT_NE(chat_case, nullptr) << "no chat-formatted prompt in the reference";

  EngineOptions o;
  o.model_path = path;
  o.num_threads = 2;
  o.context_length = 256;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_TRUE((*engine)->chat_template().empty()) << "the file now ships a template";
  const Tokenizer& tok = (*engine)->tokenizer();
  std::vector<int32_t> stop = (*engine)->default_stop_tokens();
  const std::vector<ChatMessage> messages = {{"user", "Write one sentence about the sea."}};
  auto ids = (*engine)->EncodeChat(messages, "", &stop);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, (*chat_case)["tokens"].get<std::vector<int32_t>>());
  auto end_of_turn = tok.Encode("<end_of_turn>", /*add_bos=*/false, /*parse_special=*/true);
  ASSERT_TRUE(end_of_turn.ok() && end_of_turn->size() == 1);
  EXPECT_NE(std::find(stop.begin(), stop.end(), (*end_of_turn)[0]), stop.end());
  EXPECT_NE(std::find(stop.begin(), stop.end(), tok.eos_id()), stop.end());
  // Naming the template gives the same prompt; a system message goes into the first user turn.
  std::vector<int32_t> stop2;
  auto named = (*engine)->EncodeChat(messages, "gemma", &stop2);
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_EQ(*named, *ids);
  const std::vector<ChatMessage> with_system = {{"system", "Be brief."}, messages[0]};
  auto sys = (*engine)->EncodeChat(with_system, "", &stop2);
  ASSERT_TRUE(sys.ok()) << sys.status().ToString();
  auto sys_ref = tok.Encode(
      "<start_of_turn>user\nBe brief.\n\nWrite one sentence about the sea.<end_of_turn>\n"
      "<start_of_turn>model\n",
      /*add_bos=*/true, /*parse_special=*/true);
  ASSERT_TRUE(sys_ref.ok());
  EXPECT_EQ(*sys, *sys_ref);

  // Greedy generation from the chat prompt: transformers' first tokens (as MatchesTransformers
  // checks for the raw runner), through the engine's generation loop.
  GenerateRequest req;
  req.prompt_tokens = *ids;
  req.max_new_tokens = 6;
  req.sampling.temperature = 0;
  req.stop_tokens = stop;
  auto out = (*engine)->Generate(req);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const std::vector<int32_t> greedy = (*chat_case)["greedy"];
  EXPECT_EQ(out->tokens, std::vector<int32_t>(greedy.begin(), greedy.begin() + 6));
}

}  // namespace
}  // namespace specinfer
