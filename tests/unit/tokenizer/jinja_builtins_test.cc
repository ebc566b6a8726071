// Filters, tests, globals, str/dict/list methods, and how values print and compute.
// Expected strings come from jinja2 3.1.6 in transformers' environment (see jinja_test_util.h).
#include "jinja_test_util.h"

namespace specula {
namespace {

TEST(JinjaFilters, StringFilters) {
  EXPECT_EQ(render(R"JT({{ s|length }} {{ u|length }} {{ s|upper }} {{ s|lower }} {{ u|upper }} {{ 'hello world-foo(bar'|title }} {{ 'hELLO wORLD'|capitalize }})JT"), "12 14 HELLO, WORLD hello, world HÉLLO WÖRLD 日本 Hello World-Foo(Bar Hello world");
  EXPECT_EQ(render(R"JT([{{ '  a b  '|trim }}][{{ 'xxaxx'|trim('x') }}][{{ msgs[1].content|trim }}][{{ u|trim('h日本') }}][{{ '\u3000 x\u00a0'|trim }}])JT"), "[a b][a][hi there][éllo wörld ][x]");
  EXPECT_EQ(render(R"JT({{ s|replace('l', 'L') }} {{ s|replace('l', 'L', 1) }} {{ 'abc'|replace('', '-') }} {{ s|reverse }} {{ s|first }}{{ s|last }} {{ s|list }} {{ s|wordcount }} {{ 'ab'|center(6) }}|)JT"), "HeLLo, WorLd HeLlo, World -a-b-c- dlroW ,olleH Hd ['H', 'e', 'l', 'l', 'o', ',', ' ', 'W', 'o', 'r', 'l', 'd'] 2   ab  |");
  EXPECT_EQ(render(R"JT({{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent('>>', blank=true) }}|{{ 'x'|indent }})JT"), "a\n  b\n\n  c|  a\n  b|a\n>>\n>>b|x");
  EXPECT_EQ(render(R"JT({{ '<a href="x">&\'</a>'|e }} {{ '<b>'|safe }} {{ '%s-%d'|format('a', 3) }} {{ '%s' % 'x' }} {{ '%s and %s' % ('a', 'b') }})JT"), "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt; <b> a-3 x a and b");
}

TEST(JinjaFilters, SequenceFilters) {
  EXPECT_EQ(render(R"JT({{ xs|length }}{{ xs|count }}{{ d|length }}{{ e|length }} {{ xs|first }}{{ xs|last }}{{ d|first }}{{ d|last }} {{ e|first }}| {{ xs|join(',') }} {{ xs|join }} {{ msgs|join('-', attribute='role') }})JT"), "3320 32za | 3,1,2 312 system-user-assistant");
  EXPECT_EQ(render(R"JT({{ xs|list }} {{ d|list }} {{ d|items|list }} {{ xs|reverse|list }} {{ xs|sort }} {{ xs|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }})JT"), "[3, 1, 2] ['z', 'a'] [('z', 1), ('a', 2)] [2, 1, 3] [1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] ['A', 'b', 'c']");
  EXPECT_EQ(render(R"JT({{ msgs|sort(attribute='role')|map(attribute='role')|join(',') }} {{ [1, 1, 2, 'A', 'a']|unique|list }} {{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ d|dictsort(by='value') }})JT"), "assistant,system,user [1, 2, 'A'] [('a', 2), ('z', 1)] [('z', 1), ('a', 2)] [('z', 1), ('a', 2)]");
  EXPECT_EQ(render(R"JT({{ xs|sum }} {{ xs|min }} {{ xs|max }} {{ ['b', 'A']|max }} {{ msgs|map(attribute='role')|max }} {{ e|min }}| {{ [1.5, 2]|sum(start=10) }})JT"), "6 1 3 b user | 13.5");
}

// map/select/... return generators: truthy even when empty, no len()
TEST(JinjaFilters, MapSelectReject) {
  EXPECT_EQ(render(R"JT({{ msgs|selectattr('role', 'equalto', 'user')|list|length }} {{ msgs|rejectattr('role', 'equalto', 'user')|map(attribute='role')|join(',') }} {{ msgs|map(attribute='nope', default='D')|list }})JT"), "1 system,assistant ['D', 'D', 'D']");
  EXPECT_EQ(render(R"JT({{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ ['a', 'b']|map('upper')|list }} {{ [0, 1, '', none, 'a']|select|list }} {{ msgs|selectattr('tool_calls')|list|length }} {{ msgs|selectattr('tool_calls', 'defined')|list|length }})JT"), "[3, 1] [2] ['A', 'B'] [1, 'a'] 1 1");
  EXPECT_EQ(render(R"JT({% if msgs|selectattr('role', 'equalto', 'nobody') %}truthy{% endif %} {{ (msgs|selectattr('role', 'equalto', 'system')|list|last).content }} {{ msgs|map(attribute='tool_calls.0.function.name', default='-')|list }})JT"), "truthy sys ['-', '-', 'f']");
  EXPECT_RENDER_THROWS(R"JT({{ msgs|selectattr('role', 'equalto', 'user')|length }})JT");  // jinja2: TypeError: object of type 'generator' has no len()
}

TEST(JinjaFilters, DefaultIntFloatStringRound) {
  EXPECT_EQ(render(R"JT({{ nope|default('dflt') }} {{ n|default('dflt') }} {{ ''|default('dflt', true) }} {{ s|d('x') }} {{ e|default('E', boolean=true) }})JT"), "dflt None dflt Hello, World E");
  EXPECT_EQ(render(R"JT({{ '42'|int + 1 }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ -3.9|int }} {{ '0x1A'|int(0, 16) }} {{ '3.5'|float }} {{ 'a'|float }} {{ 4|float }} {{ t|int }})JT"), "43 42 0 5 3 -3 26 3.5 0.0 4.0 1");
  EXPECT_EQ(render(R"JT({{ i|round }} {{ t|round }} {{ i|round(1, 'floor') }} {{ fl is odd }} {{ 3.0 is odd }} {{ 4 is even }} {{ 'x%s' % xs }} {{ 'plain' % d }})JT"), "7 1 7.0 False True True x[3, 1, 2] plain");
  EXPECT_RENDER_THROWS(R"JT({{ nope|float }})JT");  // jinja2: UndefinedError: 'nope' is undefined
  EXPECT_RENDER_THROWS(R"JT({{ nope|int }})JT");  // jinja2: UndefinedError: 'nope' is undefined
  EXPECT_RENDER_THROWS(R"JT({{ 5|indent }})JT");  // jinja2: TypeError: unsupported operand type(s) for +=: 'int' and 'str'
  EXPECT_RENDER_THROWS(R"JT({{ xs|indent }})JT");  // jinja2: AttributeError: 'list' object has no attribute 'splitlines'
  EXPECT_RENDER_THROWS(R"JT({{ xs in d }})JT");  // jinja2: TypeError: unhashable type: 'list'
  EXPECT_RENDER_THROWS(R"JT({{ 'ab' % 1 }})JT");  // jinja2: TypeError: not all arguments converted during string formatting
  EXPECT_EQ(render(R"JT({{ xs|string }} {{ 5|string }} {{ n|string }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ -3|abs }} {{ -2.5|abs }})JT"), "[3, 1, 2] 5 None 2.57 2.0 4.0 2.67 3.0 2.0 3 2.5");
}

// transformers' tojson: json.dumps(ensure_ascii=False), key order kept, Python separators and float repr
TEST(JinjaFilters, TojsonMatchesTransformers) {
  EXPECT_EQ(render(R"JT({{ msgs[2].tool_calls[0].function.arguments|tojson }} {{ d|tojson }} {{ u|tojson }} {{ n|tojson }} {{ '"q" \\ \n\t\u0001'|tojson }})JT"), "{\"b\": 1, \"a\": [1.5, null, true]} {\"z\": 1, \"a\": 2} \"héllo wörld 日本\" null \"\\\"q\\\" \\\\ \\n\\t\\u0001\"");
  EXPECT_EQ(render(R"JT({{ d|tojson(indent=2) }}|{{ xs|tojson(indent=2) }}|{{ {'a': [], 'b': {}}|tojson(indent=1) }}|{{ xs|tojson(separators=(',', ':')) }}|{{ d|tojson(sort_keys=true) }}|{{ 'é😀'|tojson(ensure_ascii=true) }})JT"), "{\n  \"z\": 1,\n  \"a\": 2\n}|[\n  3,\n  1,\n  2\n]|{\n \"a\": [],\n \"b\": {}\n}|[3,1,2]|{\"a\": 2, \"z\": 1}|\"\\u00e9\\ud83d\\ude00\"");
  EXPECT_EQ(render(R"JT({{ [1.0, 1e16, 1e-7, 0.1, 100.0, 123456789.125, -0.0, true, false]|tojson }} {{ d|tojson(indent='--') }})JT"), "[1.0, 1e+16, 1e-07, 0.1, 100.0, 123456789.125, -0.0, true, false] {\n--\"z\": 1,\n--\"a\": 2\n}");
}

TEST(JinjaFilters, TojsonOfNonJsonValuesThrows) {
  EXPECT_RENDER_THROWS(R"JT({{ namespace(a=1)|tojson }})JT");  // jinja2: TypeError: Object of type Namespace is not JSON serializable
  EXPECT_RENDER_THROWS(R"JT({{ xs|map('string')|tojson }})JT");  // jinja2: TypeError: Object of type generator is not JSON serializable
}

TEST(JinjaMethods, StrMethods) {
  EXPECT_EQ(render(R"JT({{ s.startswith('Hell') }}{{ s.endswith('World') }}{{ s.startswith(('x', 'He')) }} {{ s.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b  c  '.split(none, 1) }})JT"), "TrueTrueTrue ['Hello', ' World'] ['a', 'b'] ['a', 'b,c'] ['a,b', 'c'] ['a', 'b  c  ']");
  EXPECT_EQ(render(R"JT([{{ '\n\nx\n\n'.strip('\n') }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ 'xyxhixy'.strip('xy') }}] {{ s.upper() }} {{ s.lower() }} {{ u.upper() }} {{ u.title() }} {{ "they're bill's".title() }} {{ u.capitalize() }} {{ s.swapcase() }})JT"), "[x][x  ][  x][hi] HELLO, WORLD hello, world HÉLLO WÖRLD 日本 Héllo Wörld 日本 They'Re Bill'S Héllo wörld 日本 hELLO, wORLD");
  EXPECT_EQ(render(R"JT({{ s.replace('o', '0') }} {{ s.replace('o', '0', 1) }} {{ s.find('o') }} {{ s.rfind('o') }} {{ u.find('日') }} {{ s.find('q') }} {{ s.count('l') }} {{ s.index('W') }} {{ ', '.join(['a', 'b']) }} {{ ''.join(xs|map('string')) }})JT"), "Hell0, W0rld Hell0, World 4 8 12 -1 3 7 a, b 312");
  EXPECT_EQ(render(R"JT({{ '{} and {}'.format('x', 1) }} {{ '{0}{name}{0!r}'.format('p', name='q') }} {{ '{{lit}}'.format() }} {{ 'abc'.isalpha() }}{{ '12'.isdigit() }}{{ ' '.isspace() }}{{ 'ab'.islower() }}{{ 'AB'.isupper() }}{{ ''.isalpha() }})JT"), "x and 1 pq'p' {lit} TrueTrueTrueTrueTrueFalse");
  EXPECT_EQ(render(R"JT({{ 'a\nb\r\nc\n'.splitlines() }} {{ 'abc'.center(9, '*') }} {{ 'ab'.ljust(4) }}| {{ 'ab'.rjust(4, '0') }} {{ 'a.b.c'.partition('.') }} {{ 'a.b.c'.rpartition('.') }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.json'.removesuffix('.json') }})JT"), "['a', 'b', 'c'] ***abc*** ab  | 00ab ('a', '.', 'b.c') ('a.b', '.', 'c') x x");
  EXPECT_EQ(render(R"JT({{ msgs[2].content.split('</think>')[-1].lstrip('\n') }}|{{ '<think>\nr\n</think>\n\nans'.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') }})JT"), "yo|r");
}

// d.items resolves to the method, d['items'] to the key
TEST(JinjaMethods, DictAndListMethods) {
  EXPECT_EQ(render(R"JT({{ d.get('z') }} {{ d.get('q') }} {{ d.get('q', 'dv') }} {{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ xs.index(1) }} {{ [1, 1, 2].count(1) }})JT"), "1 None dv [('z', 1), ('a', 2)] ['z', 'a'] [1, 2] 1 2");
  EXPECT_EQ(render(R"JT({{ dd['items'] }} {{ dd.items is defined }} {{ dd.get('items') }})JT", "{\"dd\": {\"items\": 3}}"), "3 True 3");
}

// None/True/False, Python float repr, list/dict/tuple repr with quote choice
TEST(JinjaValues, PrintedAsPythonStrDoes) {
  EXPECT_EQ(render(R"JT({{ s }}|{{ n }}|{{ t }}|{{ f }}|{{ xs }}|{{ d }}|{{ fl }}|{{ (1,) }}|{{ (1, 'a') }}|{{ ['it\'s', 'a"b', 'both\'"', 'nl\n', '日本'] }}|{{ msgs[2].tool_calls }})JT"), "Hello, World|None|True|False|[3, 1, 2]|{'z': 1, 'a': 2}|2.5|(1,)|(1, 'a')|[\"it's\", 'a\"b', 'both\\'\"', 'nl\\n', '日本']|[{'function': {'name': 'f', 'arguments': {'b': 1, 'a': [1.5, None, True]}}}]");
  EXPECT_EQ(render(R"JT({{ 1e16 }} {{ 1e15 }} {{ 1.0 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1.5e-7 }} {{ 0.1 + 0.2 }} {{ 1e100 }} {{ 123456789012345680.0 }} {{ -0.0 }} {{ 10 / 4 }} {{ 10 / 3 }} {{ 2 ** 0.5 }})JT"), "1e+16 1000000000000000.0 1.0 0.0001 1e-05 1.5e-07 0.30000000000000004 1e+100 1.2345678901234568e+17 -0.0 2.5 3.3333333333333335 1.4142135623730951");
}

TEST(JinjaValues, ArithmeticFollowsPython) {
  EXPECT_EQ(render(R"JT({{ 1 + 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ t + t }} {{ -i }} {{ +fl }})JT"), "3 3.5 3 -4 1 2 -2 1024 0.5 2.5 3.0 0.5 2 -7 2.5");
  EXPECT_EQ(render(R"JT({{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [1] + [2] }} {{ [0] * 3 }} {{ 'a' ~ 1 ~ n ~ t ~ nope ~ xs ~ 1.0 }})JT"), "ab ababab xx [1, 2] [0, 0, 0] a1NoneTrue[3, 1, 2]1.0");
  EXPECT_EQ(render(R"JT({{ 1 == 1.0 }}{{ t == 1 }}{{ [1] == (1,) }}{{ [1, 2] < [1, 3] }}{{ 'a' < 'b' }}{{ 'B' < 'a' }}{{ d == {'a': 2, 'z': 1} }}{{ 1 != 'a' }})JT"), "TrueTrueFalseTrueTrueTrueTrueTrue");
}

// Python's types: a bool is a number, a dict is a sequence, Undefined is iterable
TEST(JinjaTests, TypeTests) {
  EXPECT_EQ(render(R"JT({{ n is none }}{{ s is string }}{{ d is mapping }}{{ xs is iterable }}{{ xs is sequence }}{{ d is sequence }}{{ s is sequence }}{{ i is number }}{{ t is number }}{{ t is boolean }}{{ i is boolean }}{{ t is true }}{{ f is false }}{{ 1 is true }})JT"), "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueFalse");
  EXPECT_EQ(render(R"JT({{ i is integer }}{{ t is integer }}{{ fl is float }}{{ i is float }}{{ nope is undefined }}{{ s is defined }}{{ nope is iterable }}{{ 5 is iterable }}{{ i is odd }}{{ i is even }}{{ 'upper' is filter }}{{ 'nope' is test }}{{ 3 is in xs }}{{ i is eq 7 }}{{ i is gt 3 }}{{ i is le 7 }}{{ s is lower }}{{ 'ab' is lower }}{{ n is sameas none }}{{ range is callable }})JT"), "TrueFalseTrueFalseTrueTrueTrueFalseTrueFalseTrueFalseTrueTrueTrueTrueFalseTrueTrueTrue");
}

TEST(JinjaGlobals, RangeDictNamespace) {
  EXPECT_EQ(render(R"JT({{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }} {% for i in range(3) %}{{ i }}{% endfor %} {{ dict(a=1, b=2) }} {{ namespace(x=1).x }})JT"), "[0, 1, 2] [1, 3, 5] [5, 3, 1] 012 {'a': 1, 'b': 2} 1");
}

}  // namespace
}  // namespace specula
