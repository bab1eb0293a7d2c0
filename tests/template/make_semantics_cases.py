#!/usr/bin/env python3
"""make_semantics_cases.py: writes data/semantics.json, the per-feature cases that
test_semantics.cpp renders with ordo's engine: each is a small template (plus variables) and
what Python's jinja2 renders for it in transformers' environment (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, a {% generation %} tag, json.dumps tojson,
raise_exception, strftime_now pinned to 2024-07-26), or that it fails.

Needs Debian's python3-jinja2 (a developer's tool, not a build dependency):
    /usr/bin/python3 tests/template/make_semantics_cases.py          # rewrite the file
    /usr/bin/python3 tests/template/make_semantics_cases.py --check  # exit 1 if it differs
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "semantics.json")


class Generation(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime(2024, 7, 26).strftime(fmt)
    return env


V = {
    "msgs": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi\n"},
             {"role": "assistant", "content": "Hello <b>there</b>"}],
    "d": {"b": 2, "a": 1, "C": 3},
    "nested": {"x": {"y": [1, {"z": "deep"}]}},
    "nums": [3, 1, 2, 10, -4],
    "words": ["banana", "Apple", "cherry", "apple"],
    "s": "  Hello, Wörld!  ",
    "u": "ΣΑΣ straße ǅ ﬁ İ",
    "people": [{"name": "Ann", "age": 31, "team": "b"}, {"name": "bob", "age": 25, "team": "a"},
               {"name": "Cy", "age": 31, "team": "b"}],
    "n": None, "t": True, "f": 1.5, "i": 7, "empty": "", "zero": 0,
    "tree": [{"name": "a", "kids": [{"name": "a1", "kids": []}, {"name": "a2", "kids": []}]},
             {"name": "b", "kids": []}],
}

# (name, template) pairs; every case renders with the variables V.
CASES = [
    # --- whitespace control and the lexer ---
    ("trim_blocks", "{% if t %}\nyes\n{% endif %}\nend"),
    ("lstrip_blocks", "a\n    {% if t %}\n    b\n    {% endif %}\nc"),
    ("lstrip_not_var", "a\n    {{ i }}\n    {% if t %}x{% endif %}"),
    ("minus_both", "a   {{- i -}}   b\n\n  {%- if t -%}  c  {%- endif -%}  d"),
    ("plus_disables_lstrip", "a\n    {%+ if t %}b{% endif %}"),
    ("plus_disables_trim", "{% if t +%}\nb{% endif %}"),
    ("comment_trim", "a\n  {# note #}\nb{#- x -#}   c"),
    ("trailing_newline_once", "a\n\n"),
    ("crlf_source", "a\r\n{% if t %}\r\nb\r\n{% endif %}\r\nc"),
    ("raw_block", "{% raw %}{{ not }} {% evaluated %}{% endraw %}!"),
    ("raw_whitespace", "x\n  {%- raw -%}  {{ y }}  {%- endraw -%}  z"),
    ("nested_braces", "{{ {'a': {'b': 1}} }}{{ {'k': 'v'}['k'] }}"),
    ("string_escapes", "{{ 'a\\tb\\n\\x41\\u00e9\\U0001F600\\\\\\'\"\\d\\101' }}"),
    ("adjacent_strings", "{{ 'ab' \"cd\" 'ef' }}"),
    ("percent_in_string", "{{ '%}' }}{{ \"}}\" }}"),
    ("numbers", "{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1.5e3 }} {{ 2e-3 }} {{ 1E5 }}"),
    # --- printing values (Python str / repr) ---
    ("print_scalars", "{{ none }}|{{ true }}|{{ False }}|{{ 1.0 }}|{{ 0.1 }}|{{ 1e-5 }}|{{ 1e16 }}|{{ 123456789.0 }}|{{ -0.0 }}"),
    ("print_floats", "{{ 1/3 }} {{ 2/1 }} {{ 10/4 }} {{ 1e300*1e10 }} {{ 0.1+0.2 }} {{ 1.5e-7 }} {{ 12345678901234567890.0 }}"),
    ("print_containers", "{{ [1, 'a', none, true, 1.5] }} {{ (1,) }} {{ () }} {{ (1, 2) }} {{ {'a': [1, {'b': none}]} }}"),
    ("print_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', '\\x01', 'é', '\\u200d', '\\xa0'] }}"),
    ("print_dict_var", "{{ d }} {{ msgs[0] }}"),
    ("print_undefined", "[{{ missing }}][{{ d.missing }}][{{ msgs[9] }}][{{ 'abc'[10] }}]"),
    ("print_tuple_expr", "{{ 1, 2 }}"),
    ("print_namespace", "{% set ns = namespace(a=1, b='x') %}{{ ns }}"),
    ("print_macro", "{% macro m() %}{% endmacro %}{{ m }}"),
    # --- arithmetic ---
    ("arith_int", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}"),
    ("arith_float", "{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 2.0 ** 0.5 }} {{ 1 + 1.0 }} {{ 3 * 1.5 }}"),
    ("arith_bool", "{{ true + 1 }} {{ true * 3 }} {{ false - 1 }} {{ -true }}"),
    ("pow_left_assoc", "{{ 2 ** 3 ** 2 }} {{ -2 ** 2 }}"),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 * 3 ~ 4 }} {{ 1 ~ (2 + 3) }} {{ 2 * 3 ~ 4 * 5 }} {{ not 1 == 2 }} {{ 10 - 2 - 3 }}"),
    ("concat_tilde", "{{ 1 ~ 'a' ~ none ~ true ~ missing ~ [1] }}"),
    ("string_plus", "{{ 'a' + 'b' }}{{ 'ab' * 3 }}{{ 2 * 'x' }}{{ 'x' * 0 }}{{ 'x' * -1 }}"),
    ("list_plus", "{{ [1, 2] + [3] }} {{ [1] * 3 }} {{ (1,) + (2,) }}"),
    ("string_percent", "{{ '%s-%d-%.2f-%r|%5s|%-4d|%x|%05.1f|%%' % ('a', 3, 1.5, 'b', 'c', 7, 255, 2.25) }}"),
    ("string_percent_one", "{{ 'v=%s' % 5 }} {{ '%(a)s/%(b)s' % {'a': 1, 'b': 2} }} {{ '%s' % [1, 2] }}"),
    ("unary", "{{ -i }} {{ +i }} {{ - -i }} {{ -f }} {{ not empty }} {{ not not i }}"),
    # --- comparisons and logic ---
    ("compare", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'a' }} {{ none == none }}"),
    ("compare_chain", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1 == 1 }}"),
    ("in_ops", "{{ 'ell' in 'hello' }} {{ 2 in nums }} {{ 'a' in d }} {{ 'z' not in d }} {{ 'x' in missing }} {{ (1, 2) in [(1, 2)] }}"),
    ("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or none }} {{ missing or 'dflt' }} {{ 1 and 0 or 5 }}"),
    ("cond_expr", "{{ 'y' if t else 'n' }} {{ 'y' if zero else 'n' }} [{{ 'y' if zero }}] {{ 1 if 0 else 2 if 0 else 3 }}"),
    ("dict_eq", "{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ [1, [2]] == [1, [2]] }} {{ (1,) == [1] }}"),
    # --- attribute and item access ---
    ("getattr_getitem", "{{ msgs[1].role }} {{ msgs[1]['content'] }} {{ nested.x.y[1].z }} {{ nested['x']['y'][0] }} {{ msgs[-1].role }} {{ msgs.0.role }}"),
    ("dict_method_precedence", "{{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('q', 9) }} {{ d.get('q') }}"),
    ("subscript_method_fallback", "{{ (d['items'] is callable) }} {{ d['a'] }}"),
    ("slices", "{{ nums[1:3] }} {{ nums[:-1] }} {{ nums[::2] }} {{ nums[::-1] }} {{ nums[-2:] }} {{ nums[5:] }} {{ nums[:] }} {{ (1, 2, 3)[1:] }}"),
    ("string_slices", "{{ u[:3] }}|{{ u[-3:] }}|{{ u[::-1] }}|{{ 'abcdef'[1:5:2] }}|{{ u[0] }}|{{ u[-1] }}|{{ 'ab'[5:9] }}"),
    ("none_subscript", "[{{ n.x }}][{{ n[0] }}][{{ i.real }}]"),
    # --- statements ---
    ("if_elif_else", "{% for x in [0, 1, 2] %}{% if x == 0 %}zero{% elif x == 1 %}one{% else %}many{% endif %},{% endfor %}"),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
    ("for_prev_next", "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}"),
    ("for_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}"),
    ("for_changed", "{% for x in [1, 1, 2, 2, 1] %}{{ loop.changed(x) }} {% endfor %}"),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}{% for x in missing %}x{% else %}undef{% endfor %}"),
    ("for_filter", "{% for x in nums if x > 1 %}{{ x }}@{{ loop.index }}/{{ loop.length }} {% endfor %}"),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for (a, b) in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}"),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}"),
    ("for_scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }};{% endfor %}{{ x }}"),
    ("for_scope_iteration", "{% for x in [1, 2] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}"),
    ("nested_loop", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}/{{ loop.index }} {% endfor %}"),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
    ("recursive_loop", "{% for item in tree recursive %}<{{ item.name }}@{{ loop.depth }}{% if item.kids %}:{{ loop(item.kids) }}{% endif %}>{% endfor %}"),
    ("set_forms", "{% set a = 1 %}{% set b, c = 2, 3 %}{% set e = [a, b, c] %}{{ e }}{% set x %}blk {{ a }}{% endset %}[{{ x }}]{% set y | upper %}up{% endset %}{{ y }}"),
    ("namespace", "{% set ns = namespace(n=0, items=[]) %}{% for x in nums %}{% set ns.n = ns.n + x %}{% set ns.items = ns.items + [x] %}{% endfor %}{{ ns.n }} {{ ns.items }}"),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns['a'] }}"),
    ("macro_defaults", "{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(1, c='z') }} {{ m(a=5, b=6) }}"),
    ("macro_varargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}"),
    ("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}|{{ b }}|{{ b is defined }}]{% endmacro %}{{ m(1) }}"),
    ("macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(10) }}"),
    ("macro_scope", "{% set a = 1 %}{% macro m() %}{{ a }}{% endmacro %}{% set a = 2 %}{{ m() }}"),
    ("macro_default_refers", "{% macro m(a, b=a * 2) %}{{ b }}{% endmacro %}{{ m(4) }}"),
    ("call_block", "{% macro wrap(x) %}<{{ x }}:{{ caller() }}>{% endmacro %}{% call wrap(1) %}inner{% endcall %}"),
    ("call_block_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each([1, 2]) %}[{{ v }}]{% endcall %}"),
    ("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}{% filter trim|replace('a', 'o') %}  banana  {% endfilter %}"),
    ("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"),
    ("generation_tag", "a{% generation %}gen {{ i }}{% endgeneration %}b"),
    ("set_in_if_leaks", "{% if t %}{% set z = 3 %}{% endif %}{{ z }}"),
    # --- filters ---
    ("f_trim_strip", "[{{ s|trim }}][{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxaxx'|trim('x') }}][{{ 'abc'.strip('ac') }}][{{ '\\xa0 x\\u3000'|trim }}]"),
    ("f_length", "{{ nums|length }} {{ u|length }} {{ d|count }} {{ missing|length }} {{ ''|length }}"),
    ("f_tojson", "{{ msgs|tojson }} {{ u|tojson }} {{ [1.0, 1e-5, none, true, 'a\"b\\\\c\\n\\x01'] | tojson }}"),
    ("f_tojson_indent", "{{ nested|tojson(indent=2) }}\n{{ {'a': [], 'b': {}, 'c': [1]}|tojson(indent=4) }}\n{{ d|tojson(sort_keys=true) }}"),
    ("f_tojson_str", "{{ 'plain'|tojson }} {{ 3|tojson }} {{ (1, 2)|tojson }}"),
    ("f_default", "{{ missing|default('x') }} {{ n|default('x') }} {{ empty|default('x') }} {{ empty|default('x', true) }} {{ missing|d }}|{{ zero|d('y', boolean=true) }}"),
    ("f_join", "{{ words|join(', ') }} {{ nums|join }} {{ people|join('/', attribute='name') }} {{ 'abc'|join('-') }}"),
    ("f_case", "{{ u|upper }} {{ u|lower }} {{ 'hello wORLD-foo(bar'|title }} {{ 'hELLO world'|capitalize }} {{ u|capitalize }}"),
    ("f_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }}"),
    ("f_first_last", "{{ nums|first }} {{ nums|last }} {{ 'xyz'|first }} {{ 'xyz'|last }} [{{ []|first }}]"),
    ("f_list", "{{ 'ab'|list }} {{ d|list }} {{ (1, 2)|list }}"),
    ("f_map", "{{ people|map(attribute='name')|list }} {{ words|map('upper')|list }} {{ people|map(attribute='nope', default='?')|list }} {{ nums|map('string')|join(',') }}"),
    ("f_select_reject", "{{ nums|select('odd')|list }} {{ nums|reject('odd')|list }} {{ nums|select('gt', 2)|list }} {{ [0, 1, '', 'a', none]|select|list }}"),
    ("f_selectattr", "{{ people|selectattr('age', 'equalto', 31)|map(attribute='name')|list }} {{ people|rejectattr('team', 'eq', 'b')|map(attribute='name')|join }} {{ msgs|selectattr('role', 'in', ['user', 'system'])|list|length }}"),
    ("f_unique", "{{ words|unique|list }} {{ words|unique(case_sensitive=true)|list }} {{ people|unique(attribute='age')|map(attribute='name')|list }}"),
    ("f_sort", "{{ nums|sort }} {{ nums|sort(reverse=true) }} {{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ people|sort(attribute='age')|map(attribute='name')|list }} {{ people|sort(attribute='team,name')|map(attribute='name')|list }}"),
    ("f_dictsort", "{{ d|dictsort }} {{ d|dictsort(case_sensitive=true) }} {{ d|dictsort(by='value', reverse=true) }}"),
    ("f_items", "{{ d|items|list }}{% for k, v in msgs[0]|items %}{{ k }}{% endfor %}{{ missing|items|list }}"),
    ("f_string_int_float", "{{ 5|string + 'x' }} {{ '42'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '0x1f'|int(base=16) }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ 3.9|int }} {{ '2.5'|float }} {{ 'a'|float }} {{ 4|float }} {{ none|int }}"),
    ("f_abs_round", "{{ -3|abs }} {{ (-2.5)|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 1234|round(-2) }} {{ 7|round }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ 1.25|round(1) }}"),
    ("f_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(first=true, blank=true) }}|{{ 'x\\ny'|indent('> ') }}"),
    ("f_escape", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ msgs[2].content|striptags }} {{ 'a <!-- c --> b &amp; c'|striptags }}"),
    ("f_wordcount_truncate", "{{ 'Hello, big wörld_x 42!'|wordcount }} {{ 'one two three four five six'|truncate(12) }} {{ 'one two three four five six'|truncate(12, true) }} {{ 'short'|truncate(10) }} {{ 'abcdefghijklmnop'|truncate(9, end='~', leeway=0) }}"),
    ("f_batch_slice", "{{ range(7)|batch(3)|list }} {{ range(7)|batch(3, 'x')|list }} {{ range(7)|slice(3)|list }} {{ range(5)|slice(3, 0)|list }}"),
    ("f_sum_min_max", "{{ nums|sum }} {{ people|sum(attribute='age') }} {{ [1.5, 2]|sum(start=10) }} {{ nums|min }} {{ nums|max }} {{ words|min }} {{ words|max }} {{ people|max(attribute='age')|attr('name') }} [{{ []|max }}]"),
    ("f_reverse", "{{ 'abc'|reverse }} {{ nums|reverse|list }} {{ u|reverse }}"),
    ("f_center_format", "[{{ 'ab'|center(7) }}][{{ '%s=%d'|format('x', 3) }}][{{ '%(k)s'|format(k='v') }}]"),
    ("f_groupby", "{% for g in people|groupby('team') %}{{ g.grouper }}:{{ g.list|map(attribute='name')|join(',') }};{% endfor %}{% for k, items in people|groupby('age') %}{{ k }}={{ items|length }} {% endfor %}"),
    ("f_misc", "{{ 1234567|filesizeformat }} {{ 1|filesizeformat }} {{ 2048|filesizeformat(true) }} {{ 'a b/c?d'|urlencode }} {{ {'q': 'a b', 'n': 1}|urlencode }} {{ d|pprint }} {{ msgs[0]|attr('role') }}"),
    ("f_safe_chain", "{{ 3|safe }}{{ (' x '|trim ~ 'y')|upper|replace('X', 'z') }}"),
    # --- tests ---
    ("t_defined", "{{ missing is defined }} {{ n is defined }} {{ missing is undefined }} {{ d.a is defined }} {{ d.q is not defined }}"),
    ("t_types", "{{ n is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ d is mapping }} {{ msgs is mapping }}"),
    ("t_iterable", "{{ 'a' is iterable }} {{ msgs is iterable }} {{ d is iterable }} {{ 1 is iterable }} {{ missing is iterable }} {{ n is iterable }} {{ 'a' is sequence }} {{ d is sequence }} {{ 1 is sequence }}"),
    ("t_numbers", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 3.0 is odd }}"),
    ("t_compare", "{{ 3 is eq 3 }} {{ 3 is equalto 4 }} {{ 3 is ne 4 }} {{ 3 is lt 4 }} {{ 3 is gt 4 }} {{ 3 is ge 3 }} {{ 3 is le 2 }} {{ 3 is greaterthan 1 }} {{ 3 is lessthan 1 }} {{ 2 is in [1, 2] }}"),
    ("t_bools", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ none is sameas none }} {{ msgs is sameas msgs }} {{ true is sameas 1 }}"),
    ("t_case", "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '1' is upper }} {{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }}"),
    ("t_callable", "{{ range is callable }} {{ d.items is callable }} {{ 'x' is callable }} {{ missing is callable }}"),
    # --- methods ---
    ("m_split", "{{ 'a,b,,c'.split(',') }} {{ '  a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ' a b c '.split(None, 1) }} {{ ' a b c '.rsplit(None, 1) }} {{ ''.split() }} {{ ''.split(',') }}"),
    ("m_splitlines", "{{ 'a\\nb\\r\\nc\\rd\\n'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }} {{ 'x\\u2028y'.splitlines() }}"),
    ("m_starts_ends", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'hello'.startswith('l', 2) }} {{ 'hello'.endswith('l', 0, 4) }}"),
    ("m_find_count", "{{ 'héllo'.find('l') }} {{ 'héllo'.rfind('l') }} {{ 'abc'.find('z') }} {{ 'banana'.count('an') }} {{ 'banana'.index('n') }} {{ 'aaa'.count('') }}"),
    ("m_case", "{{ 'hello world'.title() }} {{ \"they're bill's\".title() }} {{ 'HeLLo'.swapcase() }} {{ 'abc'.upper() }} {{ 'ÀB'.lower() }} {{ 'hello'.capitalize() }} {{ u.title() }}"),
    ("m_replace_join", "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ ', '.join(['x', 'y']) }} {{ ''.join(words) }}"),
    ("m_format", "{{ '{} and {}'.format('a', 'b') }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} {{ '{:>5}|{:<4}|{:^6}|{:.2f}|{:05d}|{:,}|{:x}'.format('ab', 'c', 'mid', 3.14159, 42, 1234567, 255) }} {{ '{{}}{}'.format(1) }} {{ '{!r}'.format('q') }}"),
    ("m_pad", "[{{ 'ab'.center(6, '*') }}][{{ 'ab'.ljust(4) }}][{{ 'ab'.rjust(4, '.') }}][{{ '42'.zfill(5) }}][{{ '-42'.zfill(5) }}]"),
    ("m_predicates", "{{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'ab1'.isalnum() }} {{ '  '.isspace() }} {{ 'Title Case'.istitle() }} {{ 'abc'.islower() }} {{ 'ABC'.isupper() }} {{ ''.isdigit() }} {{ 'é'.isascii() }} {{ 'ﬁ'.isalpha() }}"),
    ("m_prefix_partition", "{{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.txt'.removesuffix('.txt') }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'abc'.partition('z') }}"),
    ("m_list_tuple", "{{ nums.index(2) }} {{ [1, 1, 2].count(1) }} {{ (1, 2, 1).count(1) }}"),
    ("m_think_split", "{{ '<think>x</think>\\n\\nanswer'.split('</think>')[-1].strip() }}"),
    # --- globals ---
    ("g_range", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}"),
    ("g_dict", "{{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ dict({'k': 'v'}, z=0) }}"),
    ("g_joiner", "{% set j = joiner(' | ') %}{% for x in 'abc' %}{{ j() }}{{ x }}{% endfor %}"),
    ("g_strftime", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j') }}"),
    ("percent_undefined", "{{ '[%s]' % missing }}"),
    ("urlencode_scalar", "{{ 2.5|urlencode }} {{ true|urlencode }}"),
    # --- real-template idioms ---
    ("idiom_system_first", "{% if msgs[0]['role'] == 'system' %}{% set sys = msgs[0]['content'] %}{% set rest = msgs[1:] %}{% else %}{% set sys = '' %}{% set rest = msgs %}{% endif %}{{ sys }}|{% for m in rest %}{{ m.role }}:{{ m.content|trim }};{% endfor %}"),
    ("idiom_alternation", "{% for m in msgs[1:] %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('alternate!') }}{% endif %}{{ m.role }}{% endfor %}"),
    ("idiom_last_index", "{% set ns = namespace(last=-1) %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{{ ns.last }}"),
    ("idiom_content_string_or_list", "{% set c = [{'type': 'text', 'text': 'hi'}, {'type': 'image'}] %}{% if c is string %}{{ c }}{% else %}{% for p in c %}{% if p.type == 'text' %}{{ p.text }}{% else %}<{{ p.type }}>{% endif %}{% endfor %}{% endif %}"),
]

# Cases that must fail (the message need not match).
ERRORS = [
    ("e_raise", "{{ raise_exception('custom failure text') }}"),
    ("e_undefined_attr_chain", "{{ d.missing.deeper }}"),
    ("e_undefined_root_attr", "{{ missing.attr }}"),
    ("e_undefined_call", "{{ missing() }}"),
    ("e_undefined_arith", "{{ missing + 1 }}"),
    ("e_type_add", "{{ 'a' + 1 }}"),
    ("e_zero_div", "{{ 1 / 0 }}"),
    ("e_zero_floordiv", "{{ 1 // 0 }}"),
    ("e_zero_mod", "{{ 1 % 0 }}"),
    ("e_iterate_none", "{% for x in n %}{% endfor %}"),
    ("e_iterate_int", "{% for x in 5 %}{% endfor %}"),
    ("e_unknown_filter", "{{ 1|nosuchfilter }}"),
    ("e_unknown_test", "{{ 1 is nosuchtest }}"),
    ("e_unknown_filter_in_if", "{% if true %}{{ 1|nosuchfilter }}{% endif %}"),
    ("e_unknown_tag", "{% frobnicate %}"),
    ("e_unclosed_if", "{% if true %}x"),
    ("e_unclosed_var", "{{ 1 + "),
    ("e_unclosed_string", "{{ 'abc }}"),
    ("e_unclosed_comment", "{# comment"),
    ("e_bad_char", "{{ 1 $ 2 }}"),
    ("e_stray_endfor", "{% endfor %}"),
    ("e_include", "{% include 'other.jinja' %}"),
    ("e_import", "{% import 'x' as y %}"),
    ("e_extends", "{% extends 'base' %}"),
    ("e_list_append", "{% set l = [1] %}{{ l.append(2) }}"),
    ("e_dict_update", "{% set x = {} %}{{ x.update({'a': 1}) }}"),
    ("e_macro_too_many", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
    ("e_macro_bad_kw", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}"),
    ("e_set_attr_non_ns", "{% set x = {} %}{% set x.a = 1 %}"),
    ("e_unpack_count", "{% for a, b in [(1, 2, 3)] %}{% endfor %}"),
    ("e_compare_types", "{{ 1 < 'a' }}"),
    ("e_slice_step_zero", "{{ [1, 2][::0] }}"),
    ("e_tojson_undefined", "{{ missing|tojson }}"),
    ("e_range_too_big", "{{ range(1000000)|length }}"),
    ("e_call_non_callable", "{{ 'x'() }}"),
    ("e_in_non_container", "{{ 1 in 5 }}"),
    ("e_str_in_needs_str", "{{ 1 in 'abc' }}"),
    ("e_loop_not_recursive", "{% for x in [1] %}{{ loop([]) }}{% endfor %}"),
    ("e_break_outside_loop", "{% break %}"),
    ("e_dictsort_non_mapping", "{{ [1]|dictsort }}"),
    ("e_items_non_mapping", "{{ [1]|items|list }}"),
    ("e_percent_args", "{{ '%s %s' % ('a',) }}"),
    ("e_format_index", "{{ '{1}'.format('a') }}"),
    ("e_slice_none", "{{ n[1:] }}"),
    ("e_slice_int", "{{ i[::2] }}"),
    ("e_slice_dict", "{{ d[0:1] }}"),
    ("e_slice_bad_index", "{{ nums['a':] }}"),
    ("e_test_extra_argument", "{{ 'x' is upper('y') }}"),
]


def render(env, src):
    try:
        return {"expected": env.from_string(src).render(**V)}
    except Exception as e:  # any failure: the engine must fail too
        return {"error": "%s: %s" % (type(e).__name__, e)}


def build():
    env = environment()
    cases, wrong = [], []
    for name, src in CASES:
        r = render(env, src)
        if "error" in r:
            wrong.append("case %s was meant to render but failed: %s" % (name, r["error"]))
        cases.append({"name": name, "template": src, **r})
    for name, src in ERRORS:
        r = render(env, src)
        if "error" not in r:
            wrong.append("case %s was meant to fail but rendered %r" % (name, r["expected"]))
        cases.append({"name": name, "template": src, **r})
    if wrong:
        raise SystemExit("\n".join(wrong))
    return {
        "note": "Generated by make_semantics_cases.py with jinja2 %s; do not edit." % jinja2.__version__,
        "variables": V,
        "cases": cases,
    }


def main():
    doc = build()
    text = json.dumps(doc, ensure_ascii=False, indent=1) + "\n"
    if "--check" in sys.argv:
        with open(OUT, encoding="utf-8") as f:
            if f.read() != text:
                print("data/semantics.json differs from what jinja2 renders")
                return 1
        print("data/semantics.json matches jinja2")
        return 0
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote %s (%d cases)" % (OUT, len(doc["cases"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
