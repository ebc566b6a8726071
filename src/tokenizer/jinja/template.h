// A compiled template: parse once, render many times with different contexts.
#pragma once

#include <memory>
#include <string>

#include "core/error.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace specula::jinja {

// The error raise_exception() throws: its what() is exactly the template's message.
class TemplateRaise : public Error {
 public:
  using Error::Error;
};

class Template {
 public:
  explicit Template(const std::string& source);
  // `context` is a dict of the variables the template sees. Errors are specula::Error (naming the
  // line where one is known); raise_exception() becomes a specula::Error with its exact message.
  std::string render(const Value& context) const;

 private:
  Body body_;
};

}  // namespace specula::jinja
