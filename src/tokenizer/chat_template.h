// Hugging Face chat templates: a Jinja subset interpreter that renders real templates exactly as
// transformers' apply_chat_template does (trim_blocks and lstrip_blocks on, tojson, raise_exception).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace specula {

class ChatTemplate {
 public:
  // Parses the template. A construct the interpreter does not support is a specula::Error naming
  // the construct and its line, raised here rather than at render time.
  static std::unique_ptr<ChatTemplate> compile(const std::string& source);
  virtual ~ChatTemplate() = default;
  // `context` holds messages, add_generation_prompt, bos_token, eos_token, tools and any extra
  // template kwargs (enable_thinking, ...). raise_exception() in the template becomes a
  // specula::Error carrying its message.
  virtual std::string render(const nlohmann::json& context) const = 0;
};

}  // namespace specula
