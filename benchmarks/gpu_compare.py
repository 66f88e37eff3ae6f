"""Every registered algorithm for 2 rounds on ``--device`` against the CPU, on the small configs of
tests/tiny.py, and the batched path (``runtime.batch_clients``) where the algorithm supports it.

    python benchmarks/gpu_compare.py --device cuda --json cuda_vs_cpu.json

Prints one line per algorithm: the largest relative difference of the per-round mean client loss,
the test accuracies, and the seconds each run took; writes all of it to ``--json``. The tests'
tolerance for a device against the CPU is 0.15 in test accuracy (tests/engine/test_engines.py) and a
relative 1e-3 in per-round losses for the batched path on CUDA (tests/engine/test_batched.py); this script
reports the numbers and marks rows outside those bounds, it does not stop at the first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.tiny

from fedfew.config.validation import load_config  # noqa: E402
from fedfew.run.experiment import build_experiment  # noqa: E402
from tests.tiny import ALGORITHM_SETUPS, tiny_config  # noqa: E402

LOSS_REL, ACCURACY_ABS = 1e-3, 0.15


def one_run(name: str, overrides: list[str]) -> dict[str, Any]:
    cfg = load_config(tiny_config(name, federation={"rounds": 2}), overrides)
    start = time.perf_counter()
    simulator = build_experiment(cfg).simulator()
    try:
        out = simulator.run(cfg.federation.rounds, cfg.federation.clients_per_round, 1)
    finally:
        simulator.engine.close()
    losses = [row.get("train_loss") for row in out["history"]]
    return {"seconds": time.perf_counter() - start, "losses": losses, "test": out["test"]}


def compare(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    pairs = [(a, b) for a, b in zip(base["losses"], other["losses"]) if a is not None and b is not None]
    rel = max((abs(b - a) / max(abs(a), 1e-12) for a, b in pairs), default=0.0)
    acc = abs(other["test"].get("accuracy", 0.0) - base["test"].get("accuracy", 0.0))
    return {"loss_rel": rel, "accuracy_diff": acc}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="algorithm names (default: all)")
    args = parser.parse_args()
    rows: dict[str, Any] = {}
    for name in sorted(args.only or ALGORITHM_SETUPS):
        row: dict[str, Any] = {}
        try:
            row["cpu"] = one_run(name, ["runtime.device=cpu"])
            row["device"] = one_run(name, [f"runtime.device={args.device}"])
            row["device_vs_cpu"] = compare(row["cpu"], row["device"])
            try:
                row["batched"] = one_run(name, [f"runtime.device={args.device}", "runtime.batch_clients=true"])
                row["batched_vs_cpu"] = compare(row["cpu"], row["batched"])
            except ValueError as err:  # not supported: a usage error naming runtime.batch_clients
                row["batched"] = f"unsupported: {str(err).splitlines()[0][:120]}"
        except Exception as err:  # record and go on: one failing algorithm must not hide the others
            row["error"] = f"{type(err).__name__}: {err}"
            row["traceback"] = traceback.format_exc()[-3000:]
        rows[name] = row
        print(summary_line(name, row), flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2, default=str))
    bad = [n for n, r in rows.items() if "error" in r or not within(r)]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} algorithms within bounds on {args.device}"
          + (f"; outside or failed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def within(row: dict[str, Any]) -> bool:
    ok = row["device_vs_cpu"]["accuracy_diff"] <= ACCURACY_ABS
    if isinstance(row.get("batched"), dict):
        ok = ok and row["batched_vs_cpu"]["loss_rel"] <= LOSS_REL
    return ok


def summary_line(name: str, row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{name:26s} ERROR {row['error'][:150]}"
    d = row["device_vs_cpu"]
    line = (f"{name:26s} loss rel {d['loss_rel']:.1e}  test acc cpu {row['cpu']['test'].get('accuracy', 0):.3f} "
            f"dev {row['device']['test'].get('accuracy', 0):.3f}  s cpu {row['cpu']['seconds']:.1f} "
            f"dev {row['device']['seconds']:.1f}")
    if isinstance(row.get("batched"), dict):
        line += f"  batched loss rel {row['batched_vs_cpu']['loss_rel']:.1e} s {row['batched']['seconds']:.1f}"
    return line + ("" if within(row) else "  OUTSIDE")


if __name__ == "__main__":
    sys.exit(main())
