"""Summary of tools/gpu/adaptive_bench.sh: per concurrency, temperature and method, the adaptive
depth against each pinned depth and no speculation. Concurrency 1: TPOT ms (p10 / median / p90 of
the requests of each run); larger: output tok/s. Each repetition's ratio is taken against no
speculation of the same repetition (same target, synchronous like the speculative runs); "vs best
pinned" against the best pinned run of that repetition; "vs none with async scheduling" against no
speculation as its default runs it on one GPU."""
import glob
import json
import os
import re
import statistics
import sys

work = sys.argv[1]
runs = {}  # (c, temp, method, config) -> {rep: json}
for path in sorted(glob.glob(os.path.join(work, "c*_t*_*_r*.json"))):
    m = re.match(r"c(\d+)_t(\d+)_(tiny|moe|draft|eagle3|mtp)_(\w+?)_r(\d+)\.json", os.path.basename(path))
    if m:
        runs.setdefault((int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)), {})[int(m.group(5))] = json.load(open(path))


def speed(j, c):  # higher is better: 1 / TPOT at concurrency 1, tok/s otherwise
    return 1.0 / j["tpot_ms"]["median"] if c == 1 else j["output_tokens_per_second"]


def shown(j, c):
    if c == 1:
        t = j["tpot_ms"]
        return f"{t['p10']:.3f}/{t['median']:.3f}/{t['p90']:.3f}"
    return f"{j['output_tokens_per_second']:,.0f}"


for c, temp in sorted({(k[0], k[1]) for k in runs}):
    unit = "TPOT ms p10/median/p90" if c == 1 else "output tok/s"
    print(f"\n== concurrency {c}, temperature {temp}: {unit}; x = speed vs no speculation of the same repetition")
    for method, target in (("draft", "tiny"), ("eagle3", "tiny"), ("mtp", "moe")):
        base = runs.get((c, temp, target, "nospec"), {})
        configs = sorted(k[3] for k in runs if k[:3] == (c, temp, method))
        if not configs or not base:
            continue
        print(f"{method} (no speculation: {', '.join(shown(base[r], c) for r in sorted(base))})")
        for cfg in configs:
            reps = runs[(c, temp, method, cfg)]
            ratios = [speed(reps[r], c) / speed(base[r], c) for r in sorted(reps) if r in base]
            depth = [(reps[r].get("spec_decoding") or {}).get("mean_depth", 0.0) for r in sorted(reps)]
            alen = [(reps[r].get("spec_decoding") or {}).get("mean_acceptance_length", 0.0) for r in sorted(reps)]
            line = (f"  {cfg:14} {', '.join(shown(reps[r], c) for r in sorted(reps))} | "
                    f"x {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}) | "
                    f"depth {', '.join(f'{d:.2f}' for d in depth)} | acceptance length {', '.join(f'{a:.2f}' for a in alen)}")
            if "adaptive" in cfg:
                best = []
                for r in sorted(reps):
                    pinned = [speed(runs[(c, temp, method, p)][r], c) for p in configs
                              if "pinned" in p and r in runs[(c, temp, method, p)]]
                    if pinned:
                        best.append(speed(reps[r], c) / max(pinned + [speed(base[r], c)] if r in base else pinned))
                if best:
                    line += f" | vs best of pinned and none {', '.join(f'{x:.2f}' for x in best)}"
                base_async = runs.get((c, temp, target, "nospecasync"), {})
                if base_async:
                    line += " | vs none with async scheduling " + ", ".join(
                        f"{speed(reps[r], c) / speed(base_async[r], c):.2f}" for r in sorted(reps) if r in base_async)
            print(line)

profiles = sorted(glob.glob(os.path.join(work, "profile_*.log")))
for path in profiles:
    print(f"\n== {os.path.basename(path)} (SPECULA_PROFILE=1)")
    text = open(path).read()
    start = text.find("== SPECULA_PROFILE: wall time per phase")
    print("\n".join(text[start:].splitlines()[:40]) if start >= 0 else "(no phase table)")

for path in sorted(glob.glob(os.path.join(work, "trace_*.log"))):
    print(f"\n== {os.path.basename(path)} (SPECULA_LOGGING_LEVEL=DEBUG)")
    text = open(path).read()
    depths = {}
    for m in re.finditer(r"adaptive depth: \d+ decoding, depth (\d+)( \(\w+ probe\))?", text):
        key = m.group(1) + (m.group(2) or "")
        depths[key] = depths.get(key, 0) + 1
    print("steps per depth: " + ", ".join(f"{k}: {v}" for k, v in sorted(depths.items())))
    start = text.find("SPECULA_PROFILE: adaptive depth")
    if start >= 0:
        print("\n".join(text[start:].splitlines()[:8]))
