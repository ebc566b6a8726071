#!/usr/bin/env python3
"""The table of tools/gpu/kv_fp8_bench.sh: Llama-3.1-8B decode with the bf16 KV cache against the
fp8 one, each against the roofline of the bytes a decode step reads at the copy bandwidth
cuda_roofline measured in the same call: the bf16 weights (linear layers and lm_head) plus the
cache attention streams (every sequence's context, the prompt plus half the output on average,
K and V of every layer, 2 bytes an element in bf16 and 1 in fp8).
Usage: kv_fp8_summary.py WORK_DIR CONFIG_JSON"""
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
weight_bytes = 2 * (layers * (h * (hq + 2 * hk) * d + hq * d * h + 3 * inter * h) + vocab * h)

roof = copy_tbs(work)
print(f"copy roofline: {roof} TB/s (cuda_roofline, this call)" if roof else "copy roofline: not measured")

for shape in ("b64", "b1"):
    medians = {"auto": [], "fp8": []}
    for path in sorted(glob.glob(os.path.join(work, f"{shape}_*_r*.json"))):
        name = os.path.basename(path)[:-5]
        kv = name.split("_")[1]
        j = json.load(open(path))
        t = j["tpot_ms"]
        medians[kv].append(t["median"])
        batch, ctx = j["batch_size"], j["input_len"] + j["output_len"] / 2
        cache_bytes = batch * ctx * layers * 2 * hk * d * (1 if kv == "fp8" else 2)
        extra = ""
        if roof:
            r = (weight_bytes + cache_bytes) / (roof * 1e12) * 1e3
            extra = f"; roofline {r:.3f} ms -> {100 * r / t['median']:.0f}% of it"
        print(f"  {name:12s} batch {batch} context {ctx:.0f}: TPOT p10 / median / p90 {t['p10']:.3f} / "
              f"{t['median']:.3f} / {t['p90']:.3f} ms, {j['output_tokens_per_second']:,.0f} output tok/s "
              f"(cache {cache_bytes / 1e9:.2f} GB a step{extra})")
    if medians["auto"] and medians["fp8"]:
        ratio = statistics.median(medians["fp8"]) / statistics.median(medians["auto"])
        print(f"{shape}: fp8 / bf16 TPOT median {ratio:.3f} (medians bf16 {min(medians['auto']):.3f}-"
              f"{max(medians['auto']):.3f}, fp8 {min(medians['fp8']):.3f}-{max(medians['fp8']):.3f} ms)\n")

ttft = {"auto": [], "fp8": []}
for path in sorted(glob.glob(os.path.join(work, "prefill4096_*_r*.json"))):
    kv = os.path.basename(path).split("_")[1]
    ttft[kv].append(json.load(open(path))["ttft_ms"]["median"])
for kv in ("auto", "fp8"):
    if ttft[kv]:
        print(f"prefill 4096 {kv}: TTFT medians {', '.join(f'{t:.1f}' for t in ttft[kv])} ms")
