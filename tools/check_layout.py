#!/usr/bin/env python3
"""The source layout's rules, checked (ctest runs this as `layout`):
  1. folders of src/ are layers: no folder includes, directly or through others, a folder that
     includes it back (src/<a>/<b>/ counts as part of src/<a>/);
  2. no folder of src/ is named like a test folder (spec, specs, test, tests, testing);
  3. tests/unit mirrors src/: every folder under tests/unit/ has a folder of the same path in src/.
Prints each violation and exits 1 if any."""
import os, re, sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
src = os.path.join(root, 'src')
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
errors = []

def layer_of(rel):  # 'engine/x.h' -> 'engine'
    return rel.split('/')[0]

graph = {}
for dirpath, dirnames, filenames in os.walk(src):
    rel_dir = os.path.relpath(dirpath, src)
    for d in dirnames:
        if d.lower() in ('spec', 'specs', 'test', 'tests', 'testing', '__tests__'):
            errors.append(f'src/{os.path.normpath(os.path.join(rel_dir, d))}: named like a test folder')
    for f in filenames:
        if not f.endswith(('.h', '.cc', '.cu', '.cuh')):
            continue
        path = os.path.join(dirpath, f)
        me = layer_of(os.path.relpath(path, src))
        graph.setdefault(me, {})
        for inc in include.findall(open(path, encoding='utf-8', errors='replace').read()):
            if '/' not in inc or not os.path.exists(os.path.join(src, inc)):
                continue  # same-folder or system/third-party header
            other = layer_of(inc)
            if other != me:
                graph[me].setdefault(other, os.path.relpath(path, root) + ' -> ' + inc)

def reaches(a, b, seen):
    for n in graph.get(a, {}):
        if n == b:
            return [n]
        if n not in seen:
            seen.add(n)
            path = reaches(n, b, seen)
            if path:
                return [n] + path
    return None

for a in sorted(graph):
    for b in sorted(graph[a]):
        back = reaches(b, a, set())
        if back:
            chain = ' -> '.join([a, b] + back)
            errors.append(f'cycle {chain}: {graph[a][b]}')

unit = os.path.join(root, 'tests', 'unit')
for dirpath, dirnames, _ in os.walk(unit):
    for d in dirnames:
        rel = os.path.relpath(os.path.join(dirpath, d), unit)
        if not os.path.isdir(os.path.join(src, rel)):
            errors.append(f'tests/unit/{rel}: no src/{rel} to mirror')

order = []
remaining = dict(graph)
while remaining:
    ready = sorted(a for a in remaining if all(b in order or b not in graph for b in remaining[a]))
    if not ready:
        break
    order += ready
    for a in ready:
        del remaining[a]
for e in errors:
    print('layout:', e)
print('layout: layers from the bottom:', ' < '.join(order) if not remaining else '(cyclic)')
print(f'layout: {len(errors)} violations')
sys.exit(1 if errors else 0)
