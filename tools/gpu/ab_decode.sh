#!/usr/bin/env bash
# Decode speed of this build against another (issue 19), alternated inside every repetition
# (AB_REPS, default 2) so that drift during the call hits both. Binaries from tools/gpu/pack.sh:
#   PACK_BASELINE=/path/to/old/specula PACK_NO_EXTRAS=1 tools/gpu/pack.sh specula cuda_roofline
# Each run: `specula bench latency`, dummy weights, batch 1, a 128-token prompt then 128 tokens,
# 20 iterations (TPOT p10 / median / p90 over them):
#   llama_bf16  Llama-3.1-8B;   llama_fp8  the same with --quantization fp8;   qwen  Qwen3-0.6B;
# then Llama-3.1-8B bf16 at batch 64 once per binary (AB_B64_REPS times, alternated).
# cuda_roofline --quick first (unless AB_SKIP has "roofline") gives the copy bandwidth the summary
# states each figure against.
# AB_VARIANTS adds runs of the candidate binary under other environment settings, alternated with
# the two builds: "NAME:VAR=VALUE[,VAR=VALUE] ..." (e.g. "pdl_off:SPECULA_PDL=0"); AB_BASELINE=0
# leaves the baseline binary out.
# $OUT receives decode_summary.txt and decode_logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${AB_BUDGET:-560}
SKIP=" ${AB_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

if ! skipped roofline; then
  stage roofline 120 cuda_roofline --quick
  grep -E "^(copy|bf16|fp8|fused)" "$WORK/roofline.log" | grep -E "M=(1|2|4) " | head -80
fi
LLAMA=bench/configs/Llama-3.1-8B-Instruct
QWEN=bench/configs/Qwen3-0.6B
b1=(--load-format dummy --skip-tokenizer-init --batch-size 1 --input-len 128 --output-len 128 --num-iters 20
  --num-iters-warmup 2 --max-num-seqs 8)
builds=(candidate)
[ "${AB_BASELINE:-1}" = 0 ] || builds=(baseline candidate)
declare -A variant_env=()
for v in ${AB_VARIANTS:-}; do
  builds+=("${v%%:*}")
  variant_env[${v%%:*}]=${v#*:}
done
run() {  # run MODEL BUILD REP ARGS...: the build's binary, under a variant's environment
  local model=$1 build=$2 rep=$3
  shift 3
  local bin=specula
  [ "$build" = baseline ] && bin=specula-baseline
  local -a env_args=()
  [ -n "${variant_env[$build]:-}" ] && IFS=, read -ra env_args <<< "${variant_env[$build]}"
  (
    [ ${#env_args[@]} -eq 0 ] || export "${env_args[@]}"
    SPECULA_BIN=$bin bench "$model.$build.r$rep" 100 "$@"
  )
}
for rep in $(seq 1 "${AB_REPS:-2}"); do
  for build in "${builds[@]}"; do
    skipped llama_bf16 || run llama_bf16 "$build" "$rep" latency "$LLAMA" "${b1[@]}" --max-model-len 4608
    skipped llama_fp8 || run llama_fp8 "$build" "$rep" latency "$LLAMA" "${b1[@]}" --max-model-len 4608 \
      --quantization fp8
    skipped qwen || run qwen "$build" "$rep" latency "$QWEN" "${b1[@]}" --max-model-len 4096
  done
done
for rep in $(seq 1 "${AB_B64_REPS:-1}"); do
  for build in "${builds[@]}"; do
    skipped b64 || run llamab64_bf16 "$build" "$rep" latency "$LLAMA" --load-format dummy --skip-tokenizer-init \
      --batch-size 64 --input-len 128 --output-len 256 --num-iters 2 --num-iters-warmup 1 --max-num-seqs 64 \
      --max-model-len 4608
  done
done

{
  echo "candidate: $(head -1 .gpu/commit.txt 2>/dev/null); baseline: $(cat .gpu/baseline.txt 2>/dev/null)"
  for v in ${AB_VARIANTS:-}; do echo "variant ${v%%:*}: the candidate with ${v#*:}"; done
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
  cat "$WORK/status.txt"
  python3 tools/gpu/decode_summary.py "$WORK" "$LLAMA/config.json" "$QWEN/config.json"
} | tee "$OUT/decode_summary.txt"
tar -czf "$OUT/decode_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
