#!/usr/bin/env python3
"""The table of tools/gpu/ab_decode.sh: batch-1 TPOT of the candidate build against the baseline,
each against the roofline of the bytes a step must read at the copy bandwidth cuda_roofline
measured in the same call (every linear weight once, bf16 or FP8, the lm_head in bf16; the KV
cache read is < 1% of it at these lengths and is left out).
Usage: decode_summary.py WORK_DIR LLAMA_CONFIG QWEN_CONFIG"""
import glob
import json
import os
import re
import statistics
import sys

from copy_roofline import copy_tbs

work, llama_path, qwen_path = sys.argv[1:4]


def weight_bytes(path, per_weight):
    c = json.load(open(path))
    h, inter, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hq, hk = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // hq
    layer_params = layers * (h * (hq + 2 * hk) * d + hq * d * h + 2 * inter * h + h * inter)
    return per_weight * layer_params + 2 * vocab * h  # lm_head (tied or not) read once in bf16


bytes_of = {"llama_bf16": weight_bytes(llama_path, 2), "llama_fp8": weight_bytes(llama_path, 1),
            "qwen": weight_bytes(qwen_path, 2)}
roof = copy_tbs(work)
print(f"copy roofline: {roof} TB/s (cuda_roofline, this call)" if roof else "copy roofline: not measured")

runs, builds = {}, ["baseline", "candidate"]
for path in sorted(glob.glob(os.path.join(work, "*.r*.json"))):
    m = re.match(r"(\w+)\.([\w-]+)\.r(\d+)\.json", os.path.basename(path))
    if m:
        runs.setdefault((m.group(1), m.group(2)), []).append((int(m.group(3)), json.load(open(path))))
        if m.group(2) not in builds:
            builds.append(m.group(2))  # variants of the candidate (AB_VARIANTS)

print("\nbatch 1, input 128, output 128, 20 iterations a run: TPOT ms p10 / median / p90 (runs in call order)")
for name in ("llama_bf16", "llama_fp8", "qwen"):
    medians = {}
    for build in builds:
        for rep, j in sorted(runs.get((name, build), [])):
            t = j["tpot_ms"]
            medians.setdefault(build, []).append(t["median"])
            r = bytes_of[name] / (roof * 1e12) * 1e3 if roof else None
            extra = f"   roofline {r:.3f} ms -> {100 * r / t['median']:.0f}%" if r else ""
            print(f"  {name:10s} {build:9s} r{rep}: {t['p10']:.3f} / {t['median']:.3f} / {t['p90']:.3f}{extra}")
    if "baseline" in medians:
        b = statistics.median(medians["baseline"])
        for build in builds[1:]:
            if build in medians:
                c = statistics.median(medians[build])
                print(f"  {name}: {build} / baseline TPOT {c / b:.3f} (medians {min(medians[build]):.3f}-"
                      f"{max(medians[build]):.3f} vs {min(medians['baseline']):.3f}-{max(medians['baseline']):.3f} ms)")
    for build in builds[2:]:
        if build in medians and "candidate" in medians:
            c, v = statistics.median(medians["candidate"]), statistics.median(medians[build])
            print(f"  {name}: {build} / candidate TPOT {v / c:.3f}")

# Batch 64 (input 128, output 256): the weights once a step plus the cache of 64 sequences at their
# mean length over the run (128 + 256 / 2 keys), K and V of every layer in bf16.
c = json.load(open(llama_path))
kv_per_token = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * (c.get("head_dim") or
                                                                         c["hidden_size"] // c["num_attention_heads"]) * 2
b64_bytes = bytes_of["llama_bf16"] + 64 * (128 + 256 / 2) * kv_per_token
for build in builds:
    for rep, j in sorted(runs.get(("llamab64_bf16", build), [])):
        t = j["tpot_ms"]
        r = b64_bytes / (roof * 1e12) * 1e3 if roof else None
        extra = f"; roofline {r:.3f} ms -> {100 * r / t['median']:.0f}%" if r else ""
        print(f"\nLlama-3.1-8B bf16 batch 64 ({build}) r{rep}: TPOT median {t['median']:.3f} ms = "
              f"{64 / t['median'] * 1e3:,.0f} output tok/s{extra}")
