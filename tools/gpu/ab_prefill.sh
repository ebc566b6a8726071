#!/usr/bin/env bash
# Prefill attention and a 4096-token prompt (issue 19 point 3) of two builds or of environment
# variants of one, alternated inside every repetition (AB_REPS, default 2) so that drift hits all:
#   AB_VARIANTS="NAME:VAR=VALUE[,VAR=VALUE] ..."  (default: "baseline: candidate:"); the variant
#   named baseline runs specula-baseline and cuda_roofline-baseline, another build's binaries:
#     PACK_NO_COMPRESS=1 PACK_BASELINE=<old build>/src/specula tools/gpu/pack.sh specula cuda_roofline
#     strip -o .gpu/bin/cuda_roofline-baseline <old build>/tools/gpu/cuda_roofline
#     tar -C .gpu -cf - bin | xz -T2 -9 > .gpu/bin.tar.xz && rm -rf .gpu/bin
# Stages: `cuda_roofline --prefill` (the kernel on the prompts' shapes, with the GEMM rate it is
# judged against), PyTorch's SDPA kernels on the same shape (tools/gpu/sdpa_anchor.py, an anchor
# nobody here wrote), Llama-3.1-8B (dummy weights) TTFT of one 4096-token prompt over 20
# iterations, and with AB_NCU=1 Nsight Compute's sections for one launch of the 4096-token kernel.
# AB_SKIP names stages to leave out (roofline sdpa ttft). $OUT receives prefill_summary.txt and
# prefill_logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${AB_BUDGET:-560}
SKIP=" ${AB_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

VARIANTS=${AB_VARIANTS:-"baseline: candidate:"}
LLAMA=bench/configs/Llama-3.1-8B-Instruct
in_variant() {  # in_variant SPEC CMD...: CMD under the variant's environment and binaries
  local spec=$1
  shift
  local -a env_args=()
  IFS=, read -ra env_args <<< "${spec#*:}"
  (
    [ ${#env_args[@]} -eq 0 ] || export "${env_args[@]}"
    if [ "${spec%%:*}" = baseline ]; then
      export SPECULA_BIN=specula-baseline ROOFLINE_BIN=cuda_roofline-baseline
      command -v cuda_roofline-baseline > /dev/null || export ROOFLINE_BIN=true  # not packed: no kernel row
    fi
    "$@"
  )
}
for rep in $(seq 1 "${AB_REPS:-2}"); do
  for v in $VARIANTS; do
    skipped roofline || in_variant "$v" eval 'stage "roofline.${v%%:*}.r$rep" 120 "${ROOFLINE_BIN:-cuda_roofline}" --quick --prefill'
    skipped ttft || in_variant "$v" bench "prefill4096.${v%%:*}.r$rep" 120 latency "$LLAMA" --load-format dummy \
      --skip-tokenizer-init --batch-size 1 --input-len 4096 --output-len 1 --num-iters 20 --num-iters-warmup 2 \
      --max-model-len 4608 --max-num-seqs 1
  done
done
skipped sdpa || stage sdpa 120 python3 tools/gpu/sdpa_anchor.py 4096 1024 512
if [ "${AB_NCU:-0}" = 1 ]; then
  for v in $VARIANTS; do
    in_variant "$v" eval 'stage "ncu.${v%%:*}" 150 ncu --clock-control none -k regex:prefill_attention_kernel \
      -s 2 -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis "${ROOFLINE_BIN:-cuda_roofline}" --quick \
      --prefill'
  done
fi

{
  echo "build: $(head -1 .gpu/commit.txt 2>/dev/null)"
  for v in $VARIANTS; do echo "variant ${v%%:*}: ${v#*:}"; done
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
  cat "$WORK/status.txt"
  for f in "$WORK"/roofline.*.log; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f" .log)"
    grep -E "^(gemm|prefill)" "$f"
  done
  [ -f "$WORK/sdpa.log" ] && cat "$WORK/sdpa.log"
  for f in "$WORK"/prefill4096.*.json; do
    [ -f "$f" ] || continue
    python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['ttft_ms']; print(sys.argv[2], 'TTFT ms p10 %.2f median %.2f p90 %.2f' % (t.get('p10', float('nan')), t['median'], t['p90']))" "$f" "$(basename "$f" .json)"
  done
  for f in "$WORK"/ncu.*.log; do
    [ -f "$f" ] && { echo "-- $(basename "$f" .log)"; grep -vE "^==PROF==|^\s*$" "$f" | tail -120; }
  done
} | tee "$OUT/prefill_summary.txt"
tar -czf "$OUT/prefill_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
