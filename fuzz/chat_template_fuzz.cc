// libFuzzer target for the chat-template renderer: any template and any messages must end
// in a prompt or a slim::Error, never a crash, a sanitizer report or a hang. The input is
// the template; after a NUL byte come the messages' contents, NUL-separated, their roles
// cycling user, assistant, system, tool (without a NUL, a fixed conversation). Seeds: the
// real templates of tests/text/chat_templates/, and in fuzz/seeds/chat_template/ one
// with messages appended and one of every construct.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slim/core/error.h"
#include "slim/text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  std::vector<slim::text::ChatMessage> messages;
  if (nul == std::string_view::npos) {
    messages = {{"system", "Be brief. "}, {"user", " Hi \xf0\x9f\x91\x8b\n"}, {"assistant", "Hello"}, {"user", "Bye"}};
  } else {
    static const char* const kRoles[] = {"user", "assistant", "system", "tool"};
    std::string_view rest = input.substr(nul + 1);
    for (size_t k = 0;; ++k) {
      const size_t end = rest.find('\0');
      messages.push_back({kRoles[k % 4], std::string(rest.substr(0, end))});
      if (end == std::string_view::npos) break;
      rest.remove_prefix(end + 1);
    }
  }
  try {
    const slim::text::ChatTemplate chat(std::string(input.substr(0, nul)));
    chat.render(messages, {"<s>", "</s>", true, 1722000000});
    chat.render(messages, {"", "", false, 1722000000});
  } catch (const slim::Error&) {
  }
  return 0;
}
