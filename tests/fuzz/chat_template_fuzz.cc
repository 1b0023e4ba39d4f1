// Fuzz target: a model's chat template (Jinja source; engine/chat_template.h) recognised and
// rendered with a fixed conversation, with and without the generation prompt.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specinfer;
  std::string_view src(reinterpret_cast<const char*>(data), size);
  auto tmpl = ChatTemplate::FromModelTemplate(src, "<s>", "</s>");
  if (!tmpl.ok()) return 0;
  static const ChatMessage kChat[] = {{"system", " Be brief. "},
                                      {"user", "Hi\n"},
                                      {"assistant", "Hello!"},
                                      {"user", " \xe2\x80\x83"}};
  for (bool prompt : {false, true}) {
    (void)tmpl->Apply(kChat, prompt);
    (void)tmpl->Apply(std::span(kChat).subspan(1), prompt);
  }
  (void)tmpl->stop_token_texts();
  return 0;
}
