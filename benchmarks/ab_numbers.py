"""Two versions of fedfew's number code on one machine, compared exactly: every registered algorithm's
small config (tests/tiny.py) run by the command line, plus a private run in research mode, the workers
engine and the batched clients, written under ``--out``; ``--compare A B`` then compares two such
folders run by different checkouts, summary.json and every round of metrics.jsonl, with the clock, the
code version and the environment left out.

Not a test (it takes minutes and needs two checkouts): the evidence a refactoring of hashed code
(``fedfew.core.codeversion``) changed no number, beside ``fedfew study verify``, which compares a
study's stored cells. Run each checkout with its own ``src`` first on ``PYTHONPATH``::

    PYTHONPATH=OLD/src python benchmarks/ab_numbers.py --out /tmp/ab-old
    PYTHONPATH=NEW/src python benchmarks/ab_numbers.py --out /tmp/ab-new
    python benchmarks/ab_numbers.py --compare /tmp/ab-old /tmp/ab-new
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.tiny import ALGORITHM_SETUPS, tiny_config  # noqa: E402

#: Keys that differ between two equal runs (the clock, the code version, the machine, the folder).
UNCOMPARED = {"seconds", "data_seconds", "seconds_resumed_from", "wall_seconds", "code", "fedfew", "versions",
              "environment", "run_folder", "folder", "started", "finished", "updated", "timing", "host", "pid"}
#: Extra runs beside each algorithm's own: (name, algorithm, --set values).
VARIANTS = [
    ("fl-proto-dp-seeded", "fl-proto", ["privacy.mechanism=central-dp", "privacy.noise=seeded", "privacy.noise_multiplier=1.0",
                                        "privacy.clip=1.0", "privacy.delta=1e-3"]),
    ("fedavg-local-dp-seeded", "fedavg", ["privacy.mechanism=local-dp", "privacy.noise=seeded", "privacy.noise_multiplier=1.0",
                                    "privacy.clip=1.0", "privacy.delta=1e-3"]),
    ("fl-maml-workers", "fl-maml", ["runtime.engine=workers", "runtime.engine_options={workers: 2}"]),
    ("fl-proto-batched", "fl-proto", ["runtime.batch_clients=true"]),
    ("f2l-faults", "f2l", ["federation.dropout=0.25", "federation.stragglers=0.25"]),
]


def runs() -> list[tuple[str, str, list[str]]]:
    return [(name, name, []) for name in sorted(ALGORITHM_SETUPS)] + VARIANTS


def run_all(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, algorithm, sets in runs():
        config = out / f"{name}.yaml"
        config.write_text(yaml.safe_dump(tiny_config(algorithm)))
        args = [sys.executable, "-m", "fedfew.cli.main", "run", str(config), "--out", str(out / name), "--quiet"]
        for value in sets:
            args += ["--set", value]
        done = subprocess.run(args, capture_output=True, text=True, env=os.environ)
        print(f"{name}: rc={done.returncode} {done.stderr.strip().splitlines()[-1:] if done.returncode else ''}",
              flush=True)
        failed += done.returncode != 0
    return 1 if failed else 0


def strip(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if k not in UNCOMPARED}
    if isinstance(obj, list):
        return [strip(v) for v in obj]
    return obj


def run_folder(base: Path) -> Path:
    (folder,) = [p for p in base.iterdir() if p.is_dir()]
    return folder


def differences(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in {'A' if k in a else 'B'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:80]} != {str(b)[:80]}"]


def compare(first: Path, second: Path) -> int:
    unequal = 0
    for name, _, _ in runs():
        try:
            a, b = run_folder(first / name), run_folder(second / name)
        except (FileNotFoundError, ValueError):
            print(f"{name}: missing in one of the two")
            unequal += 1
            continue
        found = []
        for file in ("summary.json", "metrics.jsonl"):
            read = (lambda p: [json.loads(line) for line in p.read_text().splitlines()]) if file.endswith("l") \
                else (lambda p: json.loads(p.read_text()))
            found += differences(strip(read(a / file)), strip(read(b / file)), file)
        print(f"{name}: {'identical' if not found else 'DIFFERENT: ' + '; '.join(found[:3])}")
        unequal += bool(found)
    print(f"{len(runs()) - unequal} of {len(runs())} runs identical")
    return 1 if unequal else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="run every config into this folder")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"), help="compare two such folders")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("give --out or --compare")
    return run_all(args.out)


if __name__ == "__main__":
    sys.exit(main())
