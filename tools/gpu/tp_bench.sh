#!/usr/bin/env bash
# Issue 20's tensor-parallel figures on a machine of 2 (or more) GPUs in ONE call (binaries from
#   PACK_NO_EXTRAS=1 tools/gpu/pack.sh specula test_app_cuda test_engine_cuda test_backend_cuda cuda_roofline):
#   1. the GPU tests of the split model: test_app_cuda's CudaTensorParallel.* (the split embedded
#      targets serve transformers' greedy tokens, with draft_model, eagle3 and MTP, sync and
#      async), test_engine_cuda's DecodeGraphs.TensorParallel* (a graph per GPU = eager steps) and
#      the vocab-parallel embedding kernel and the peer all-reduce against NCCL and the host;
#   2. cuda_roofline --quick (copy bandwidth: each GPU's roofline is its 1/N of the weights), when
#      packed;
#   3. Llama-3.1-8B (dummy weights): batch-1 TPOT of TP_VARIANTS (default: TP 1, TP 2, TP 2 with
#      NCCL all-reduces only, TP 2 eager; CUDA graphs unless eager), alternated TP_REPS times, 20
#      requests each; then batch 64 throughput of TP 1, TP 2 and TP 2 NCCL-only once each;
#   4. with TP_70B="4" (sizes): Llama-3.1-70B's load time and batch-1 TPOT at those sizes, with
#      the custom all-reduce, NCCL-only and eagerly (unless TP_SKIP has nccl70 / eager70), and with the
#      public EAGLE-3 head's shape drafting k = 3 (pinned; dummy heads accept nothing, so the TPOT
#      measured is the speculative step's cost);
#   5. with TP_DEEPSEEK="1 2 4": DeepSeek-V2-Lite's batch-1 TPOT at those sizes;
#   6. with TP_SERVE="4" (sizes): what rehearsals of new step sizes cost under prompts and outputs
#      of varied lengths: Qwen3-8B served split over that many GPUs (needs the Qwen3 tokenizer in
#      .gpu/extras.tar.xz: pack.sh without PACK_NO_EXTRAS), `bench serve` twice against the same
#      server (random prompts of 50-950 tokens, 10-190 output tokens, TP_SERVE_PROMPTS requests at
#      once, default 256); the server's log ends with the rehearsals' count and time.
# $OUT receives tp_summary.txt (tools/gpu/tp_summary.py) and tp_logs.tar.gz.
#   TP_REPS=2 TP_VARIANTS="tp1 tp2" TP_B64_VARIANTS="tp1 tp4" TP_SKIP="tests roofline 8b b64 nccl70 eager70" TP_70B="4" TP_BUDGET=540
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${TP_BUDGET:-540}
SKIP=" ${TP_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; nvidia-smi topo -m; } > "$WORK/gpus.txt" 2>&1
if ! skipped tests; then
  stage tp_kernels 90 test_backend_cuda --gtest_brief=1 --gtest_filter='CudaRowwise.*:PeerAllReduce.*'
  stage tp_graphs 120 test_engine_cuda --gtest_brief=1 --gtest_filter='DecodeGraphs.*'
  stage tp_tests "${TP_TESTS_LIMIT:-240}" test_app_cuda --gtest_brief=1 --gtest_filter='CudaTensorParallel.*'
  for t in tp_kernels tp_graphs tp_tests; do
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\] .* ran|Failure|error" "$WORK/$t.log" | head -20
  done
fi

if ! skipped roofline && command -v cuda_roofline >/dev/null; then
  stage roofline 90 cuda_roofline --quick
  grep -E "^copy" "$WORK/roofline.log" | head -3
fi

variant_args() {  # tpN | tpN_nccl (--disable-custom-all-reduce) | tpN_eager
  local n=${1#tp}
  n=${n%%_*}
  echo -tp "$n"
  case $1 in
    *_nccl) echo --disable-custom-all-reduce ;;
    *_eager) echo --enforce-eager ;;
  esac
}
LLAMA8=bench/configs/Llama-3.1-8B-Instruct
LLAMA70=bench/configs/Llama-3.1-70B-Instruct
opts=(--load-format dummy --skip-tokenizer-init --max-model-len 4096)
if ! skipped 8b; then
  for rep in $(seq 1 "${TP_REPS:-2}"); do
    for v in ${TP_VARIANTS:-tp1 tp2 tp2_nccl tp2_eager}; do
      bench "b1_8b_${v}_r$rep" 90 latency "$LLAMA8" "${opts[@]}" $(variant_args $v) --batch-size 1 --input-len 128 \
        --output-len 128 --num-iters 20 --num-iters-warmup 2 --max-num-seqs 8
    done
  done
  if ! skipped b64; then
    for v in ${TP_B64_VARIANTS:-tp1 tp2 tp2_nccl}; do
      bench "b64_8b_${v}" 100 latency "$LLAMA8" "${opts[@]}" $(variant_args $v) --batch-size 64 --input-len 128 \
        --output-len 256 --num-iters 2 --num-iters-warmup 1 --max-num-seqs 64
    done
  fi
fi
# TP_70B="4": Llama-3.1-70B split over that many GPUs (load time and batch-1 TPOT).
HEAD70=bench/configs/EAGLE3-Llama-3.1-70B
b1=(--batch-size 1 --input-len 128 --output-len 128 --num-iters 20 --num-iters-warmup 2 --max-num-seqs 8)
for n in ${TP_70B:-}; do
  bench "b1_70b_tp${n}" 240 latency "$LLAMA70" "${opts[@]}" -tp "$n" "${b1[@]}"
  skipped nccl70 || bench "b1_70b_tp${n}_nccl" 240 latency "$LLAMA70" "${opts[@]}" -tp "$n" --disable-custom-all-reduce "${b1[@]}"
  bench "b1_70b_tp${n}_eagle3_k3" 240 latency "$LLAMA70" "${opts[@]}" -tp "$n" "${b1[@]}" --temperature 0 \
    --speculative-config "{\"method\":\"eagle3\",\"model\":\"$HEAD70\",\"num_speculative_tokens\":3,\"adaptive\":false}"
  skipped eager70 || bench "b1_70b_tp${n}_eager" 240 latency "$LLAMA70" "${opts[@]}" -tp "$n" --enforce-eager "${b1[@]}"
done

# TP_DEEPSEEK="1 2 4": DeepSeek-V2-Lite (MLA split by heads, every expert by channels) at those
# sizes, batch-1 TPOT alternated TP_REPS times. Each run goes through stacks_on_hang.sh (a run
# still going after 110 s leaves NAME.stacks.txt: every thread's stack and the GPUs' use) with
# the step watchdog at 30 s (each rank's collectives and device state in NAME.log): -tp 4 hung
# once here at d7ab1b0.
V2LITE=bench/configs/DeepSeek-V2-Lite
for rep in $(seq 1 "${TP_REPS:-2}"); do
  for n in ${TP_DEEPSEEK:-}; do
    name="b1_v2lite_tp${n}_r$rep"
    if [ $(( BUDGET - $(elapsed) )) -lt 120 ]; then
      echo "== $name: not run (time budget spent)" | tee -a "$WORK/status.txt"
      continue
    fi
    t0=$(date +%s)
    SPECULA_ENGINE_ITERATION_TIMEOUT_S=30 OUT="$WORK" tools/gpu/stacks_on_hang.sh "${TP_STALL_S:-110}" "$name" -- \
      "${SPECULA_BIN:-specula}" bench latency "$V2LITE" "${opts[@]}" -tp "$n" "${b1[@]}" --output-json "$WORK/$name.json" \
      > /dev/null
    rc=$?
    note=""
    [ $rc -eq 124 ] && note=" (stalled: stacks in $name.stacks.txt)"
    echo "$name: exit $rc in $(( $(date +%s) - t0 ))s$note" | tee -a "$WORK/status.txt"
  done
done

# TP_SERVE="4": rehearsal cost under varied lengths (see the header).
if [ -n "${TP_SERVE:-}" ] && [ -f .gpu/extras.tar.xz ] && [ ! -d .gpu/tokenizers ]; then tar -xJf .gpu/extras.tar.xz -C .gpu; fi
for n in ${TP_SERVE:-}; do
  name="serve_qwen3_8b_tp$n"
  port=18400
  specula serve bench/configs/Qwen3-8B --load-format dummy --tokenizer .gpu/tokenizers/qwen3 -tp "$n" \
    --host 127.0.0.1 --port $port --max-model-len 2048 --disable-uvicorn-access-log > "$WORK/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 360); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  for run in 1 2; do
    stage "${name}_bench$run" 150 specula bench serve --port $port --backend openai --dataset-name random \
      --random-input-len 500 --random-output-len 100 --random-range-ratio 0.9 --num-prompts "${TP_SERVE_PROMPTS:-256}" \
      --request-rate inf --seed "$run" --disable-tqdm
    grep -E "Benchmark duration|Output token throughput|Successful|Failed" "$WORK/${name}_bench$run.log" | sed "s/^/  [$name $run] /"
  done
  kill -TERM $pid 2>/dev/null
  timeout 60 tail --pid=$pid -f /dev/null
  echo "$name: server stopped" >> "$WORK/status.txt"
done

{
  echo "commit: $(head -1 .gpu/commit.txt 2>/dev/null)"
  cat "$WORK/gpus.txt"
  python3 tools/gpu/tp_summary.py "$WORK"
  cat "$WORK/status.txt"
  echo "total $(elapsed)s"
} | tee "$OUT/tp_summary.txt"
tar -czf "$OUT/tp_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
