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
  //
  // Prefer the ordered_json overload: `tojson` writes dict keys in the order the context has
  // them (as Python's json.dumps does), and nlohmann::json sorts keys on parse, so a request
  // parsed into nlohmann::json renders tool schemas with sorted keys.
  virtual std::string render(const nlohmann::ordered_json& context) const = 0;
  std::string render(const nlohmann::json& context) const {
    return render(nlohmann::ordered_json(context));
  }
};

}  // namespace specula
