// slim chat-template: renders a chat template (a GGUF model's tokenizer.chat_template, a
// Jinja file, or the built-in ChatML) for a JSON list of messages and prints the prompt,
// byte for byte what the server feeds the tokenizer.
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "slim/core/error.h"
#include "slim/llm/gguf.h"
#include "slim/llm/gguf_tokenizer.h"
#include "slim/text/chat_template.h"

namespace slim::cli {
namespace {

struct ChatTemplateArgs {
  std::string gguf, template_file, messages;
  bool chatml = false, no_generation_prompt = false;
  std::optional<std::string> bos, eos;
  std::optional<int64_t> now;
};

std::string read_text(const std::string& path) {
  if (path == "-") return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::not_found, path + ": cannot open");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// OpenAI's message list: content is a string, null, or an array of {"type": "text",
// "text": ...} parts, which are joined.
std::vector<text::ChatMessage> parse_messages(const std::string& json_text, const std::string& path) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorCode::invalid_argument, path + ": not JSON: " + e.what());
  }
  if (!doc.is_array()) throw Error(ErrorCode::invalid_argument, path + ": expected a JSON list of messages");
  std::vector<text::ChatMessage> out;
  for (size_t k = 0; k < doc.size(); ++k) {
    const auto& m = doc[k];
    const std::string where = path + ": message " + std::to_string(k);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw Error(ErrorCode::invalid_argument, where + ": expected an object with a string 'role'");
    text::ChatMessage msg{m["role"].get<std::string>(), ""};
    const auto content = m.value("content", nlohmann::json());
    if (content.is_string()) {
      msg.content = content.get<std::string>();
    } else if (content.is_array()) {
      for (const auto& part : content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw Error(ErrorCode::invalid_argument, where + ": content parts must be {\"type\": \"text\", \"text\": STRING}");
        msg.content += part["text"].get<std::string>();
      }
    } else if (!content.is_null()) {
      throw Error(ErrorCode::invalid_argument, where + ": 'content' must be a string, a list of text parts or null");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

void run_chat_template(const ChatTemplateArgs& a) {
  std::string source;
  text::ChatTemplateContext ctx;
  if (!a.gguf.empty()) {
    const auto file = llm::GgufFile::open(a.gguf);
    source = file->get_string("tokenizer.chat_template", "");
    if (source.empty()) {
      std::cerr << "slim chat-template: " << a.gguf << " has no tokenizer.chat_template; using ChatML\n";
      source = text::ChatTemplate::chatml();
    }
    const auto spec = llm::tokenizer_spec_from_gguf(*file);
    if (spec.bos_id >= 0) ctx.bos_token = spec.tokens[static_cast<size_t>(spec.bos_id)];
    if (spec.eos_id >= 0) ctx.eos_token = spec.tokens[static_cast<size_t>(spec.eos_id)];
  } else if (!a.template_file.empty()) {
    source = read_text(a.template_file);
  } else {
    source = text::ChatTemplate::chatml();
  }
  if (a.bos) ctx.bos_token = *a.bos;
  if (a.eos) ctx.eos_token = *a.eos;
  ctx.add_generation_prompt = !a.no_generation_prompt;
  if (a.now) ctx.now = static_cast<std::time_t>(*a.now);
  const auto messages = parse_messages(read_text(a.messages), a.messages);
  const text::ChatTemplate tmpl(std::move(source));
  std::cout << tmpl.render(messages, ctx);
  std::cout.flush();
}

void add_chat_template(CLI::App& app) {
  auto a = std::make_shared<ChatTemplateArgs>();
  auto* cmd = app.add_subcommand(
      "chat-template",
      "Render a chat template for a list of messages and print the prompt (as the server builds it)");
  cmd->footer(
      "The template comes from a GGUF model's tokenizer.chat_template (ChatML when it has none; BOS/EOS "
      "text from its vocabulary), a Jinja file, or ChatML. It is rendered as Hugging Face transformers "
      "does (jinja2, trim_blocks, lstrip_blocks, raise_exception, strftime_now). MESSAGES is a JSON list "
      "of {\"role\": ..., \"content\": ...}; content may be a list of {\"type\": \"text\", \"text\": ...} "
      "parts, which are joined.");
  auto* gguf = cmd->add_option("--gguf", a->gguf, "GGUF model whose tokenizer.chat_template to render")
                   ->check(CLI::ExistingFile);
  auto* file = cmd->add_option("--template", a->template_file, "Jinja chat template file")->check(CLI::ExistingFile);
  auto* chatml = cmd->add_flag("--chatml", a->chatml, "Use the built-in ChatML template");
  gguf->excludes(file)->excludes(chatml);
  file->excludes(chatml);
  cmd->add_option("--messages", a->messages, "JSON file with the messages ('-': standard input)")->required();
  cmd->add_flag("--no-generation-prompt", a->no_generation_prompt,
                "Render with add_generation_prompt false (no opening of the assistant's turn)");
  cmd->add_option("--bos", a->bos, "BOS token text (default: the GGUF's, else empty)");
  cmd->add_option("--eos", a->eos, "EOS token text (default: the GGUF's, else empty)");
  cmd->add_option("--now", a->now, "Unix time strftime_now() reads (default: the clock), for reproducible output");
  cmd->callback([a] {
    if (a->gguf.empty() && a->template_file.empty() && !a->chatml)
      throw Error(ErrorCode::invalid_argument, "give --gguf FILE, --template FILE or --chatml");
    run_chat_template(*a);
  });
}

}  // namespace

SLIM_COMMAND(47, add_chat_template);

}  // namespace slim::cli
