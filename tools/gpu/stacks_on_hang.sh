#!/usr/bin/env bash
# Runs a command on the GPU machine and, should it still run after STALL seconds, records what
# each of its threads and GPUs is doing before killing it: every host thread's stack (cuda-gdb,
# the image's one debugger; the binaries are stripped, so frames in specula show as addresses but
# those in libcudart / libcuda / libnccl name the call a thread is blocked in), each thread's
# kernel wait channel, and every GPU's utilisation (a GPU at 100% with no progress spins in a
# kernel that waits for a peer; 0% waits for the host). With CUDA_LAUNCH_BLOCKING=1 each host
# thread stops at the launch its GPU cannot finish.
#   tools/gpu/stacks_on_hang.sh STALL NAME -- specula bench latency ... -tp 4 ...
# $OUT/NAME.log is the command's output, $OUT/NAME.stacks.txt the record (only if it stalled).
# Exits with the command's status, or 124 when it stalled.
set -uo pipefail
stall=$1 name=$2
shift 2
[ "${1:-}" = "--" ] && shift
mkdir -p "$OUT"
"$@" > "$OUT/$name.log" 2>&1 &
pid=$!
for _ in $(seq 1 "$stall"); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"
    rc=$?
    echo "$name: exit $rc (no stall)"
    exit "$rc"
  fi
  sleep 1
done
{
  echo "== $name still running after ${stall}s: $*"
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv
  for t in /proc/$pid/task/*; do
    echo "thread $(basename "$t") $(cat "$t/comm") state $(cut -d' ' -f3 "$t/stat") wchan $(cat "$t/wchan" 2>/dev/null)"
  done
  echo "-- where the executable is mapped (addr2line -e the unstripped build: address - base + offset)"
  grep -E "r-xp .*/(specula|test_[a-z_]+)$" /proc/$pid/maps | head -3
  if command -v cuda-gdb >/dev/null; then
    timeout 60 cuda-gdb -batch -p "$pid" -ex "set pagination off" -ex "thread apply all bt 25" > "$OUT/$name.gdb.txt" 2>&1
    # Its stacks, or why there are none (on 2026-11-28 it printed no stack: its own words say why).
    grep -E "^Thread|^#" "$OUT/$name.gdb.txt" | head -400
    grep -qE "^Thread" "$OUT/$name.gdb.txt" || { echo "-- cuda-gdb gave no stack:"; tail -15 "$OUT/$name.gdb.txt"; }
    rm -f "$OUT/$name.gdb.txt"
  fi
} > "$OUT/$name.stacks.txt" 2>&1
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
echo "$name: stalled; $OUT/$name.stacks.txt"
head -8 "$OUT/$name.stacks.txt"
exit 124
