// Parses tokens into a syntax tree with jinja2's grammar and operator precedence. Everything the
// interpreter cannot run is rejected here, at compile time, with the construct and its line:
// unsupported tags (extends, include, import, call, ...), unknown filters and tests, calls to
// methods the interpreter does not implement, `*args` / `**kwargs` in calls, recursive loops.
#pragma once

#include <string>

#include "tokenizer/jinja/ast.h"

namespace specula::jinja {

Body parse_template(const std::string& source);

}  // namespace specula::jinja
