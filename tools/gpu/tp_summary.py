#!/usr/bin/env python3
"""The table of tools/gpu/tp_bench.sh: batch-1 TPOT of each tensor-parallel size against the
roofline of the bytes ONE GPU must read a step (its 1/N of every linear weight and of the lm_head,
bf16) at the copy bandwidth cuda_roofline measured in the same call, and batch-64 throughput.
Usage: tp_summary.py WORK_DIR   (TP_COPY_TBS=4.23: the copy bandwidth when the call did not measure it)"""
import glob
import json
import os
import re
import statistics
import sys

from copy_roofline import copy_tbs

work = sys.argv[1]
configs = {"8b": "bench/configs/Llama-3.1-8B-Instruct/config.json",
           "70b": "bench/configs/Llama-3.1-70B-Instruct/config.json"}  # v2lite (MoE): no roofline here


def weight_bytes(path):
    c = json.load(open(path))
    h, inter, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hq, hk = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // hq
    return 2 * (layers * (h * (hq + 2 * hk) * d + hq * d * h + 3 * inter * h) + vocab * h)


roof = copy_tbs(work)
if roof:
    print(f"copy roofline (GPU 0): {roof} TB/s (cuda_roofline, this call)")
elif os.environ.get("TP_COPY_TBS"):  # a figure from another call on the same kind of machine
    roof = float(os.environ["TP_COPY_TBS"])
    print(f"copy roofline: {roof} TB/s (TP_COPY_TBS: given, not measured in this call)")
else:
    print("copy roofline: not measured")

runs = {}
for path in sorted(glob.glob(os.path.join(work, "*.json"))):
    m = re.match(r"(b1|b64)_(8b|70b|v2lite)_(tp\d+(?:_eager|_nccl|_eagle3_k\d+)?)(?:_r(\d+))?\.json", os.path.basename(path))
    if m:
        runs.setdefault((m.group(1), m.group(2), m.group(3)), []).append((int(m.group(4) or 1), json.load(open(path))))

print("\nbatch 1, input 128, output 128, 20 requests a run: TPOT ms p10 / median / p90 (runs in call order)")
medians = {}
for (kind, model, variant), rs in sorted(runs.items()):
    if kind != "b1":
        continue
    n = int(re.match(r"tp(\d+)", variant).group(1))
    per_gpu = weight_bytes(configs[model]) / n if model in configs else None
    for rep, j in sorted(rs):
        t = j["tpot_ms"]
        medians.setdefault((model, variant), []).append(t["median"])
        r = per_gpu / (roof * 1e12) * 1e3 if roof and per_gpu else None
        extra = f"   per-GPU roofline {r:.3f} ms -> {100 * r / t['median']:.0f}%" if r else ""
        print(f"  {model:6s} {variant:14s} r{rep}: {t['p10']:.3f} / {t['median']:.3f} / {t['p90']:.3f}{extra}")
for model in ("8b", "70b", "v2lite"):
    base = medians.get((model, "tp1"))
    for (m, variant), v in sorted(medians.items()):
        if m == model and base and variant != "tp1":
            print(f"  {model}: {variant} / tp1 TPOT {statistics.median(v) / statistics.median(base):.3f} "
                  f"(medians {min(v):.3f}-{max(v):.3f} vs {min(base):.3f}-{max(base):.3f} ms)")

# Speculation with a dummy head: nothing is accepted, so each step emits one token and the TPOT is
# the cost of a speculative step (k + 1 verified rows, the head's catch-up and k draft steps); at
# acceptance length tau (tokens per step) the TPOT would be step / tau.
for (model, variant), v in sorted(medians.items()):
    m = re.match(r"tp(\d+)_eagle3_k(\d+)", variant)
    plain = medians.get((model, f"tp{m.group(1)}")) if m else None
    if m and plain:
        step, base = statistics.median(v), statistics.median(plain)
        for tau in (3.08, 3.5):
            print(f"  {model} tp{m.group(1)} + EAGLE-3 k={m.group(2)}: step {step:.3f} ms -> predicted TPOT at acceptance "
                  f"length {tau}: {step / tau:.3f} ms ({base / (step / tau):.2f}x of plain {base:.3f} ms)")

for (kind, model, variant), rs in sorted(runs.items()):
    if kind == "b64":
        for rep, j in rs:
            print(f"\nbatch 64 {model} {variant}: {j.get('output_tokens_per_second', 0):,.0f} output tok/s, "
                  f"TPOT median {j['tpot_ms']['median']:.3f} ms")
for path in sorted(glob.glob(os.path.join(work, "*.log"))):
    m = re.search(r"Model loading took ([\d.]+) seconds", open(path, errors="replace").read())
    if m and "70b" in os.path.basename(path):
        print(f"{os.path.basename(path)[:-4]}: model loading took {m.group(1)} s")
# What the rehearsals of new step sizes cost each run (model/tensor_parallel_rehearsals.h).
for path in sorted(glob.glob(os.path.join(work, "*.log"))):
    m = re.search(r"Tensor parallel: (\d+) of (\d+) forwards ran first as a rehearsal.*?(\d+) of them at the longest"
                  r"(?: lengths; ([\d.]+) s in all)?", open(path, errors="replace").read())
    if m:
        took = f", {m.group(4)} s" if m.group(4) else ""
        print(f"{os.path.basename(path)[:-4]}: {m.group(1)} of {m.group(2)} forwards rehearsed "
              f"({m.group(3)} at the longest lengths{took})")
