#!/usr/bin/env python3
"""The table of tools/gpu/run_all.sh: each benchmark figure beside its roofline.

    summarize.py WORK_DIR SUMMARY_JSON

Reads roofline.log (cuda_roofline: copy bandwidth, bf16 GEMM rate) and the `specula bench`
JSON files of run_all.sh from WORK_DIR; rooflines come from the model configs in bench/configs:
  - decode: every weight but the embedding table is read once per step (plus the KV cache of the
    batch), at the measured copy bandwidth (bytes read + written per second);
  - prefill: the linear layers' and causal attention's FLOPs at the measured bf16 GEMM rate.
"""
import json
import os
import re
import sys

work, out_json = sys.argv[1], sys.argv[2]
CONFIGS = "bench/configs"


def load(name):
    path = os.path.join(work, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def roofline():
    copy_tbs = gemm_tflops = None
    path = os.path.join(work, "roofline.log")
    if os.path.exists(path):
        for line in open(path):
            m = re.search(r"copy\s+d2d .*= ([\d.]+) TB/s read\+write", line)
            if m:
                copy_tbs = float(m.group(1))
            m = re.search(r"gemm\s+square\s+M=8192 .*?([\d.]+) TFLOP/s", line)
            if m:
                gemm_tflops = float(m.group(1))
    return copy_tbs, gemm_tflops


def model_facts(folder):
    with open(os.path.join(CONFIGS, folder, "config.json")) as f:
        c = json.load(f)
    h, layers, v = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    hq, hk = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // hq
    inter = c["intermediate_size"]
    per_layer = (hq + 2 * hk) * d * h + h * hq * d + 2 * inter * h + h * inter + 2 * h
    if c.get("model_type") == "qwen3":
        per_layer += 2 * d  # q_norm, k_norm
    linear = layers * per_layer
    lm_head = v * h  # read once per step whether tied to the embedding or not
    return {
        "decode_bytes": 2 * (linear + lm_head + h),  # bf16; the final norm too
        "linear_params": linear,
        "lm_head_params": lm_head,
        "kv_bytes_per_token": layers * 2 * hk * d * 2,
        "layers": layers, "hq": hq, "d": d,
    }


copy_tbs, gemm_tflops = roofline()
rows, figures = [], {}


def row(what, measured, unit, roof=None, ratio=None, target=""):
    rows.append((what, measured, unit, roof, ratio, target))


if copy_tbs:
    row("device-to-device copy (read+write)", copy_tbs, "TB/s")
if gemm_tflops:
    row("bf16 GEMM 8192^3 (cuBLASLt)", gemm_tflops, "TFLOP/s")
figures["copy_tbs"], figures["gemm_tflops"] = copy_tbs, gemm_tflops

llama = model_facts("Llama-3.1-8B-Instruct")
qwen = model_facts("Qwen3-0.6B")

b1 = load("llama8b_b1")
if b1:
    tpot = b1["tpot_ms"]["median"]
    # Mean context of the 256 output steps: 128 + 128 tokens of KV.
    roof = (llama["decode_bytes"] + 256 * llama["kv_bytes_per_token"]) / (copy_tbs * 1e12) * 1e3 if copy_tbs else None
    row("Llama-3.1-8B b1 TPOT median", tpot, "ms", roof, tpot / roof if roof else None, "<= 1.15x roofline")
    row("Llama-3.1-8B b1 TPOT p90", b1["tpot_ms"]["p90"], "ms")
    row("Llama-3.1-8B b1 TTFT median (128 tokens)", b1["ttft_ms"]["median"], "ms")
    figures["llama8b_b1"] = {"tpot_ms": b1["tpot_ms"], "ttft_ms": b1["ttft_ms"], "roofline_ms": roof}

b64 = load("llama8b_b64")
if b64:
    decode_tok_s = 64 / (b64["tpot_ms"]["median"] / 1e3)
    step_s = (llama["decode_bytes"] + 64 * 256 * llama["kv_bytes_per_token"]) / (copy_tbs * 1e12) if copy_tbs else None
    roof = 64 / step_s if step_s else None
    row("Llama-3.1-8B b64 decode tokens/s (64 / TPOT)", decode_tok_s, "tok/s", roof,
        decode_tok_s / roof if roof else None, ">= 7000")
    row("Llama-3.1-8B b64 output tokens/s incl. prefill", b64["output_tokens_per_second"], "tok/s")
    row("Llama-3.1-8B b64 TPOT median / p90", b64["tpot_ms"]["median"], "ms", None, None,
        "p90 %.3f ms" % b64["tpot_ms"]["p90"])
    figures["llama8b_b64"] = {"decode_tokens_per_s": decode_tok_s, "roofline_tokens_per_s": roof,
                              "output_tokens_per_s": b64["output_tokens_per_second"], "tpot_ms": b64["tpot_ms"]}

pf = load("llama8b_prefill4096")
if pf:
    t = 4096
    flops = 2 * t * llama["linear_params"] + 2 * llama["lm_head_params"] + \
        4 * (t * (t + 1) / 2) * llama["hq"] * llama["d"] * llama["layers"]
    ttft = pf["ttft_ms"]["median"]
    rate = flops / (ttft / 1e3) / 1e12
    row("Llama-3.1-8B prefill 4096 TTFT median", ttft, "ms")
    row("Llama-3.1-8B prefill 4096 rate", rate, "TFLOP/s", gemm_tflops, rate / gemm_tflops if gemm_tflops else None,
        ">= 0.60 of GEMM")
    figures["llama8b_prefill4096"] = {"ttft_ms": pf["ttft_ms"], "tflops": rate, "flops": flops}

for name, label in (("qwen06b_b1", "graphs"), ("qwen06b_b1_eager", "eager")):
    q = load(name)
    if q:
        roof = (qwen["decode_bytes"] + 256 * qwen["kv_bytes_per_token"]) / (copy_tbs * 1e12) * 1e3 if copy_tbs else None
        row("Qwen3-0.6B b1 TPOT median (%s)" % label, q["tpot_ms"]["median"], "ms", roof,
            q["tpot_ms"]["median"] / roof if roof else None)
        figures[name] = {"tpot_ms": q["tpot_ms"], "ttft_ms": q["ttft_ms"], "roofline_ms": roof}
qt = load("qwen06b_throughput")
if qt:
    row("Qwen3-0.6B 256 prompts: requests/s", qt["requests_per_second"], "req/s")
    row("Qwen3-0.6B 256 prompts: output tokens/s", qt["output_tokens_per_second"], "tok/s")
    figures["qwen06b_throughput"] = qt


def fmt(x):
    if x is None:
        return "-"
    return "%.3f" % x if abs(x) < 10 else "%.1f" % x


print("\n%-50s %12s %-8s %12s %8s  %s" % ("figure", "measured", "unit", "roofline", "ratio", "target"))
for what, measured, unit, roof, ratio, target in rows:
    print("%-50s %12s %-8s %12s %8s  %s" % (what, fmt(measured), unit, fmt(roof), fmt(ratio), target))
with open(out_json, "w") as f:
    json.dump(figures, f, indent=2)
