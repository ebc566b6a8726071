#!/usr/bin/env python3
"""The table of tools/gpu/fp8_bench.sh: Llama-3.1-8B bf16 vs FP8 weights against the roofline of
the bytes each step must read, at the copy bandwidth cuda_roofline measured in the same call.

Bytes per decode step: the decoder layers' linear weights (2 bytes each in bf16, 1 in FP8), the
lm_head (bf16 in both), and at batch 64 the KV cache read by attention (context: the prompt plus
half the output on average). Usage: fp8_summary.py WORK_DIR CONFIG_JSON"""
import glob
import json
import os
import statistics
import sys

from copy_roofline import copy_tbs

work, config_path = sys.argv[1], sys.argv[2]
c = json.load(open(config_path))
h, inter, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
hq, hk = c["num_attention_heads"], c["num_key_value_heads"]
d = c.get("head_dim", h // hq)
layer_params = layers * (h * (hq + 2 * hk) * d + hq * d * h + 2 * inter * h + h * inter)
head_bytes = 2 * vocab * h
weight_bytes = {"bf16": 2 * layer_params + head_bytes, "fp8": layer_params + head_bytes}

roof = copy_tbs(work)
print(f"copy roofline: {roof} TB/s (cuda_roofline, this call)" if roof else "copy roofline: not measured")


def load(name):
    p = os.path.join(work, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None


def roofline_ms(q, kv_bytes=0.0):
    return (weight_bytes[q] + kv_bytes) / (roof * 1e12) * 1e3 if roof else None


print("\nbatch 1, input 128, output 128, 20 iterations a run: TPOT ms p10 / median / p90")
medians = {"bf16": [], "fp8": []}
for path in sorted(glob.glob(os.path.join(work, "b1_*_r*.json"))):
    name = os.path.basename(path)[:-5]
    q = name.split("_")[1]
    j = json.load(open(path))
    t = j["tpot_ms"]
    medians[q].append(t["median"])
    r = roofline_ms(q)
    extra = f"  roofline {r:.3f} ms -> {100 * r / t['median']:.0f}% of it" if r else ""
    print(f"  {name:14s} {t['p10']:.3f} / {t['median']:.3f} / {t['p90']:.3f}{extra}")
for q in ("bf16", "fp8"):
    if medians[q]:
        print(f"  {q}: medians {min(medians[q]):.3f}-{max(medians[q]):.3f} ms over {len(medians[q])} runs; "
              f"weights {weight_bytes[q] / 1e9:.2f} GB a step")
if medians["bf16"] and medians["fp8"]:
    print(f"  fp8 / bf16 TPOT: {statistics.median(medians['fp8']) / statistics.median(medians['bf16']):.3f}")

for q in ("bf16", "fp8"):
    j = load(f"b64_{q}")
    if j:
        ctx = j["input_len"] + j["output_len"] / 2
        kv = 64 * ctx * layers * 2 * hk * d * 2
        r = roofline_ms(q, kv)
        tok_s = j["output_tokens_per_second"]
        extra = f"; roofline {64 / (r * 1e-3):,.0f} tok/s -> {tok_s / (64 / (r * 1e-3)):.2f} of it" if r else ""
        print(f"\nbatch 64 {q}: {tok_s:,.0f} output tok/s, TPOT median {j['tpot_ms']['median']:.3f} ms{extra}")
for q in ("bf16", "fp8"):
    j = load(f"prefill4096_{q}")
    if j:
        t = j["ttft_ms"]["median"]
        flops = 2 * (layer_params + vocab * h / 4096) * 4096 + 4 * layers * hq * d * 4096 * 4096 / 2
        print(f"prefill 4096 {q}: TTFT median {t:.1f} ms, {flops / (t * 1e-3) / 1e12:.0f} TFLOP/s")
