// ChatTemplate against renderings of the real Jinja templates made by jinja2
// (tests/reference/make_chat_template_vectors.py -> tests/data/chat/templates.json), plus the
// error cases of recognition and validation.
#include "engine/chat_template.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace specinfer {
namespace {

nlohmann::json LoadVectors() {
  std::ifstream f(testing::SourcePath("tests/data/chat/templates.json"));
  EXPECT_TRUE(f.good()) << "missing tests/data/chat/templates.json";
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::vector<ChatMessage> Messages(const nlohmann::json& j) {
  std::vector<ChatMessage> out;
  for (const auto& m : j) out.push_back({m["role"], m["content"]});
  return out;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

TEST(ChatTemplateTest, MatchesJinjaReferenceRenderings) {
  nlohmann::json data = LoadVectors();
  ASSERT_EQ(data["templates"].size(), 7u);
  int checked = 0;
  for (const auto& t : data["templates"]) {
    const std::string name = t["name"];
    auto tmpl = ChatTemplate::FromModelTemplate(t["source"].get<std::string>(), t["bos_token"],
                                                t["eos_token"]);
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status().ToString();
    EXPECT_EQ(tmpl->name(), t["family"].get<std::string>()) << name;
    for (const auto& c : t["cases"]) {
      SCOPED_TRACE(name + "/" + c["name"].get<std::string>());
      std::vector<ChatMessage> msgs = Messages(c["messages"]);
      auto out = tmpl->Apply(msgs, c["add_generation_prompt"].get<bool>());
      if (c.contains("error")) {
        EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << out.status().ToString();
      } else {
        ASSERT_TRUE(out.ok()) << out.status().ToString();
        EXPECT_EQ(*out, c["expected"].get<std::string>())
            << "got:      " << Escape(*out)
            << "\nexpected: " << Escape(c["expected"].get<std::string>());
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 84);
}

TEST(ChatTemplateTest, NamedMatchesTheModelTemplates) {
  // Named formatters render as the plain reference templates (chatml: no default system; gemma:
  // Gemma 3's, which accepts a system message).
  nlohmann::json data = LoadVectors();
  int named = 0;
  for (const auto& t : data["templates"]) {
    const std::string name = t["name"];
    if (!t["named"].get<bool>()) continue;
    ++named;
    auto tmpl = ChatTemplate::Named(t["family"].get<std::string>(), t["bos_token"], t["eos_token"]);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
    for (const auto& c : t["cases"]) {
      if (c.contains("error")) continue;
      auto out = tmpl->Apply(Messages(c["messages"]), c["add_generation_prompt"].get<bool>());
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      EXPECT_EQ(*out, c["expected"].get<std::string>()) << name << "/" << c["name"];
    }
  }
  EXPECT_EQ(named, 4);  // chatml, llama2, llama3, gemma3
}

// Gemma 3's separator after the system message is read from the template: some conversions
// (e.g. early gemma-3-1b-it GGUFs) write '\n' instead of '\n\n'. Gemma 1/2 reject a system
// message as their templates do; Named("gemma") takes it as Gemma 3 does.
TEST(ChatTemplateTest, GemmaSystemMessage) {
  std::vector<ChatMessage> m = {{"system", " Be brief. "}, {"user", " hi "}};
  auto one_newline = ChatTemplate::FromModelTemplate(
      "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = "
      "messages[0]['content'] + \"\\n\" -%}{%- endif -%}<start_of_turn>{{ message['content'] | "
      "trim }}<end_of_turn>",
      "<bos>", "<eos>");
  ASSERT_TRUE(one_newline.ok()) << one_newline.status().ToString();
  EXPECT_EQ(one_newline->name(), "gemma");
  EXPECT_EQ(*one_newline->Apply(m, true),
            "<bos><start_of_turn>user\n Be brief. \nhi<end_of_turn>\n<start_of_turn>model\n");
  auto named = ChatTemplate::Named("gemma");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->bos_token(), "<bos>");
  EXPECT_EQ(named->eos_token(), "<eos>");
  EXPECT_EQ(*named->Apply(m, false), "<bos><start_of_turn>user\n Be brief. \n\nhi<end_of_turn>\n");
  nlohmann::json data = LoadVectors();
  for (const auto& t : data["templates"]) {
    if (t["name"] != "gemma2") continue;
    auto g2 = ChatTemplate::FromModelTemplate(t["source"].get<std::string>(), "<bos>", "<eos>");
    ASSERT_TRUE(g2.ok());
    auto out = g2->Apply(m, true);
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find("--chat-template gemma"), std::string::npos)
        << out.status().message();
  }
}

TEST(ChatTemplateTest, SmolLm2DefaultSystemPromptExtracted) {
  nlohmann::json data = LoadVectors();
  auto tmpl = ChatTemplate::FromModelTemplate(data["templates"][0]["source"].get<std::string>(),
                                              "<|im_start|>", "<|im_end|>");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(tmpl->default_system_message(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  // Same template with escaped newlines (as templates appear in JSON-derived sources).
  auto escaped = ChatTemplate::FromModelTemplate(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nBe \\'brief\\'.<|im_end|>\\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
      "{% endfor %}",
      "", "");
  ASSERT_TRUE(escaped.ok());
  EXPECT_EQ(escaped->default_system_message(), "Be 'brief'.");
  // A system header built from an expression is not a default.
  auto expr = ChatTemplate::FromModelTemplate(
      "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}", "", "");
  ASSERT_TRUE(expr.ok());
  EXPECT_EQ(expr->default_system_message(), "");
  std::vector<ChatMessage> m = {{"user", "hi"}};
  EXPECT_EQ(*expr->Apply(m, false), "<|im_start|>user\nhi<|im_end|>\n");
}

// A default system message after an occurrence that is an expression is still found, and
// hostile templates (many system headers, with no <|im_end|> or a quote just before the only one)
// are recognised in linear time: they took minutes (found writing the chat_template fuzz target).
TEST(ChatTemplateTest, DefaultSystemSearchIsLinear) {
  auto later = ChatTemplate::FromModelTemplate(
      "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
      "{{ '<|im_start|>system\\nLater.<|im_end|>\\n' }}",
      "", "");
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(later->default_system_message(), "Later.");

  std::string heads;
  while (heads.size() + 40 < ChatTemplate::kMaxChatTemplateBytes) heads += "<|im_start|>system\n";
  for (const std::string& src : {heads, heads + "'<|im_end|>", heads + "<|im_end|>"}) {
    const auto start = std::chrono::steady_clock::now();
    auto t = ChatTemplate::FromModelTemplate(src, "", "");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_LT(seconds, 2.0) << src.size() << "-byte template";
    std::vector<ChatMessage> m = {{"user", "hi"}};
    EXPECT_TRUE(t->Apply(m, true).ok());
  }
  auto huge = ChatTemplate::FromModelTemplate(
      std::string(ChatTemplate::kMaxChatTemplateBytes + 1, '<'), "", "");
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("--chat-template"), std::string::npos);
}

TEST(ChatTemplateTest, UnrecognisedTemplatesAreUnimplemented) {
  nlohmann::json data = LoadVectors();
  for (const auto& u : data["unrecognised"]) {
    auto t = ChatTemplate::FromModelTemplate(u["source"].get<std::string>(), "<s>", "</s>");
    ASSERT_FALSE(t.ok()) << u["name"];
    EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(t.status().message().find("--chat-template chatml|llama2|llama3|gemma"),
              std::string::npos)
        << t.status().message();
  }
  EXPECT_EQ(ChatTemplate::FromModelTemplate("", "", "").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, NamedRejectsUnknownNames) {
  for (std::string_view n : {"nonsense", "", "ChatML", "llama", "Gemma", "gemma3"}) {
    auto t = ChatTemplate::Named(n);
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << n;
  }
  auto l3 = ChatTemplate::Named("llama3");
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(l3->bos_token(), "<|begin_of_text|>");
  auto l2 = ChatTemplate::Named("llama2");
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(l2->bos_token(), "<s>");
  EXPECT_EQ(l2->eos_token(), "</s>");
}

TEST(ChatTemplateTest, ValidatesMessages) {
  for (std::string_view n : {"chatml", "llama2", "llama3", "gemma"}) {
    auto t = ChatTemplate::Named(n);
    ASSERT_TRUE(t.ok());
    std::vector<ChatMessage> none;
    EXPECT_EQ(t->Apply(none, true).status().code(), StatusCode::kInvalidArgument) << n;
    std::vector<ChatMessage> late_system = {{"user", "a"}, {"system", "b"}};
    EXPECT_EQ(t->Apply(late_system, true).status().code(), StatusCode::kInvalidArgument) << n;
    std::vector<ChatMessage> two_systems = {{"system", "a"}, {"system", "b"}, {"user", "c"}};
    EXPECT_EQ(t->Apply(two_systems, true).status().code(), StatusCode::kInvalidArgument) << n;
    std::vector<ChatMessage> bad_role = {{"tool", "x"}};
    auto bad = t->Apply(bad_role, true);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << n;
    EXPECT_NE(bad.status().message().find("tool"), std::string::npos);
    std::vector<ChatMessage> upper = {{"User", "x"}};
    EXPECT_EQ(t->Apply(upper, true).status().code(), StatusCode::kInvalidArgument) << n;
  }
}

TEST(ChatTemplateTest, StopTokenTexts) {
  EXPECT_EQ(ChatTemplate::Named("chatml")->stop_token_texts(),
            std::vector<std::string>({"<|im_end|>"}));
  EXPECT_EQ(ChatTemplate::Named("chatml", "", "<|endoftext|>")->stop_token_texts(),
            std::vector<std::string>({"<|im_end|>", "<|endoftext|>"}));
  EXPECT_EQ(ChatTemplate::Named("llama3", "", "<|end_of_text|>")->stop_token_texts(),
            std::vector<std::string>({"<|eot_id|>", "<|end_of_text|>"}));
  EXPECT_EQ(ChatTemplate::Named("llama2")->stop_token_texts(), std::vector<std::string>({"</s>"}));
  EXPECT_EQ(ChatTemplate::Named("gemma")->stop_token_texts(),
            std::vector<std::string>({"<end_of_turn>", "<eos>"}));
}

TEST(ChatTemplateTest, StripUnicodeWhitespaceMatchesPythonStrip) {
  EXPECT_EQ(StripUnicodeWhitespace(""), "");
  EXPECT_EQ(StripUnicodeWhitespace(" \t\n\r\v\f"), "");
  EXPECT_EQ(StripUnicodeWhitespace("  a b  "), "a b");
  EXPECT_EQ(StripUnicodeWhitespace("\u3000\u00a0x\u2003\u0085"), "x");
  EXPECT_EQ(StripUnicodeWhitespace("\x1cx\x1f"), "x");
  EXPECT_EQ(StripUnicodeWhitespace("\u200bx\u200b"), "\u200bx\u200b");  // ZWSP is not space
  EXPECT_EQ(StripUnicodeWhitespace("é "), "é");
  EXPECT_EQ(StripUnicodeWhitespace(" \xff\xfe "), "\xff\xfe");  // invalid UTF-8 kept
  EXPECT_EQ(StripUnicodeWhitespace(" \xe3\x80"), "\xe3\x80");   // truncated sequence kept
}

}  // namespace
}  // namespace specinfer
