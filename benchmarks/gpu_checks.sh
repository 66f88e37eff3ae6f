#!/usr/bin/env bash
# The one device call of issue 23 (run on a GPU machine, from the repository root, after
# benchmarks/gpu_prepare.sh filled .gpu/ here and the call carries it):
#   1. install the carried wheels; record the card, driver and torch;
#   2. the CUDA tests: pytest tests/engine/test_engines.py tests/engine/test_batched.py
#      tests/interface/test_compute.py -k cuda;
#   3. every algorithm 2 rounds on cuda against the cpu, and the batched path on cuda
#      (benchmarks/gpu_compare.py);
#   4. the peers' workload: the loop (../shared/peers/loop_pfllib_style.py --device cuda) against
#      fedfew sequential, batched, and batched bf16 on the same GPU, alternated in one invocation
#      (benchmarks/bench_peers.py), with nvidia-smi sampling GPU utilisation;
#   4b. the graph-captured batched path (issue 42): runtime.compile=reduce-overhead (torch.compile, CUDA
#      graphs captured once, replayed every round) against the eager batched path, one fedfew run each on
#      the peers' workload with nvidia-smi sampled per run (mean GPU utilisation and the seconds per round
#      into summary.txt), and the same setting as a variant of step 4;
#   5. one stored study cell at its own budget on the device (.gpu/cell.yaml: FedFSL Table 3's headline,
#      FedFSL-MI-Adv, 100 rounds x 5 local steps), its accuracy and seconds beside the CPU's stored ones.
#   6. (only when named: STEPS=calibration) the calibration study's gpu budget (issue 50): centralised
#      ProtoNet on Vinyals' Omniglot, 10,000 episodes a cell on the device, as many cells as the time
#      allows (finished cells are stored; settings in the study's order); the store's calibration folder
#      comes back as calibration_store.tgz: unpack it into studies/store/calibration here, then
#      `fedfew study docs`. CAL_BUDGET picks another budget (CAL_BUDGET=gpu-maml: first- and second-order
#      MAML, 10,000 meta-steps a cell; CAL_BUDGET=smoke for a dry run on a CPU).
# Everything goes to $OUT (at most 8 files come back): summary.txt, all.log, env.txt, pytest.xml,
# cuda_vs_cpu.json, peers_cuda.json, gpu_util.csv, cell.json. The whole script keeps to BUDGET seconds (default
# 480) so that a 540 s call leaves room; each step gets what is left, capped.
# Local dry run of the CPU parts:  GPU_CHECKS_DEVICE=cpu GPU_CHECKS_INSTALL=0 PYTHON=.venv/bin/python \
#   BUDGET=240 PAIRS=1 ROUNDS=1 OUT=/tmp/gpu_out bash benchmarks/gpu_checks.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"; mkdir -p "$OUT"
BUDGET="${BUDGET:-480}"; PAIRS="${PAIRS:-2}"; ROUNDS="${ROUNDS:-10}"
DEVICE="${GPU_CHECKS_DEVICE:-cuda}"; PYTHON="${PYTHON:-python3}"
STEPS="${STEPS:-tests compare peers graphs cell}"  # a rerun may name fewer
START=$(date +%s)
export PYTHONUNBUFFERED=1 FLWR_TELEMETRY_ENABLED=0
LOG="$OUT/all.log"; SUMMARY="$OUT/summary.txt"; : >"$LOG"; : >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY" >>"$LOG"; echo "$*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# step NAME CAP COMMAND...: run with min(CAP, time left - 5) seconds; record rc and seconds.
step() {
  local name="$1" cap="$2"; shift 2
  local limit; limit=$(( $(left) - 5 )); (( limit > cap )) && limit=$cap
  if (( limit < 15 )); then note "[$name] SKIPPED: budget spent"; return 0; fi
  local t0; t0=$(date +%s)
  echo "===== $name (limit ${limit}s) =====" >>"$LOG"
  timeout --kill-after=5 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  note "[$name] rc=$rc in $(( $(date +%s) - t0 ))s$([ $rc = 124 ] && echo ' (TIMED OUT)')"
  return 0
}

# 1. install and environment
if [ "${GPU_CHECKS_INSTALL:-1}" = 1 ]; then
  if ls .gpu/whl/*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .gpu/whl/*.whl >>"$LOG" 2>&1 && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    note "no .gpu/whl: run benchmarks/gpu_prepare.sh here first and carry .gpu"
  fi
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FEDFEW_SHARED="${FEDFEW_SHARED:-$PWD/.gpu/shared}" FEDFEW_SHARED_DATA="${FEDFEW_SHARED_DATA:-$PWD/.gpu/shared/data}"
{
  date -u; nvidia-smi 2>&1 | head -15
  "$PYTHON" -c "import torch, pydantic, fedfew; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-'); print('pydantic', pydantic.VERSION)"
} >"$OUT/env.txt" 2>&1
note "env: $(tail -2 "$OUT/env.txt" | tr '\n' ' ')"

# 2. the CUDA tests (skip cleanly without a GPU)
has tests && step cuda-tests 200 "$PYTHON" -m pytest -rfE -p no:randomly -p no:cacheprovider -o addopts="" \
  tests/engine/test_engines.py tests/engine/test_batched.py tests/interface/test_compute.py tests/run/test_experiment.py -k cuda --junitxml="$OUT/pytest.xml"
has tests && note "$(grep -Eo '[0-9]+ (passed|failed|skipped|error)[^=]*' "$LOG" | tail -1)"

# 3. every algorithm, 2 rounds, device against cpu; the batched path on the device
has compare && step cuda-vs-cpu 150 "$PYTHON" benchmarks/gpu_compare.py --device "$DEVICE" --json "$OUT/cuda_vs_cpu.json"
has compare && note "$(grep -E 'algorithms within bounds' "$LOG" | tail -1)"

# 4. the peers' workload on the same GPU, alternated, with GPU utilisation sampled
# bench_peers.py runs the loop with $PEERS_VENV/bin/python: a wrapper around this interpreter (a symlink
# would lose the venv it belongs to, and torch with it)
PEERS_VENV="$(mktemp -d)"; mkdir -p "$PEERS_VENV/bin"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$(command -v "$PYTHON" || echo "$PYTHON")" >"$PEERS_VENV/bin/python"
chmod +x "$PEERS_VENV/bin/python"
export PEERS_VENV OMNIGLOT_DIR="${OMNIGLOT_DIR:-$FEDFEW_SHARED_DATA/omniglot}"
UTIL_PID=""
if has peers && command -v nvidia-smi >/dev/null 2>&1; then  # sampled over the whole benchmark, start-ups included
  nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used --format=csv -lms 500 \
    >"$OUT/gpu_util.csv" 2>/dev/null &
  UTIL_PID=$!
fi
has peers && step peers-"$DEVICE" 300 "$PYTHON" benchmarks/bench_peers.py run --pairs "$PAIRS" --rounds "$ROUNDS" \
  --peer-device "$DEVICE" --set runtime.device="$DEVICE" --set runtime.workers=0 --set runtime.threads=2 \
  --variant sequential: --variant batched:runtime.batch_clients=true \
  --variant batched-bf16:runtime.batch_clients=true,runtime.precision=bf16 \
  --variant batched-graphs:runtime.batch_clients=true,runtime.compile=reduce-overhead --json "$OUT/peers_cuda.json"
[ -n "$UTIL_PID" ] && kill "$UTIL_PID" 2>/dev/null
grep -E '^pair |wall-time ratio|episodes/s' "$LOG" | tee -a "$SUMMARY"
if [ -s "$OUT/gpu_util.csv" ]; then
  note "gpu utilisation during the benchmark: $(awk -F', ' 'NR>1 {gsub(/ %/,"",$2); s+=$2; n++} END {if (n) printf "mean %.0f%% over %d samples", s/n, n}' "$OUT/gpu_util.csv")"
fi

# 4b. eager against graph-captured batched clients, one run each, GPU utilisation sampled per run
if has graphs; then
  for setting in "batched:runtime.compile=off" "graphs:runtime.compile=reduce-overhead"; do
    label="${setting%%:*}"; UTIL="$(mktemp)"; SAMPLER=""
    if command -v nvidia-smi >/dev/null 2>&1; then
      nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 200 >"$UTIL" 2>/dev/null &
      SAMPLER=$!
    fi
    GRAPH_RUNS="$(mktemp -d)"
    FEDFEW_DATA="$FEDFEW_SHARED_DATA" step graphs-"$label" 180 "$PYTHON" -m fedfew.cli.main run benchmarks/peers.yaml \
      --out "$GRAPH_RUNS" --quiet --set runtime.device="$DEVICE" --set runtime.workers=0 --set runtime.threads=2 \
      --set runtime.batch_clients=true --set "${setting#*:}" --set federation.rounds="$ROUNDS" --set eval.initial=auto
    [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
    { echo "===== nvidia-smi samples, $label ====="; cat "$UTIL"; } >>"$LOG"
    "$PYTHON" - "$GRAPH_RUNS" "$label" "$UTIL" <<'PY' | tee -a "$SUMMARY"
import json, pathlib, sys
runs, label, util = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
samples = [float(line.split(",")[1].strip().rstrip(" %")) for line in util.read_text().splitlines() if line.count(",") >= 2]
folder = next(iter(sorted(p for p in runs.iterdir() if p.is_dir())), None)
summary = json.loads((folder / "summary.json").read_text()) if folder and (folder / "summary.json").exists() else {}
rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()] if folder and (folder / "metrics.jsonl").exists() else []
secs = [b["seconds"] - a["seconds"] for a, b in zip(rows, rows[1:])]
steady = sorted(secs)[len(secs) // 2] if secs else None
mean = sum(samples) / len(samples) if samples else None
print(f"graphs {label}: accuracy {summary.get('test', {}).get('accuracy')}, run {summary.get('seconds')} s, "
      f"first round {rows[0]['seconds'] if rows else None} s, median later round {steady} s, "
      f"gpu utilisation mean {mean if mean is None else round(mean, 1)}% over {len(samples)} samples")
PY
  done
fi

# 5. the stored cell at its budget on the device (its config as stored; only the device differs)
if has cell && [ -s .gpu/cell.yaml ]; then
  CELL_RUNS="$(mktemp -d)"
  FEDFEW_DATA="$FEDFEW_SHARED_DATA" step cell-"$DEVICE" 240 "$PYTHON" -m fedfew.cli.main run .gpu/cell.yaml --out "$CELL_RUNS" \
    --quiet --set runtime.device="$DEVICE" --set runtime.threads=4 --set runtime.checkpoint_every=1000
  "$PYTHON" - "$CELL_RUNS" "$OUT/cell.json" <<'PY' >>"$LOG" 2>&1
import json, pathlib, sys
runs, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
cpu = json.loads(pathlib.Path(".gpu/cell_cpu.json").read_text())
folder = next(iter(sorted(runs.iterdir())), None)
summary = json.loads((folder / "summary.json").read_text()) if folder and (folder / "summary.json").exists() else None
rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()] if folder and (folder / "metrics.jsonl").exists() else []
target.write_text(json.dumps({"cpu_stored": cpu, "device_summary": summary, "device_rounds": rows}, indent=1, default=str))
acc = summary["test"]["accuracy"] if summary else None
print(f"cell: device accuracy {acc} in {summary.get('seconds') if summary else None} s; stored cpu {cpu['accuracy']} in {cpu['wall_seconds']} s; rounds logged {len(rows)}")
PY
  grep -E '^cell: ' "$LOG" | tail -1 | tee -a "$SUMMARY"
fi
# 6. the calibration study's gpu budget, as far as the time goes
if has calibration; then
  CAL_RUNS="$(mktemp -d)"; CAL_BUDGET="${CAL_BUDGET:-gpu}"
  FEDFEW_DATA="$FEDFEW_SHARED_DATA" step calibration-"$CAL_BUDGET" 560 "$PYTHON" -m fedfew.cli.main study run \
    studies/calibration.yaml --budget "$CAL_BUDGET" --runs "$CAL_RUNS"
  tar czf "$OUT/calibration_store.tgz" -C studies/store calibration
  note "calibration: $(grep -E '^study calibration' "$LOG" | tail -2 | tr '\n' ' ')"
fi
note "total $(( $(date +%s) - START ))s of ${BUDGET}s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
