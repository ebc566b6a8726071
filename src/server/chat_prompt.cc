#include "server/chat_prompt.h"

#include <fmt/format.h>

#include "core/error.h"
#include "server/api_error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace specula::server {

using ojson = nlohmann::ordered_json;

namespace {

std::string strip(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

std::string render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok, const ChatPromptInputs& in) {
  ojson ctx = ojson::object();
  ctx["messages"] = *in.messages;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  ctx["continue_final_message"] = in.continue_final_message;
  ctx["bos_token"] = tok.bos_token();
  ctx["eos_token"] = tok.eos_token();
  if (in.tools && !in.tools->is_null()) ctx["tools"] = *in.tools;
  if (in.chat_template_kwargs && in.chat_template_kwargs->is_object()) {
    for (const auto& [k, v] : in.chat_template_kwargs->items()) {
      // The conversation, the tools and the generation-prompt flags were validated as the
      // request's own fields; kwargs that replaced them would bypass that.
      for (const char* reserved : {"messages", "tools", "add_generation_prompt", "continue_final_message"}) {
        if (k == reserved)
          throw bad_request(fmt::format("chat_template_kwargs cannot set `{}`: send it as the request's own field.", k),
                            "chat_template_kwargs");
      }
      ctx[k] = v;
    }
  }
  std::string rendered;
  try {
    rendered = tmpl.render(ctx);
  } catch (const Error& e) {
    throw bad_request(std::string("Chat template error: ") + e.what(), "messages");
  }
  if (!in.continue_final_message) return rendered;

  const ojson& last = in.messages->back();
  std::string final_text = last.contains("content") && last["content"].is_string() ? last["content"].get<std::string>() : "";
  size_t at = final_text.empty() ? std::string::npos : rendered.rfind(final_text);
  if (at == std::string::npos) {
    // Some templates trim message content before rendering.
    final_text = strip(final_text);
    at = final_text.empty() ? std::string::npos : rendered.rfind(final_text);
  }
  if (at == std::string::npos) {
    throw bad_request("continue_final_message is set but the final message does not appear in the chat after "
                      "applying the chat template.", "continue_final_message");
  }
  return rendered.substr(0, at + final_text.size());
}

}  // namespace specula::server
