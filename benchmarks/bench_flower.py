"""The per-round overhead of Flower's deployment runtime against the in-process engine, side by side.

    python benchmarks/bench_flower.py --rounds 4
    python benchmarks/bench_flower.py --configs benchmarks/peers.yaml --rounds 3

For each config, ``fedfew run`` in process and ``fedfew run --set runtime.engine=flower`` (a SuperLink
and one SuperNode per client on 127.0.0.1, TLS and node authentication on) alternate; the table gives
the median seconds per round (rounds 2..R-1: round 1 includes the nodes' data loading, the last one
the test) and where a Flower round's time goes, from the ServerApp's message log: the median over
the round's messages of the wait before a ClientApp process starts (the SuperNode polls every 3 s
when idle), the process's start and imports, its setup (reading its cached data, building the
algorithm), its compute, and the way back (the reply pushed, the server polling for it).
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
DATA = Path(os.environ.get("FEDFEW_DATA", REPO.parent / "shared" / "data"))


def run(config: str, extra: list[str], out: Path) -> tuple[float, Path]:
    command = [str(REPO / ".venv" / "bin" / "fedfew"), "run", config, "--out", str(out), "--quiet",
               "--set", f"dataset.root={DATA}"]
    for item in extra:
        command += ["--set", item]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}\n{done.stderr[-2000:]}")
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return time.perf_counter() - start, folder


def per_round(folder: Path) -> float:
    seconds = [json.loads(line)["seconds"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    rounds = [b - a for a, b in zip([0.0] + seconds[:-1], seconds)]
    return statistics.median(rounds[1:-1] or rounds)


def breakdown(folder: Path) -> dict[str, float]:
    parts: dict[str, list[float]] = {"wait for a process": [], "process start + imports": [], "setup + compute": [],
                                     "reply back": []}
    log = folder / "flower" / "messages.jsonl"
    for line in log.read_text().splitlines():
        t = json.loads(line).get("timing")
        if not t:
            continue
        parts["wait for a process"].append(t["process"] - t["sent"])
        parts["process start + imports"].append(t["started"] - t["process"])
        parts["setup + compute"].append(t["finished"] - t["started"])
        parts["reply back"].append(t["received"] - t["finished"])
    return {k: statistics.median(v) for k, v in parts.items() if v}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["src/fedfew/configs/demo.yaml", "benchmarks/peers.yaml"])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    common = [f"federation.rounds={args.rounds}", f"eval.every={args.rounds}", *args.set]
    print("| config | clients | in-process s/round | Flower s/round | overhead s/round | Flower round: wait for a "
          "process / start+imports / setup+compute / reply back (median s per message) |")
    print("|---|---|---|---|---|---|")
    for config in args.configs:
        inproc, flower, parts = [], [], {}
        clients = None
        for pair in range(args.pairs):
            order = ("inprocess", "flower") if pair % 2 == 0 else ("flower", "inprocess")
            for engine in order:
                with tempfile.TemporaryDirectory() as tmp:
                    _, folder = run(config, common + [f"runtime.engine={engine}", "runtime.engine_options={}"], Path(tmp))
                    clients = json.loads((folder / "metrics.jsonl").read_text().splitlines()[0])["clients"]["asked"]
                    if engine == "flower":
                        flower.append(per_round(folder))
                        parts = breakdown(folder)
                    else:
                        inproc.append(per_round(folder))
        a, b = statistics.median(inproc), statistics.median(flower)
        shown = " / ".join(f"{v:.2f}" for v in parts.values())
        print(f"| {config} | {len(clients or [])} | {a:.2f} | {b:.2f} | {b - a:.2f} | {shown} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
