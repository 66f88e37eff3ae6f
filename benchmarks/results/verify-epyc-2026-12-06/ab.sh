#!/bin/bash
# A/B on this machine: each cell that verify judged outside tolerance across environments, run as an
# ordinary `fedfew run` of its resolved config by the code before the batch (c96c86a, sources 1a4a6d0c6b2c)
# and after it (sources 55a616f3aeec), alternately; then their numbers compared exactly.
export FEDFEW_DATA=/work/shared/data PYTHONUNBUFFERED=1
PY=/work/main/.venv/bin/python
out=/work/ab; mkdir -p $out
while read study cellglob; do
  cfg=$(ls -d /work/runs-verify/$study/*/$cellglob 2>/dev/null | head -1)/config.yaml
  [ -f "$cfg" ] || { echo "no run for $study $cellglob"; continue; }
  for side in old; do
    src=/work/frozen/src; [ $side = new ] && src=/work/verify-wt/src
    echo "=== $study $cellglob $side $(date +%T)"
    (cd /tmp && PYTHONPATH=$src $PY -m fedfew run "$cfg" --out $out/$side/$study --quiet)
  done
done < /work/ab_cells.txt
