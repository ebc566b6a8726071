// Chat messages -> prompt text through the tokenizer's chat template, as transformers'
// apply_chat_template does for vLLM (messages, add_generation_prompt, tools, bos/eos tokens and
// chat_template_kwargs in the context; continue_final_message cuts the render after the last
// message so the model continues it).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace specula {
class ChatTemplate;
class Tokenizer;
}  // namespace specula

namespace specula::server {

struct ChatPromptInputs {
  const nlohmann::ordered_json* messages = nullptr;   // normalised (normalize_messages)
  const nlohmann::ordered_json* tools = nullptr;      // may be null
  const nlohmann::ordered_json* chat_template_kwargs = nullptr;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

// Throws ApiError 400 when the template raises (raise_exception) or cannot continue the message.
std::string render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok, const ChatPromptInputs& in);

}  // namespace specula::server
