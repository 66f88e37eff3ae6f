"""Per-round overhead of the four engines on one config, alternated in one invocation.

    python benchmarks/bench_engines.py --rounds 4
    python benchmarks/bench_engines.py --configs benchmarks/peers.yaml --rounds 4 --engines inprocess workers flower-sim

For each config and each pair, ``fedfew run CONFIG`` runs once per engine, one after the other
(inprocess, workers, flower-sim, flower; the order repeated per pair, so a change of the machine's
load hits every engine alike): ``runtime.engine=inprocess``, ``workers`` with two worker processes,
``runtime.engine=flower-sim`` (a private Ray instance, one CPU per actor) and
``runtime.engine=flower`` (a SuperLink and one SuperNode per client on 127.0.0.1, TLS and node
authentication on). The table gives the median seconds per round over rounds 2..R-1 (round 1 includes
each engine's start: Ray, SuperNodes, data loading; the last round always scores the final model;
``eval.every`` is set past the last round, so no other round's clock includes an evaluation) and the wall time of the whole ``fedfew
run`` (start-up and test included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each engine's own options replace the config's (peers.yaml names the workers engine's), so one config
# runs on every engine.
ENGINE_SETTINGS = {
    "inprocess": ["runtime.engine=inprocess", "runtime.engine_options={}"],
    "workers": ["runtime.engine=workers", "runtime.engine_options={workers: 2}"],
    "flower-sim": ["runtime.engine=flower-sim", "runtime.engine_options={}", "flower.sim.init_args.num_cpus=2"],
    "flower": ["runtime.engine=flower", "runtime.engine_options={}"],
}


def one_run(config: str, engine: str, rounds: int, out: Path, extra: list[str]) -> dict:
    # eval.every past the last round: only the last round evaluates (the final model's scores).
    sets = [f"federation.rounds={rounds}", f"eval.every={rounds + 1}", "runtime.checkpoint_every=0",
            *ENGINE_SETTINGS[engine], *extra]
    args = [sys.executable, "-m", "fedfew.cli.main", "run", config, "--out", str(out), "--quiet"]
    for item in sets:
        args += ["--set", item]
    started = time.perf_counter()
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    (folder,) = sorted(out.iterdir(), key=lambda p: p.stat().st_mtime)[-1:]
    seconds = [json.loads(line)["seconds"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    per_round = [b - a for a, b in zip([0.0] + seconds[:-1], seconds)]
    # Rounds 2..R-1: round 1 carries the engine's start, and the last round always evaluates (the run
    # scores its final model on validation and test whatever eval.every says).
    return {"round_s": statistics.median(per_round[1:-1]), "wall_s": wall, "rounds_s": per_round}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=[str(REPO / "src" / "fedfew" / "configs" / "demo.yaml")])
    parser.add_argument("--engines", nargs="+", default=list(ENGINE_SETTINGS), choices=list(ENGINE_SETTINGS))
    parser.add_argument("--rounds", type=int, default=4, help="at least 3 (rounds 2..R-1 are timed)")
    parser.add_argument("--pairs", type=int, default=1, help="times each engine runs, alternated")
    parser.add_argument("--set", action="append", default=[], help="more config overrides for every run")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: rounds 2..R-1 are timed")
    print(f"load average before: {open('/proc/loadavg').read().split()[:3]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        results: dict[tuple[str, str], list[dict]] = {}
        for config in args.configs:
            for pair in range(args.pairs):
                for engine in args.engines:
                    out = Path(tmp) / f"{Path(config).stem}-{engine}-{pair}"
                    out.mkdir()
                    r = one_run(config, engine, args.rounds, out, args.set)
                    results.setdefault((config, engine), []).append(r)
                    print(f"# {Path(config).name} {engine} pair {pair}: {r}", file=sys.stderr, flush=True)
        print(f"load average after: {open('/proc/loadavg').read().split()[:3]}")
        print("| config | engine | s/round (median of rounds 2..R-1) | wall s (fedfew run) |")
        print("|---|---|---|---|")
        for (config, engine), runs in results.items():
            ok = [r for r in runs if "error" in r] == []
            if not ok:
                print(f"| `{Path(config).name}` | {engine} | failed: {runs[0].get('error')} | |")
                continue
            rs = ", ".join(f"{r['round_s']:.2f}" for r in runs)
            ws = ", ".join(f"{r['wall_s']:.0f}" for r in runs)
            print(f"| `{Path(config).name}` | {engine} | {rs} | {ws} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
