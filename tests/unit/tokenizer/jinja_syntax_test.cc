// Lexing and parsing: whitespace control, comments, raw blocks, literals, precedence.
// Expected strings come from jinja2 3.1.6 in transformers' environment (see jinja_test_util.h).
#include "jinja_test_util.h"

namespace specula {
namespace {

// trim_blocks: the first newline after %} goes, after }} it stays
TEST(JinjaWhitespace, TrimBlocksRemovesTheNewlineAfterABlockTag) {
  EXPECT_EQ(render(R"JT({% if t %}
yes
{% endif %}
after)JT"), "yes\nafter");
  EXPECT_EQ(render(R"JT({{ s }}
next)JT"), "Hello, World\nnext");
  EXPECT_EQ(render(R"JT({% for x in xs %}
{{ x }}
{% endfor %})JT"), "3\n1\n2\n");
  EXPECT_EQ(render(R"JT({% if t %}

{% endif %}|)JT"), "\n|");
  EXPECT_EQ(render(R"JT(x {% if t %}
y{% endif %})JT"), "x y");
}

// lstrip_blocks: blanks before {% or {# at the start of a line go, not before {{
TEST(JinjaWhitespace, LstripBlocksRemovesBlanksBeforeATagAtLineStart) {
  EXPECT_EQ(render(R"JT(line1
  {% if t %}
    yes
  {% endif %}
line2)JT"), "line1\n    yes\nline2");
  EXPECT_EQ(render(R"JT(a
  {{ s }}
b)JT"), "a\n  Hello, World\nb");
  EXPECT_EQ(render(R"JT(	{% if t %}tab{% endif %})JT"), "tab");
  EXPECT_EQ(render(R"JT(   {{ s }}   {% if t %}   x   {% endif %}   )JT"), "   Hello, World      x      ");
  EXPECT_EQ(render(R"JT(text   {# comment #}
next)JT"), "text   next");
}

// {%- -%} {{- -}} {#- -#} strip all whitespace, newlines included
TEST(JinjaWhitespace, MinusStripsAllWhitespaceOnThatSide) {
  EXPECT_EQ(render(R"JT(  {%- if t -%}
    yes
  {%- endif -%}
  end)JT"), "yesend");
  EXPECT_EQ(render(R"JT(a  {{- s -}}  b)JT"), "aHello, Worldb");
  EXPECT_EQ(render(R"JT({% for x in xs -%}
  {{ x }}
{%- endfor %})JT"), "312");
  EXPECT_EQ(render(R"JT(a

  {#- c -#}  

b)JT"), "ab");
  EXPECT_EQ(render(R"JT({%- for m in msgs %}
    {%- if m.role == 'user' %}
        {{- '<u>' + m.content }}
    {%- endif %}
{%- endfor %})JT"), "<u> hi there \n");
}

// {%+ disables lstrip_blocks for the tag, +%} disables trim_blocks
TEST(JinjaWhitespace, PlusKeepsWhitespace) {
  EXPECT_EQ(render(R"JT(  {%+ if t %}keep{% endif +%}
after)JT"), "  keep\nafter");
  EXPECT_EQ(render(R"JT(a
  {#+ c #}b)JT"), "a\n  b");
}

TEST(JinjaWhitespace, NewlinesAreNormalisedAndOneTrailingNewlineDropped) {
  EXPECT_EQ(render("crlf\r\nline\rcr\r\n"), "crlf\nline\ncr");
  EXPECT_EQ(render(R"JT(two trailing

)JT"), "two trailing\n");
  EXPECT_EQ(render(R"JT({{ s }}
)JT"), "Hello, World");
}

TEST(JinjaLexer, CommentsAndRawBlocks) {
  EXPECT_EQ(render(R"JT({# a comment #}a{#- trimmed -#} b {# {{ not a tag }} #}c)JT"), "ab c");
  EXPECT_EQ(render(R"JT({% raw %}{{ not rendered }}{% if %}{% endraw %})JT"), "{{ not rendered }}{% if %}");
  EXPECT_EQ(render(R"JT({% raw %}
  {{ a }}
{% endraw %}
tail)JT"), "\n  {{ a }}\ntail");
  EXPECT_EQ(render(R"JT(  {%- raw -%}  {{ x }}  {%- endraw -%}  z)JT"), "{{ x }}z");
}

// Python string escapes; adjacent literals concatenate
TEST(JinjaLexer, StringLiteralsAndEscapes) {
  EXPECT_EQ(render(R"JT({{ "tab\tnl\\n" }}|{{ 'it\'s' }}|{{ "\u00e9\x41\101" }}|{{ 'a' "b" 'c' }}|{{ '\q' }}|{{ "日本" }})JT"), "tab\tnl\\n|it's|éAA|abc|\\q|日本");
  EXPECT_EQ(render(R"JT({{ '{{ braces }}' }}{{ "%}" }})JT"), "{{ braces }}%}");
}

TEST(JinjaLexer, NumberLiterals) {
  EXPECT_EQ(render(R"JT({{ 42 }} {{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1.5 }} {{ 2e3 }} {{ 1.5e-3 }})JT"), "42 1000 31 5 15 1.5 2000.0 0.0015");
}

// a }} inside an unclosed { does not end the tag
TEST(JinjaLexer, BracesInsideTagsDoNotEndThem) {
  EXPECT_EQ(render(R"JT({{ {'a': {'b': 1}} }}{{ {'a': 1}['a'] }}{{ [[1, 2], [3]] }})JT"), "{'a': {'b': 1}}1[[1, 2], [3]]");
}

// filters bind tighter than arithmetic, ~ sits between + and *, not binds looser than comparisons
TEST(JinjaParser, Precedence) {
  EXPECT_RENDER_THROWS(R"JT({{ msgs|length - 1 }}|{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}|{{ 1 + 2 ~ 3 * 2 }}|{{ not 1 == 2 }}|{{ -fl|abs }}|{{ -(xs|length) }})JT");  // jinja2: TypeError: unsupported operand type(s) for +: 'int' and 'str'
  EXPECT_RENDER_THROWS(R"JT({{ -xs|length }})JT");  // jinja2: TypeError: bad operand type for unary -: 'list'
  EXPECT_EQ(render(R"JT({{ 'a' if t else 'b' if f else 'c' }}|{{ 'x' if f }}|{{ t and f or 'z' }}|{{ not t or t }})JT"), "a||z|True");
  EXPECT_EQ(render(R"JT({{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 in xs and 9 not in xs }}{{ not 3 in xs }})JT"), "TrueFalseTrueFalse");
}

TEST(JinjaParser, TestsTakeOneBareArgument) {
  EXPECT_EQ(render(R"JT({{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ i is not none }}{{ n is none and t }}{{ 'x' if n is none else 'y' }})JT"), "TrueFalseTrueTruex");
}

}  // namespace
}  // namespace specula
