#include "server/tool_call_json.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

namespace specula::server {

bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  size_t max = std::min(text.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

namespace {

bool scalar_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.'; }

}  // namespace

JsonValueReader::Step JsonValueReader::feed(char c) {
  switch (state_) {
    case State::kStart:
      if (is_json_space(c)) return Step::kSkip;
      if (c == '{' || c == '[') {
        stack_.push_back(c);
        state_ = State::kValue;
        return Step::kMore;
      }
      if (c == '"') {
        state_ = State::kString;
        return Step::kMore;
      }
      if (c == '-' || std::isdigit(static_cast<unsigned char>(c)) || c == 't' || c == 'f' || c == 'n') {
        state_ = State::kScalar;
        return Step::kMore;
      }
      state_ = State::kEnd;
      return Step::kError;
    case State::kValue:
      if (c == '"') {
        state_ = State::kString;
      } else if (c == '{' || c == '[') {
        stack_.push_back(c);
      } else if (c == '}' || c == ']') {
        if (stack_.back() != (c == '}' ? '{' : '[')) {
          state_ = State::kEnd;
          return Step::kError;
        }
        stack_.pop_back();
        if (stack_.empty()) {
          state_ = State::kEnd;
          return Step::kDone;
        }
      }
      return Step::kMore;
    case State::kString:
      if (c == '\\') {
        state_ = State::kEscape;
      } else if (c == '"') {
        if (stack_.empty()) {
          state_ = State::kEnd;
          return Step::kDone;
        }
        state_ = State::kValue;
      }
      return Step::kMore;
    case State::kEscape:
      state_ = State::kString;
      return Step::kMore;
    case State::kScalar:
      if (scalar_char(c)) return Step::kMore;
      state_ = State::kEnd;
      return Step::kBefore;
    case State::kEnd:
      break;
  }
  return Step::kError;
}

CallObjectReader::Status CallObjectReader::feed(char c, Event* ev) {
  switch (state_) {
    case State::kOpen:
      if (is_json_space(c)) return Status::kMore;
      if (c != '{') return fail();
      state_ = State::kKey;
      return Status::kMore;
    case State::kKey:
      if (is_json_space(c)) return Status::kMore;
      if (c == '}' && !need_key_) return close(ev);
      if (c != '"') return fail();
      raw_ = "\"";
      escape_ = false;
      need_key_ = false;
      state_ = State::kKeyText;
      return Status::kMore;
    case State::kKeyText:
    case State::kName: {
      raw_.push_back(c);
      if (escape_) {
        escape_ = false;
        return Status::kMore;
      }
      if (c == '\\') {
        escape_ = true;
        return Status::kMore;
      }
      if (c != '"') return Status::kMore;
      auto decoded = nlohmann::json::parse(raw_, nullptr, false);
      if (!decoded.is_string()) return fail();
      if (state_ == State::kKeyText) {
        key_ = decoded.get<std::string>();
        state_ = State::kColon;
        return Status::kMore;
      }
      name_ = decoded.get<std::string>();
      ev->name = *name_;
      ev->arguments = arguments_.substr(sent_);  // arguments that came before the name
      sent_ = arguments_.size();
      state_ = State::kAfterValue;
      return Status::kMore;
    }
    case State::kColon:
      if (is_json_space(c)) return Status::kMore;
      if (c != ':') return fail();
      state_ = State::kValue;
      return Status::kMore;
    case State::kValue:
      if (is_json_space(c)) return Status::kMore;
      if (key_ == "name") {
        if (name_ || c != '"') return fail();
        raw_ = "\"";
        escape_ = false;
        state_ = State::kName;
        return Status::kMore;
      }
      if (std::find(argument_keys_.begin(), argument_keys_.end(), key_) != argument_keys_.end()) {
        if (have_arguments_) return fail();
        have_arguments_ = true;
        state_ = State::kArguments;
      } else {
        state_ = State::kOther;
      }
      value_ = JsonValueReader();
      [[fallthrough]];
    case State::kArguments:
    case State::kOther: {
      JsonValueReader::Step step = value_.feed(c);
      if (step == JsonValueReader::Step::kError) return fail();
      if (step == JsonValueReader::Step::kBefore) {
        Status s = value_ended(ev);
        if (s != Status::kMore) return s;
        return feed(c, ev);  // `c` follows the value
      }
      if (state_ == State::kArguments && step != JsonValueReader::Step::kSkip) {
        arguments_.push_back(c);
        if (name_) {
          ev->arguments.push_back(c);
          sent_ = arguments_.size();
        }
      }
      if (step == JsonValueReader::Step::kDone) return value_ended(ev);
      return Status::kMore;
    }
    case State::kAfterValue:
      if (is_json_space(c)) return Status::kMore;
      if (c == ',') {
        need_key_ = true;
        state_ = State::kKey;
        return Status::kMore;
      }
      if (c == '}') return close(ev);
      return fail();
    case State::kDone:
    case State::kError:
      break;
  }
  return fail();
}

CallObjectReader::Status CallObjectReader::value_ended(Event*) {
  // Structure alone let the value through: now it must be JSON.
  if (state_ == State::kArguments && !nlohmann::json::accept(arguments_)) return fail();
  need_key_ = false;
  state_ = State::kAfterValue;
  return Status::kMore;
}

CallObjectReader::Status CallObjectReader::close(Event* ev) {
  if (!name_) return fail();
  if (!have_arguments_) ev->arguments += "{}";
  state_ = State::kDone;
  return Status::kDone;
}

}  // namespace specula::server
