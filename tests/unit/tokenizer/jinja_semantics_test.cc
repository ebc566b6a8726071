// Statements and scoping: for/if/set/macro/with/filter blocks, namespaces, Undefined, errors.
// Expected strings come from jinja2 3.1.6 in transformers' environment (see jinja_test_util.h).
#include "jinja_test_util.h"

namespace specula {
namespace {

TEST(JinjaFor, LoopVariables) {
  EXPECT_EQ(render(R"JT({% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}:{{ m.role }};{% endfor %})JT"), "1/0/3/2/True/False/3:system;2/1/2/1/False/False/3:user;3/2/1/0/False/True/3:assistant;");
  EXPECT_EQ(render(R"JT({% for m in msgs %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ loop.nextitem.role if loop.nextitem is defined }}|{{ loop.cycle('a', 'b') }}{% endfor %})JT"), "->user|asystem>assistant|buser>|a");
  EXPECT_EQ(render(R"JT({% for x in [1, 1, 2] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %})JT"), "12");
}

// jinja2 runs a for's else also when every iteration left its body through break or continue
TEST(JinjaFor, ElseFilterBreakContinue) {
  EXPECT_EQ(render(R"JT({% for x in e %}no{% else %}empty{% endfor %}|{% for x in xs %}{{ x }}{% else %}never{% endfor %})JT"), "empty|312");
  EXPECT_EQ(render(R"JT({% for x in xs if x > 1 %}{{ x }}:{{ loop.length }} {% endfor %})JT"), "3:2 2:2 ");
  EXPECT_EQ(render(R"JT({% for x in xs %}{% if x == 1 %}{% break %}{% endif %}{{ x }}{% endfor %}|{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %})JT"), "3|32");
  EXPECT_EQ(render(R"JT({% for x in xs %}{% for y in xs %}{% if y == 1 %}{% break %}{% endif %}{{ x }}{{ y }} {% endfor %}{% endfor %})JT"), "33 13 23 ");
  EXPECT_EQ(render(R"JT({% for x in xs %}{{ x }}{% if true %}{% continue %}{% endif %}{% else %}E{% endfor %}|{% for x in xs %}{{ x }}{% break %}{% else %}E{% endfor %}|{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% else %}E{% endfor %})JT"), "312E|3E|");
}

TEST(JinjaFor, IteratesDictsStringsAndUnpacksTuples) {
  EXPECT_EQ(render(R"JT({% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'ab' %}[{{ c }}]{% endfor %}|{% for (a, b) in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %})JT"), "z=1,a=2,|za|[a][b]|37");
  EXPECT_EQ(render(R"JT({% for m in messages[::-1] %}{{ m.role }}{% endfor %})JT", "{\"messages\": [{\"role\": \"a\"}, {\"role\": \"b\"}]}"), "ba");
  EXPECT_EQ(render(R"JT({% for x in undefined_thing %}x{% else %}undefined iterates as empty{% endfor %})JT"), "undefined iterates as empty");
}

// a set inside a for loop neither leaks out nor survives to the next iteration; if does not scope
TEST(JinjaScope, LoopBodiesHaveTheirOwnScope) {
  EXPECT_EQ(render(R"JT({% set x = 5 %}{% for i in xs %}[{{ x }}]{% set x = i %}({{ x }}){% endfor %}<{{ x }}>)JT"), "[5](3)[5](1)[5](2)<5>");
  EXPECT_EQ(render(R"JT({% for i in xs %}[{{ y }}]{% set y = i %}{% endfor %}<{{ y }}>)JT"), "[][][]<>");
  EXPECT_EQ(render(R"JT({% if t %}{% set z = 3 %}{% endif %}{{ z }})JT"), "3");
  EXPECT_EQ(render(R"JT({% for m in msgs %}{% set content = m.content %}{% endfor %}[{{ content }}])JT"), "[]");
}

TEST(JinjaScope, NamespacesCarryStateOutOfLoops) {
  EXPECT_EQ(render(R"JT({% set ns = namespace(a=1, b='x') %}{% for x in xs %}{% set ns.a = ns.a + x %}{% endfor %}{{ ns.a }}{{ ns.b }}|{{ ns }})JT"), "7x|<Namespace {'a': 7, 'b': 'x'}>");
  EXPECT_EQ(render(R"JT({% set ns = namespace(found=false) %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}{{ ns.missing is defined }})JT"), "TrueFalse");
  EXPECT_EQ(render(R"JT({% set ns = namespace(d) %}{{ ns.z }}{{ ns['a'] }})JT"), "12");
}

TEST(JinjaSet, AssignmentForms) {
  EXPECT_EQ(render(R"JT({% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }})JT"), "12(1, 2)");
  EXPECT_EQ(render(R"JT({% set x %}inner {{ s }}{% endset %}[{{ x }}]{% set y | upper %}low{% endset %}{{ y }})JT"), "[inner Hello, World]LOW");
  EXPECT_EQ(render(R"JT({% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{{ add_generation_prompt }})JT"), "False");
}

// Python truthiness: empty string/list/dict, 0, none and undefined are false
TEST(JinjaIf, ElifElseAndTruthiness) {
  EXPECT_EQ(render(R"JT({% if i > 5 %}big{% elif i > 2 %}mid{% else %}small{% endif %}{% if n %}x{% elif f %}y{% else %}z{% endif %})JT"), "bigz");
  EXPECT_EQ(render(R"JT({% for v in ['', 'a', 0, 1, 0.0, [], [0], {}, none] %}{{ 'T' if v else 'F' }}{% endfor %}{{ 'T' if undefined_q else 'F' }})JT"), "FTFTFFTFFF");
}

TEST(JinjaMacro, CallsDefaultsAndRecursion) {
  EXPECT_EQ(render(R"JT({% macro greet(name, greeting='Hi') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', greeting='Yo') }} {{ greet(name='Z') }})JT"), "Hi, Bob! Yo, Al! Hi, Z!");
  EXPECT_EQ(render(R"JT({% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }})JT"), "321");
  EXPECT_EQ(render(R"JT({% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}{% set s2 = m('x') %}{{ s2 ~ '!' }})JT"), "[][x]!");
}

// {% generation %} is transformers' AssistantTracker tag: it renders its body
TEST(JinjaBlocks, WithFilterAndGeneration) {
  EXPECT_EQ(render(R"JT({% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}])JT"), "3[]");
  EXPECT_EQ(render(R"JT({% filter upper %}abc {{ s }}{% endfilter %})JT"), "ABC HELLO, WORLD");
  EXPECT_EQ(render(R"JT({{ '<a>' }}{% generation %}{{ s }}{% endgeneration %}{{ '</a>' }})JT"), "<a>Hello, World</a>");
  EXPECT_EQ(render(R"JT({% print s, 1 %})JT"), "Hello, World1");
}

// prints empty, is falsy and iterable, fails on attribute access, arithmetic and calls
TEST(JinjaUndefined, BehavesLikeJinja2sDefaultUndefined) {
  EXPECT_EQ(render(R"JT([{{ nope }}][{{ msgs[0].nope }}][{{ msgs[9] }}][{{ n.attr }}][{{ n['x'] }}][{{ s.nope }}])JT"), "[][][][][][]");
  EXPECT_EQ(render(R"JT({{ nope is defined }}{{ nope is undefined }}{{ nope|length }}{{ nope|default('dflt') }}{{ 'a' ~ nope ~ 'b' }}{{ 'x' in nope }}{{ nope == nope }})JT"), "FalseTrue0dfltabFalseTrue");
  EXPECT_RENDER_THROWS(R"JT({{ nope.attr }})JT");  // jinja2: UndefinedError: 'nope' is undefined
  EXPECT_RENDER_THROWS(R"JT({{ nope + 1 }})JT");  // jinja2: UndefinedError: 'nope' is undefined
  EXPECT_RENDER_THROWS(R"JT({{ nope() }})JT");  // jinja2: UndefinedError: 'nope' is undefined
  EXPECT_RENDER_THROWS(R"JT({{ msgs[0].nope.deeper }})JT");  // jinja2: UndefinedError: 'dict object' has no attribute 'nope'
  EXPECT_RENDER_THROWS(R"JT({{ nope|tojson }})JT");  // jinja2: TypeError: Object of type Undefined is not JSON serializable
}

// Python raises for these; so must we
TEST(JinjaErrors, RuntimeErrorsThrow) {
  EXPECT_RENDER_THROWS(R"JT({{ 'a' + 1 }})JT");  // jinja2: TypeError: can only concatenate str (not "int") to str
  EXPECT_RENDER_THROWS(R"JT({{ 1 / 0 }})JT");  // jinja2: ZeroDivisionError: division by zero
  EXPECT_RENDER_THROWS(R"JT({{ xs.append(4) }})JT");  // jinja2: SecurityError: access to attribute 'append' of 'list' object is unsafe.
  EXPECT_RENDER_THROWS(R"JT({{ d.update({}) }})JT");  // jinja2: SecurityError: access to attribute 'update' of 'dict' object is unsafe.
  EXPECT_RENDER_THROWS(R"JT({% for x in 5 %}{% endfor %})JT");  // jinja2: TypeError: 'int' object is not iterable
  EXPECT_RENDER_THROWS(R"JT({{ 'x' in none }})JT");  // jinja2: TypeError: argument of type 'NoneType' is not iterable
  EXPECT_RENDER_THROWS(R"JT({% set a, b = [1] %})JT");  // jinja2: ValueError: not enough values to unpack (expected 2, got 1)
  EXPECT_RENDER_THROWS(R"JT({{ xs < 'a' }})JT");  // jinja2: TypeError: '<' not supported between instances of 'list' and 'str'
  EXPECT_RENDER_THROWS(R"JT({{ n.x.y }})JT");  // jinja2: UndefinedError: 'None' has no attribute 'x'
  EXPECT_RENDER_THROWS(R"JT({{ raise_exception('custom') }})JT");  // jinja2: TemplateError: custom
}

}  // namespace
}  // namespace specula
