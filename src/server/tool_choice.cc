#include "server/tool_choice.h"

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/tool_call_json.h"

namespace specula::server {
namespace {

using ojson = nlohmann::ordered_json;

const ojson* field(const ojson& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

void validate_tools(const ojson& tools) {
  if (!tools.is_array()) {
    throw bad_request(fmt::format("Invalid type for 'tools': expected an array, got {}.", fields::type_name(tools)),
                      "tools");
  }
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    auto fail = [&](const std::string& path, const std::string& what) {
      std::string p = fmt::format("tools[{}]{}", i, path);
      throw bad_request(fmt::format("{} {}", p, what), p);
    };
    if (!t.is_object()) fail("", fmt::format("must be an object, got {}.", fields::type_name(t)));
    if (const ojson* type = field(t, "type"); type && *type != "function")
      fail(".type", fmt::format("must be 'function', got {}.", type->dump()));
    const ojson* fn = field(t, "function");
    if (!fn || !fn->is_object()) fail(".function", "must be an object with the function's name.");
    const ojson* name = field(*fn, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      fail(".function.name", "must be a non-empty string.");
    if (const ojson* d = field(*fn, "description"); d && !d->is_string())
      fail(".function.description", fmt::format("must be a string, got {}.", fields::type_name(*d)));
    if (const ojson* p = field(*fn, "parameters"); p && !p->is_object())
      fail(".function.parameters", fmt::format("must be an object (a JSON Schema), got {}.", fields::type_name(*p)));
  }
}

const ojson* find_tool(const ojson& tools, const std::string& name) {
  for (const ojson& t : tools)
    if (t["function"]["name"] == name) return &t;
  return nullptr;
}

// "required": the output is a JSON array of {"name", "parameters"} objects.
class RequiredToolParser : public ToolParser {
 protected:
  void consume(std::string_view text, ToolParseDelta* out) override {
    for (char c : text) step(c, out);
  }
  void end(ToolParseDelta*) override {
    if (state_ != State::kEnd) set_malformed();  // cut off (max_tokens), or never an array
  }

 private:
  enum class State { kOpen, kItem, kObject, kAfterItem, kEnd, kError };

  void step(char c, ToolParseDelta* out) {
    switch (state_) {
      case State::kOpen:
        if (is_json_space(c)) return;
        if (c == '[') {
          state_ = State::kItem;
          return;
        }
        break;
      case State::kItem:
        if (is_json_space(c)) return;
        if (c == '{') {
          reader_.emplace(std::vector<std::string>{"parameters"});
          state_ = State::kObject;
          step(c, out);
          return;
        }
        if (c == ']' && !after_comma_) {
          state_ = State::kEnd;
          return;
        }
        break;
      case State::kObject: {
        CallObjectReader::Event ev;
        CallObjectReader::Status s = reader_->feed(c, &ev);
        if (ev.name) start_call(*ev.name, out);
        append_arguments(ev.arguments, out);
        if (s == CallObjectReader::Status::kDone) state_ = State::kAfterItem;
        if (s != CallObjectReader::Status::kError) return;
        break;
      }
      case State::kAfterItem:
        if (is_json_space(c)) return;
        if (c == ',') {
          after_comma_ = true;
          state_ = State::kItem;
          return;
        }
        if (c == ']') {
          state_ = State::kEnd;
          return;
        }
        break;
      case State::kEnd:
        if (is_json_space(c)) return;
        break;
      case State::kError:
        return;
    }
    set_malformed();
    state_ = State::kError;
  }

  State state_ = State::kOpen;
  bool after_comma_ = false;
  std::optional<CallObjectReader> reader_;
};

// Named: the whole output is the arguments of one call to the named function.
class NamedToolParser : public ToolParser {
 public:
  explicit NamedToolParser(std::string name) : name_(std::move(name)) {}

 protected:
  void consume(std::string_view text, ToolParseDelta* out) override {
    if (calls_started() == 0) start_call(name_, out);
    append_arguments(text, out);
    text_.append(text);
  }
  void end(ToolParseDelta*) override {
    if (!nlohmann::json::accept(text_)) set_malformed();
  }

 private:
  std::string name_;
  std::string text_;
};

}  // namespace

ToolChoice parse_tool_choice(const ojson& body) {
  ToolChoice out;
  const ojson* tools = field(body, "tools");
  if (tools) validate_tools(*tools);
  bool have_tools = tools && !tools->empty();
  if (const ojson* p = field(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) {
      throw bad_request(fmt::format("Invalid type for 'parallel_tool_calls': expected a boolean, got {}.",
                                    fields::type_name(*p)), "parallel_tool_calls");
    }
    out.parallel_tool_calls = p->get<bool>();
  }
  const ojson* choice = field(body, "tool_choice");
  if (!choice) {
    out.kind = have_tools ? ToolChoice::Kind::kAuto : ToolChoice::Kind::kNone;  // vLLM's default
    return out;
  }
  constexpr const char* kCorrectUsage = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";
  if (choice->is_string()) {
    std::string s = choice->get<std::string>();
    if (s == "none") return out;
    if (s == "auto") out.kind = ToolChoice::Kind::kAuto;
    else if (s == "required") out.kind = ToolChoice::Kind::kRequired;
    else
      throw bad_request(fmt::format("Invalid value for `tool_choice`: {}! Only named tools, \"none\", \"auto\" or "
                                    "\"required\" are supported.", s), "tool_choice");
  } else if (choice->is_object()) {
    if (const ojson* type = field(*choice, "type"); type && *type != "function")
      throw bad_request(fmt::format("tool_choice.type must be 'function', got {}. {}", type->dump(), kCorrectUsage),
                        "tool_choice");
    const ojson* fn = field(*choice, "function");
    if (!fn || !fn->is_object())
      throw bad_request(fmt::format("Invalid value for `function` in `tool_choice`! {}", kCorrectUsage), "tool_choice");
    const ojson* name = field(*fn, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      throw bad_request(fmt::format("Invalid `name` in `function` in `tool_choice`! {}", kCorrectUsage), "tool_choice");
    out.kind = ToolChoice::Kind::kNamed;
    out.function = name->get<std::string>();
  } else {
    throw bad_request(fmt::format("Invalid type for 'tool_choice': expected a string or an object, got {}.",
                                  fields::type_name(*choice)), "tool_choice");
  }
  if (!tools) throw bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice");
  // "required" with no tools means none, as OpenAI answers it.
  if (out.kind == ToolChoice::Kind::kRequired && !have_tools) out.kind = ToolChoice::Kind::kNone;
  if (out.kind == ToolChoice::Kind::kNamed && !find_tool(*tools, out.function))
    throw bad_request(fmt::format("The tool specified in `tool_choice` ('{}') does not match any of the specified "
                                  "`tools`", out.function), "tool_choice");
  return out;
}

ojson tool_parameters(const ojson& tool) {
  const ojson* p = field(tool["function"], "parameters");
  if (p && !p->empty()) return *p;
  return ojson{{"type", "object"}, {"properties", ojson::object()}};
}

ojson required_tool_calls_schema(const ojson& tools, bool parallel_tool_calls) {
  ojson any_of = ojson::array();
  ojson defs = ojson::object();
  for (const ojson& tool : tools) {
    const std::string name = tool["function"]["name"].get<std::string>();
    ojson params = tool_parameters(tool);
    if (auto it = params.find("$defs"); it != params.end()) {
      if (!it->is_object())
        throw bad_request(fmt::format("The parameters of tool '{}' have a $defs that is not an object.", name), "tools");
      for (const auto& [def, schema] : it->items()) {
        if (defs.contains(def) && defs[def] != schema)
          throw bad_request(fmt::format("Tool definition '{}' has multiple schemas, which is not supported.", def),
                            "tools");
        defs[def] = schema;
      }
      params.erase("$defs");
    }
    ojson item = ojson::object();
    item["properties"] = ojson{{"name", {{"type", "string"}, {"const", name}}}, {"parameters", std::move(params)}};
    item["required"] = ojson::array({"name", "parameters"});
    any_of.push_back(std::move(item));
  }
  ojson schema = ojson::object();
  schema["type"] = "array";
  schema["minItems"] = 1;
  if (!parallel_tool_calls) schema["maxItems"] = 1;
  schema["items"] = ojson{{"type", "object"}, {"anyOf", std::move(any_of)}};
  if (!defs.empty()) schema["$defs"] = std::move(defs);
  return schema;
}

std::optional<StructuredOutputsParams> tool_choice_constraint(const ToolChoice& choice, const ojson& tools) {
  if (!choice.forced()) return std::nullopt;
  StructuredOutputsParams p;
  p.kind = StructuredOutputsParams::Kind::kJson;
  if (choice.kind == ToolChoice::Kind::kRequired) {
    p.spec = required_tool_calls_schema(tools, choice.parallel_tool_calls).dump();
  } else {
    p.spec = tool_parameters(*find_tool(tools, choice.function)).dump();
  }
  return p;
}

std::unique_ptr<ToolParser> make_tool_choice_parser(const ToolChoice& choice, const std::string& auto_parser) {
  switch (choice.kind) {
    case ToolChoice::Kind::kNone:
      return nullptr;
    case ToolChoice::Kind::kAuto:
      return ToolParser::create(auto_parser);
    case ToolChoice::Kind::kRequired:
      return std::make_unique<RequiredToolParser>();
    case ToolChoice::Kind::kNamed:
      return std::make_unique<NamedToolParser>(choice.function);
  }
  return nullptr;
}

}  // namespace specula::server
