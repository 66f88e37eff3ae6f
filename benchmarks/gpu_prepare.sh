#!/usr/bin/env bash
# Run HERE (a machine with network), from the repository root, before a device call: fills .gpu/
# (ignored by git; name it in the device call's `carry`) with what the bare GPU machine lacks:
#   .gpu/whl/            pydantic and its needs as Python 3.12 wheels (the device image has no pydantic)
#   .gpu/shared/data/omniglot   the peers' workload data (../shared does not travel)
#   .gpu/shared/peers/          the peers' loop
# Then, with the device tool:  run(command="bash benchmarks/gpu_checks.sh", carry=[".gpu"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${FEDFEW_SHARED:-../shared}"
PYTHON="${PYTHON:-python3}"
mkdir -p .gpu/whl .gpu/shared/data
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing-extensions==4.16.0
rm -rf .gpu/shared/data/omniglot .gpu/shared/peers
cp -r "$SHARED/data/omniglot" .gpu/shared/data/
cp -r "$SHARED/peers" .gpu/shared/peers
rm -rf .gpu/shared/peers/__pycache__
du -sh .gpu
echo "ready: carry .gpu and run benchmarks/gpu_checks.sh"
