#!/usr/bin/env bash
# Structured outputs against free text, ONE binary, alternated inside every repetition (AB_REPS,
# default 2) so that drift during the call hits both (issue 17's benchmarks), on the embedded
# target (specula-tiny, 8192-token vocabulary) and Qwen3-0.6B (dummy weights, the real 151k
# vocabulary: masks of its size):
#   tiny_c1 / tiny_c1_spec   concurrency 1, AB_ITERS_C1 requests a run (default 30), TPOT
#                            p10 / median / p90; _spec: draft_model k = 3 pinned;
#   tiny_c64                 64 requests at once (3 batches a run), output tok/s and TPOT;
#   qwen_b1, qwen_c64        the same on Qwen3-0.6B.
# The schema keeps the grammar open for all output_len tokens (an array of small objects).
# $OUT receives structured_summary.txt and structured_logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${RUN_AB_BUDGET:-420}
SKIP=" "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

DATASET="$WORK/prompts.txt"
prompt_dataset "$DATASET"
TINY=models/specula-tiny
QWEN=bench/configs/Qwen3-0.6B
tok_qwen=()
[ -f .gpu/tokenizers/qwen3/tokenizer.json ] && tok_qwen=(--tokenizer .gpu/tokenizers/qwen3)
SPEC='{"method":"draft_model","model":"models/specula-tiny-draft","num_speculative_tokens":3,"adaptive":false}'
SCHEMA='{"json": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "score": {"type": "integer", "minimum": 0, "maximum": 100}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}, "required": ["name", "score", "tags"]}}}'
so_flag() { [ "$1" = json ] && printf '%s\n' --structured-outputs "$SCHEMA"; }

for rep in $(seq 1 "${AB_REPS:-2}"); do
  for mode in free json; do
    mapfile -t f < <(so_flag $mode)
    common=(--dataset "$DATASET" --temperature 0 --input-len 128 --output-len 128 --max-model-len 1024)
    bench "tiny_c1_${mode}_r${rep}" 60 latency "$TINY" "${common[@]}" --batch-size 1 \
      --num-iters "${AB_ITERS_C1:-30}" --num-iters-warmup 1 --max-num-seqs 8 "${f[@]}"
    bench "tiny_c1_spec_${mode}_r${rep}" 60 latency "$TINY" "${common[@]}" --batch-size 1 \
      --num-iters "${AB_ITERS_C1:-30}" --num-iters-warmup 1 --max-num-seqs 8 --speculative-config "$SPEC" "${f[@]}"
    bench "tiny_c64_${mode}_r${rep}" 60 latency "$TINY" "${common[@]}" --batch-size 64 \
      --num-iters 3 --num-iters-warmup 1 --max-num-seqs 64 "${f[@]}"
    bench "qwen_b1_${mode}_r${rep}" 60 latency "$QWEN" --load-format dummy "${tok_qwen[@]}" --temperature 0 \
      --input-len 128 --output-len 128 --max-model-len 1024 --batch-size 1 --num-iters 20 --num-iters-warmup 1 \
      --max-num-seqs 8 "${f[@]}"
    bench "qwen_c64_${mode}_r${rep}" 60 latency "$QWEN" --load-format dummy "${tok_qwen[@]}" --temperature 0 \
      --input-len 128 --output-len 128 --max-model-len 1024 --batch-size 64 --num-iters 2 --num-iters-warmup 1 \
      --max-num-seqs 64 "${f[@]}"
  done
done

{
  summary_head
  python3 - "$WORK" <<'PY'
import glob, json, os, re, statistics, sys
work = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(work, "*_r*.json"))):
    m = re.match(r"(\w+?)_(free|json)_r(\d+)\.json", os.path.basename(path))
    if m:
        rows.setdefault((m.group(1), m.group(2)), []).append(json.load(open(path)))
print("config | mode | per run: TPOT p10/median/p90 ms ; output tok/s | median TPOT over runs")
med = {}
for (config, mode), runs in sorted(rows.items()):
    desc = ", ".join(f"{r['tpot_ms']['p10']:.4f}/{r['tpot_ms']['median']:.4f}/{r['tpot_ms']['p90']:.4f} ; "
                     f"{r['output_tokens_per_second']:.0f}" for r in runs)
    med[(config, mode)] = statistics.median(r["tpot_ms"]["median"] for r in runs)
    acc = [(r.get("spec_decoding") or {}).get("acceptance_rate") for r in runs]
    acc = [a for a in acc if a is not None]
    extra = f" | acceptance {min(acc):.3f}-{max(acc):.3f}" if acc else ""
    print(f"{config} | {mode} | {desc} | {med[(config, mode)]:.4f}{extra}")
for config in sorted({c for c, _ in med}):
    f, j = med.get((config, "free")), med.get((config, "json"))
    if f and j:
        print(f"{config}: json_schema TPOT {j:.4f} vs free {f:.4f} ms = {100 * (j / f - 1):+.1f}% overhead")
PY
} | tee "$OUT/structured_summary.txt"
tar -czf "$OUT/structured_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
