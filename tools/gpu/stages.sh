# Shared by the GPU-machine scripts (run_all.sh, run_spec.sh, the ab_*.sh and *_bench.sh calls):
# bounded stages with their logs in $WORK, a status line per stage, and `specula bench` runs that
# keep their JSON. The caller sets BUDGET (seconds) and SKIP (" name name ") and sources it from
# the repository root; it sets OUT ($OUT or .gpu/out), a fresh WORK with an empty status.txt, and
# START.
OUT=${OUT:-$(pwd)/.gpu/out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
START=$(date +%s)
: > "$WORK/status.txt"
elapsed() { echo $(( $(date +%s) - START )); }
skipped() { [[ "$SKIP" == *" $1 "* ]]; }

# stage NAME LIMIT CMD...: runs CMD with its output in NAME.log, within LIMIT and the budget left.
stage() {
  local name=$1 limit=$2
  shift 2
  local left=$(( BUDGET - $(elapsed) ))
  if [ "$left" -le 10 ]; then
    echo "== $name: not run (time budget spent)" | tee -a "$WORK/status.txt"
    return 99
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (up to ${limit}s, at $(elapsed)s)" >&2
  local t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  local note=""
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && note=" (timed out)"
  echo "$name: exit $rc in $(( $(date +%s) - t0 ))s$note" | tee -a "$WORK/status.txt"
  return $rc
}

bench() {  # bench NAME LIMIT ARGS...: `$SPECULA_BIN bench ARGS --output-json NAME.json` (default specula)
  local name=$1 limit=$2
  shift 2
  stage "$name" "$limit" "${SPECULA_BIN:-specula}" bench "$@" --output-json "$WORK/$name.json"
  grep -E "^(TTFT|TPOT|batch latency|output tokens|requests/s|elapsed)|Graph capturing|GPU KV cache|Memory profiling|Model loading took|SpecDecoding|Speculative|error" \
    "$WORK/$name.log" | sed "s/^/  [$name] /" | cut -c1-220
}

summary_head() {  # a summary's first lines: the commit packed, the GPU, every stage's status line
  echo "commit: $(head -1 .gpu/commit.txt 2>/dev/null)"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
  cat "$WORK/status.txt"
}
