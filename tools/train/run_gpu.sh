#!/usr/bin/env bash
# The GPU-machine side of the pipeline, one stage per call of the device tool (each under 10 min).
#   dry    the whole pipeline with tiny step counts (a fast end-to-end check), then a timed full prepare
#   main   corpus + tokenizer, specula-tiny and specula-tiny-moe trained side by side, evaluated, fixtures
#   draft  corpus again (tokenizer from models/specula-tiny), specula-tiny-draft distilled, evaluated, fixtures
#   eagle3 corpus again (tokenizer from models/specula-tiny), the EAGLE-3 head of specula-tiny trained
#          (240 s), evaluated against specula-tiny-draft, fixture; needs the committed specula-tiny and
#          specula-tiny-draft. About 8 min: prepare 1-2, train 4.5 with loading and saving, eval + fixture 1.
#   eagle3-continue  as eagle3, but going on training the committed head (another 300 s, new
#          windows, a lower peak; configs.py "eagle3-continue"); its earlier run's figures are kept
#   eagle3-dry  the eagle3 path with 40 steps and small evaluations on the dry corpus (a few minutes)
# Everything that comes back is packed under $OUT (at most 8 files of 16 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
stage=${1:?usage: run_gpu.sh dry|main|draft|eagle3|eagle3-continue|eagle3-dry}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
OUT=${OUT:-/tmp/specula_out}
mkdir -p "$OUT"
D=/tmp/specula_data
PY="python3 tools/train/main.py"
exec > >(tee "$OUT/$stage.log") 2>&1
python3 -c "import torch, transformers, tokenizers, safetensors; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"

case "$stage" in
dry)
  # Keeps going past a failing step, so one call shows every problem.
  fail=0
  run() { echo "=== $*"; "$@" || { echo "=== FAILED: $*"; fail=1; }; }
  run $PY prepare --data $D --dry
  $PY train --model tiny --data $D --dry > "$OUT/tiny.log" 2>&1 & p1=$!
  $PY train --model moe --data $D --dry > "$OUT/moe.log" 2>&1 & p2=$!
  s1=0; s2=0; wait $p1 || s1=$?; wait $p2 || s2=$?
  cat "$OUT/tiny.log" "$OUT/moe.log"
  echo "=== training exit codes: tiny=$s1 moe=$s2"
  run $PY train --model draft --data $D --dry
  for m in tiny moe draft; do run $PY evaluate --model $m --data $D --dry; done
  run $PY fixtures --models tiny,draft,moe
  python3 - <<'EOF2' || true
import json, os, struct
os.makedirs("tools/train/results-dry", exist_ok=True)
for name in ["specula-tiny", "specula-tiny-moe", "specula-tiny-draft"]:
    path = f"models/{name}/model.safetensors"
    if not os.path.exists(path):
        continue
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    with open(f"tools/train/results-dry/{name}.keys.txt", "w") as out:
        for k, v in sorted(header.items()):
            if k != "__metadata__":
                out.write(f"{k} {v['dtype']} {v['shape']}\n")
EOF2
  tar -czf "$OUT/dry.tar.gz" --ignore-failed-read tools/train/results-dry tests/fixtures/embedded \
    models/*/config.json models/*/generation_config.json models/*/tokenizer_config.json models/specula-tiny/tokenizer.json || true
  echo "=== timing a full prepare"
  time timeout 240 $PY prepare --data /tmp/specula_full || echo "full prepare failed or did not finish in 240 s"
  echo "=== dry run: fail=$fail"
  ;;
main)
  $PY prepare --data $D
  $PY train --model tiny --data $D > "$OUT/tiny.log" 2>&1 & p1=$!
  sleep 20  # lets the first process claim its memory before the second starts
  $PY train --model moe --data $D > "$OUT/moe.log" 2>&1 & p2=$!
  s1=0; s2=0; wait $p1 || s1=$?; wait $p2 || s2=$?
  grep -v -e UNEXPECTED -e "Loading weights" -e "Writing model" "$OUT/tiny.log" "$OUT/moe.log" | tail -n 60
  # The models come back even if a later step fails.
  [ $s1 = 0 ] && tar -czf "$OUT/specula-tiny.tar.gz" models/specula-tiny
  [ $s2 = 0 ] && tar -czf "$OUT/specula-tiny-moe.tar.gz" models/specula-tiny-moe
  [ $s1 = 0 ] && [ $s2 = 0 ] || { echo "training failed: tiny=$s1 moe=$s2"; exit 1; }
  $PY evaluate --model tiny --data $D > "$OUT/eval-tiny.log" 2>&1 & p1=$!
  $PY evaluate --model moe --data $D > "$OUT/eval-moe.log" 2>&1 & p2=$!
  s1=0; s2=0; wait $p1 || s1=$?; wait $p2 || s2=$?
  grep -v -e UNEXPECTED -e "Loading weights" "$OUT/eval-tiny.log" "$OUT/eval-moe.log" | tail -n 40
  $PY fixtures --models tiny,moe || echo "fixtures failed"
  tar -czf "$OUT/results-main.tar.gz" tools/train/results tests/fixtures/embedded
  echo "eval exit codes: tiny=$s1 moe=$s2"
  ;;
draft)
  $PY prepare --data $D --tokenizer-from models/specula-tiny
  $PY train --model draft --data $D
  tar -czf "$OUT/specula-tiny-draft.tar.gz" models/specula-tiny-draft
  $PY evaluate --model draft --data $D || echo "evaluate failed"
  $PY fixtures --models draft || echo "fixtures failed"
  tar -czf "$OUT/results-draft.tar.gz" tools/train/results tests/fixtures/embedded/specula-tiny-draft
  ;;
eagle3|eagle3-continue)
  $PY prepare --data $D --tokenizer-from models/specula-tiny
  if [ "$stage" = eagle3 ]; then
    $PY train --model eagle3 --data $D
  else
    cp -r models/specula-tiny-eagle3 /tmp/specula-tiny-eagle3-before
    $PY train --model eagle3 --data $D --init-from /tmp/specula-tiny-eagle3-before
  fi
  # The head comes back even if a later step fails.
  tar -czf "$OUT/specula-tiny-eagle3.tar.gz" models/specula-tiny-eagle3 tools/train/results/specula-tiny-eagle3.train.json
  $PY evaluate --model eagle3 --data $D || echo "evaluate failed"
  $PY fixtures --models eagle3 --data $D || echo "fixtures failed"
  tar -czf "$OUT/results-eagle3.tar.gz" --ignore-failed-read tools/train/results/specula-tiny-eagle3.train.json \
    tools/train/results/specula-tiny-eagle3.eval.json tests/fixtures/embedded/specula-tiny-eagle3
  ;;
eagle3-dry)
  # Keeps going past a failing step, so one call shows every problem.
  fail=0
  run() { echo "=== $*"; "$@" || { echo "=== FAILED: $*"; fail=1; }; }
  run $PY prepare --data $D --dry --tokenizer-from models/specula-tiny
  run $PY train --model eagle3 --data $D --dry
  run $PY evaluate --model eagle3 --data $D --dry
  run $PY fixtures --models eagle3 --data $D
  python3 - <<'EOF2' || true
import json, os, struct
path = "models/specula-tiny-eagle3/model.safetensors"
if os.path.exists(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    os.makedirs("tools/train/results-dry", exist_ok=True)
    with open("tools/train/results-dry/specula-tiny-eagle3.keys.txt", "w") as out:
        for k, v in sorted(header.items()):
            if k != "__metadata__":
                out.write(f"{k} {v['dtype']} {v['shape']}\n")
    print(open("tools/train/results-dry/specula-tiny-eagle3.keys.txt").read(), os.path.getsize(path), "bytes")
EOF2
  tar -czf "$OUT/eagle3-dry.tar.gz" --ignore-failed-read tools/train/results-dry tests/fixtures/embedded/specula-tiny-eagle3 \
    models/specula-tiny-eagle3 || true
  echo "=== eagle3 dry run: fail=$fail"
  ;;
*)
  echo "unknown stage $stage"; exit 2 ;;
esac
ls -la "$OUT"
