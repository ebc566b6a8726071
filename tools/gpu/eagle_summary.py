"""Summary of tools/gpu/eagle_bench.sh: embedded TPOT per configuration (median over repetitions,
every repetition shown, ratios against no speculation of the same repetition) and, for the dummy
real-shape runs, the step time and the TPOT it predicts at published acceptance lengths."""
import glob
import json
import os
import re
import statistics
import sys

work = sys.argv[1]


def load(name):
    path = os.path.join(work, name + ".json")
    return json.load(open(path)) if os.path.exists(path) else None


runs = {}
for path in sorted(glob.glob(os.path.join(work, "emb_*.json"))):
    m = re.match(r"emb_t(\d+)_(\w+?)_r(\d+)\.json", os.path.basename(path))
    if not m:
        continue
    j = json.load(open(path))
    s = j.get("spec_decoding") or {}
    runs.setdefault((int(m.group(1)), m.group(2)), {})[int(m.group(3))] = (
        j["tpot_ms"]["median"], j["tpot_ms"].get("p90", 0.0), s.get("mean_acceptance_length"), s.get("mean_depth"))
if runs:
    print("== embedded, concurrency 1, 20 requests a run: TPOT ms (median over requests) per repetition")
    print("temp | config | median of reps | reps | x vs nospec per rep | acceptance length | depth")
    for (temp, cfg), reps in sorted(runs.items()):
        base = runs.get((temp, "nospec"), {})
        tp = [reps[r][0] for r in sorted(reps)]
        ratios = [base[r][0] / reps[r][0] for r in sorted(reps) if r in base]
        lens = [reps[r][2] for r in sorted(reps) if reps[r][2] is not None]
        depths = [reps[r][3] for r in sorted(reps) if reps[r][3] is not None]
        print(f"{temp} | {cfg} | {statistics.median(tp):.4f} | {', '.join(f'{v:.4f}' for v in tp)} | "
              f"{', '.join(f'{x:.2f}x' for x in ratios)} | "
              f"{', '.join(f'{x:.2f}' for x in lens) or '-'} | {', '.join(f'{x:.2f}' for x in depths) or '-'}")


def phases(name):
    out = {}
    log = os.path.join(work, name + ".log")
    if not os.path.exists(log):
        return out
    for line in open(log):
        m = re.match(r"^((?:runner|draft|engine)\.[^\s].*?)\s{2,}(\d+)\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            out[m.group(1)] = (int(m.group(2)), float(m.group(4)))
    return out


print("\n== real shapes, dummy weights, batch 1 (SPECULA_PROFILE=1: synchronous phases)")
for plain, specs in (("real_llama_plain", ["real_llama_eagle3_k3", "real_llama_eagle3_k5"]),
                     ("real_qwen8b_plain", ["real_qwen8b_draft06_k3"])):
    p = load(plain)
    if not p:
        continue
    print(f"{plain}: TPOT {p['tpot_ms']['median']:.3f} ms")
    for name in specs:
        j = load(name)
        if not j:
            continue
        s = j.get("spec_decoding") or {}
        tau = s.get("mean_acceptance_length") or 1.0
        step = j["tpot_ms"]["median"] * tau
        print(f"{name}: TPOT {j['tpot_ms']['median']:.3f} ms at acceptance length {tau:.2f} -> step {step:.3f} ms")
        prof = phases(name + "_profile")
        if prof:
            print("   phases (synchronised; mean us per call): " + ", ".join(f"{k} {v[1]:.0f}" for k, v in prof.items()))
        for target_tau in (3.08, 3.5):
            print(f"   predicted TPOT at acceptance length {target_tau}: step / tau = {step / target_tau:.3f} ms "
                  f"({p['tpot_ms']['median'] / (step / target_tau):.2f}x of plain {p['tpot_ms']['median']:.3f} ms)")
