// libFuzzer target: an HTTP request body through the server's parsing, as the routes do it.
//
// The body is parsed with the depth limit (fields::parse_limited), then as a /v1/completions
// request, as a /v1/chat/completions request (whose messages are rendered through the embedded
// model's chat template and tokenized, as handle_chat_completions does) and as /tokenize's
// messages. ApiError (a 4xx) and specula::Error are expected answers; crashes, sanitizer
// reports, hangs and any other exception are bugs.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_util.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/json_fields.h"
#include "server/request_parser.h"
#include "test_paths.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
namespace server = specula::server;

struct Model {
  std::unique_ptr<specula::Tokenizer> tokenizer;
  std::unique_ptr<specula::ChatTemplate> chat_template;
  server::RequestDefaults defaults;
};

const Model& model() {
  static const Model m = [] {
    Model m;
    m.tokenizer = specula::Tokenizer::from_dir(specula::testing::models_dir() / "specula-tiny");
    m.chat_template = specula::ChatTemplate::compile(m.tokenizer->chat_template());
    return m;
  }();
  return m;
}

template <class F>
void expect_refusal_or_success(F&& f) {
  try {
    f();
  } catch (const server::ApiError&) {
  } catch (const specula::Error&) {
  }
}

void completion(const json& body) {
  server::CompletionRequest req = server::parse_completion_request(body, model().defaults);
  for (const auto& p : req.prompts) {
    int len = p.text ? static_cast<int>(p.text->size()) : static_cast<int>(p.token_ids.size());
    expect_refusal_or_success([&] { server::resolve_max_tokens(req, std::nullopt, len, 2048); });
    expect_refusal_or_success([&] { server::resolve_max_tokens(req, int64_t{16}, len, 64); });
  }
}

void chat(const json& body, const ojson& ordered) {
  server::ChatRequest req = server::parse_chat_request(body, ordered, model().defaults);
  server::ChatPromptInputs in;
  in.messages = &req.messages;
  in.tools = &req.tools;
  in.chat_template_kwargs = &req.chat_template_kwargs;
  in.add_generation_prompt = req.add_generation_prompt;
  in.continue_final_message = req.continue_final_message;
  std::string prompt = server::render_chat_prompt(*model().chat_template, *model().tokenizer, in);
  auto ids = model().tokenizer->encode(prompt, req.add_special_tokens);
  server::resolve_max_tokens(req, std::nullopt, static_cast<int>(ids.size()), 4096);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  model();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = specula::fuzz::as_string(data, size);
  json body;
  try {
    body = server::fields::parse_limited<json>(text, "the request body");
  } catch (const server::ApiError&) {
    return 0;
  }
  // What the routes answer with travels back as JSON text; it must always serialise.
  (void)body.dump(-1, ' ', false, json::error_handler_t::replace);
  if (!body.is_object()) return 0;
  expect_refusal_or_success([&] { completion(body); });
  const ojson ordered = server::fields::parse_limited<ojson>(text, "the request body");
  expect_refusal_or_success([&] { chat(body, ordered); });
  if (ordered.contains("messages")) {
    expect_refusal_or_success([&] { (void)server::normalize_messages(ordered["messages"]); });
  }
  return 0;
}
