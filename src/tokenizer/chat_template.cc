#include "tokenizer/chat_template.h"

#include "core/error.h"
#include "tokenizer/jinja/template.h"

namespace specula {
namespace {

class JinjaChatTemplate final : public ChatTemplate {
 public:
  explicit JinjaChatTemplate(const std::string& source) : template_(source) {}
  using ChatTemplate::render;

  std::string render(const nlohmann::ordered_json& context) const override {
    SPECULA_CHECK(context.is_object(), "chat template context must be a JSON object, got {}",
                  context.type_name());
    return template_.render(jinja::from_json(context));
  }

 private:
  jinja::Template template_;
};

}  // namespace

std::unique_ptr<ChatTemplate> ChatTemplate::compile(const std::string& source) {
  return std::make_unique<JinjaChatTemplate>(source);
}

}  // namespace specula
