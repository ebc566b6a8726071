// What the interpreter cannot run fails at compile() with the construct and its line; errors at
// render time carry the line of the statement; raise_exception() carries the template's message.
#include "jinja_test_util.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

TEST(JinjaCompileErrors, UnsupportedTagsNameTheTagAndLine) {
  EXPECT_EQ(compile_error("line1\n{% call foo() %}x{% endcall %}"), "unsupported tag 'call' at line 2");
  EXPECT_EQ(compile_error("a\nb\n{% include 'x.j2' %}"), "unsupported tag 'include' at line 3");
  EXPECT_EQ(compile_error("{% extends 'base' %}"), "unsupported tag 'extends' at line 1");
  EXPECT_EQ(compile_error("{% import 'm' as m %}"), "unsupported tag 'import' at line 1");
  EXPECT_EQ(compile_error("{% block b %}{% endblock %}"), "unsupported tag 'block' at line 1");
  // `do` needs an extension transformers does not enable: jinja2 rejects it too.
  EXPECT_EQ(compile_error("\n\n\n{% do xs.append(1) %}"), "unsupported tag 'do' at line 4");
  EXPECT_EQ(compile_error("{% frobnicate %}"), "unsupported tag 'frobnicate' at line 1");
}

TEST(JinjaCompileErrors, UnknownFiltersTestsAndMethodsFailAtCompileTime) {
  EXPECT_EQ(compile_error("{{ x|wordwrap(3) }}"), "unsupported filter 'wordwrap' at line 1");
  EXPECT_EQ(compile_error("{{ x|no_such_filter }}"), "unsupported filter 'no_such_filter' at line 1");
  EXPECT_EQ(compile_error("\n\n{% if x is weird %}{% endif %}"), "unsupported test 'weird' at line 3");
  EXPECT_EQ(compile_error("a\n{{ s.expandtabs() }}"), "unsupported method 'expandtabs' at line 2");
  EXPECT_EQ(compile_error("{% for x in xs recursive %}{% endfor %}"), "unsupported recursive for loop at line 1");
  EXPECT_EQ(compile_error("{{ f(*args) }}"), "unsupported '*args' / '**kwargs' in a call at line 1");
  // A filter or test guarded by a condition is still rejected: compile() checks the whole template.
  EXPECT_EQ(compile_error("{% if false %}\n{{ x|urlize }}\n{% endif %}"), "unsupported filter 'urlize' at line 2");
}

TEST(JinjaCompileErrors, SyntaxErrorsNameTheLine) {
  EXPECT_THAT(compile_error("{% for x in xs %}\nno end"), HasSubstr("line 2"));
  EXPECT_THAT(compile_error("{% for x in xs %}\nno end"), HasSubstr("'endfor'"));
  EXPECT_THAT(compile_error("{% if x %}\n{% endfor %}"), HasSubstr("syntax error at line 2: unexpected tag 'endfor'"));
  EXPECT_THAT(compile_error("{% break %}"), HasSubstr("'break' outside of a loop"));
  EXPECT_THAT(compile_error("{% for x in xs %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}"),
              HasSubstr("'break' outside of a loop"));
  EXPECT_THAT(compile_error("\n{{ 'abc }}"), HasSubstr("line 2: unterminated string literal"));
  EXPECT_THAT(compile_error("{# unterminated"), HasSubstr("missing end of comment tag"));
  EXPECT_THAT(compile_error("{% raw %}never closed"), HasSubstr("missing end of raw directive"));
  EXPECT_THAT(compile_error("{{ a ]] }}"), HasSubstr("unexpected ']'"));
  EXPECT_THAT(compile_error("{{ (a ] }}"), HasSubstr("unexpected ']', expected ')'"));
  EXPECT_THAT(compile_error("{{ x @ y }}"), HasSubstr("unexpected char '@'"));
  EXPECT_THAT(compile_error("{{ }}"), HasSubstr("expected an expression"));
  EXPECT_THAT(compile_error("{{ x "), HasSubstr("unexpected end of template"));
  EXPECT_THAT(compile_error("{% macro m(a=1, b) %}{% endmacro %}"), HasSubstr("non-default argument follows default argument"));
}

TEST(JinjaCompileErrors, NestingDeeperThanTheBoundIsRefusedAtCompileTime) {
  // Each construct recurses once per level when parsed, rendered and freed: 10^5 levels would
  // overflow the stack (they did, under AddressSanitizer, from 2000).
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  const int deep = 100000;
  for (const std::string& tmpl :
       {"{{ " + repeat("(", deep) + "1" + repeat(")", deep) + " }}", "{{ " + repeat("[", deep) + repeat("]", deep) + " }}",
        "{{ " + repeat("not ", deep) + "1 }}", "{{ " + repeat("-", deep) + "1 }}", "{{ 1" + repeat(" + 1", deep) + " }}",
        "{{ 1" + repeat(" and 1", deep) + " }}", "{{ 1" + repeat("|abs", deep) + " }}", "{{ x" + repeat(".y", deep) + " }}",
        repeat("{% if true %}", deep) + "x" + repeat("{% endif %}", deep)}) {
    EXPECT_THAT(compile_error(tmpl), HasSubstr("nest deeper than 256 levels")) << tmpl.substr(0, 40);
  }
  // Far inside the bound, the same constructs render.
  EXPECT_EQ(render("{{ " + repeat("(", 40) + "1" + repeat(")", 40) + repeat(" + 1", 40) + " }}"), "41");
  EXPECT_EQ(render(repeat("{% if true %}", 40) + "x" + repeat("{% endif %}", 40)), "x");
}

TEST(JinjaCompileErrors, RealTemplatesCompile) {
  EXPECT_EQ(compile_error(""), "");
  EXPECT_EQ(compile_error("plain text, no tags"), "");
}

TEST(JinjaRenderErrors, RaiseExceptionCarriesTheTemplatesMessageExactly) {
  const std::string tmpl =
      "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
      "{% endif %}{{ m['content'] }}{% endfor %}";
  EXPECT_EQ(render(tmpl, R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})"), "ab");
  EXPECT_EQ(render_error(tmpl, R"({"messages": [{"role": "assistant", "content": "a"}]})"),
            "Conversation roles must alternate user/assistant/user/assistant/...");
  EXPECT_EQ(render_error("{{ raise_exception('System role ' ~ 'not supported') }}"), "System role not supported");
}

TEST(JinjaRenderErrors, RuntimeErrorsNameTheLine) {
  EXPECT_EQ(render_error("a\n{{ nope.attr }}"), "chat template error at line 2: 'nope' is undefined");
  EXPECT_EQ(render_error("\n\n{% for x in 5 %}{% endfor %}"), "chat template error at line 3: 'int' object is not iterable");
  EXPECT_EQ(render_error("{{ msgs[0].nope.deeper }}"), "chat template error at line 1: 'dict object' has no attribute 'nope'");
  EXPECT_EQ(render_error("{{ n.x.y }}"), "chat template error at line 1: 'None' has no attribute 'x'");
  EXPECT_EQ(render_error("{% for m in msgs %}\n{% if 'x' in m.nope2 %}{% endif %}{% endfor %}"), "");  // in Undefined: false
  EXPECT_EQ(render_error("{% set x = 1 %}\n\n{{ 'a' + x }}"),
            "chat template error at line 3: can only concatenate str (not \"int\") to str");
  EXPECT_THAT(render_error("{{ xs.append(4) }}"), HasSubstr("access to attribute 'append' of 'list' object is unsafe."));
  EXPECT_THAT(render_error("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}"), HasSubstr("maximum recursion depth"));
  EXPECT_THAT(render_error("{{ range(1000000)|length }}"), HasSubstr("Range too big"));
}

TEST(JinjaRender, ContextMustBeAnObject) {
  auto tmpl = ChatTemplate::compile("x");
  EXPECT_THROW(tmpl->render(nlohmann::ordered_json::array()), Error);
  EXPECT_EQ(tmpl->render(nlohmann::json::object()), "x");
}

TEST(JinjaRender, CompiledTemplateRendersManyContexts) {
  auto tmpl = ChatTemplate::compile("{% for m in messages %}{{ m.content }}{% endfor %}");
  for (int i = 0; i < 3; ++i) {
    nlohmann::ordered_json ctx = {{"messages", {{{"content", std::to_string(i)}}}}};
    EXPECT_EQ(tmpl->render(ctx), std::to_string(i));
  }
}

}  // namespace
}  // namespace specula
