"""Compute estimate of studies/benchmark_fewshot.yaml's cpu budget (docs/benchmark.md), from the runs of
its `timing` and `timing-deployed` budgets (2 rounds at the cpu sizes, 50 test tasks; FRL 2 episodes and
5 of the 30 deployment groups):

    fedfew study run studies/benchmark_fewshot.yaml --budget timing --store /tmp/t --runs /tmp/t/runs
    fedfew study run studies/benchmark_fewshot.yaml --budget timing-deployed --store /tmp/t --runs /tmp/t/runs
    python studies/estimate_compute.py /tmp/t /tmp/t/runs

Per run: R = round 1's `seconds` in metrics.jsonl (training only: round 1 has no evaluation), E = the
run's `seconds` in summary.json minus 2R (the round-2 evaluation and the final test). A cpu cell is
20 R + 4 E (200 test tasks instead of 50; FRL 5 R and E x 30/5 groups). Data loading is not counted
(a study loads each dataset once per process)."""
import json
import sys
from pathlib import Path

store, runs = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for rec in sorted(store.glob("*/*.json")):
    r = json.loads(rec.read_text())
    name = r["config"]["name"]
    folders = [p for p in runs.rglob("summary.json") if p.parent.name.startswith(name)]
    if not folders:
        continue
    folder = folders[0].parent
    hist = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    S = json.loads((folder / "summary.json").read_text())["seconds"]
    W = r.get("wall_seconds", S)
    R = hist[0]["seconds"]
    E = S - 2 * R
    groups = r["config"]["algorithm"]["options"].get("deployment", {}).get("groups")
    scale = 30 / groups if groups else 200 / 50
    cpu_rounds = 5 if r["method"] == "FRL" else 20
    est = cpu_rounds * R + scale * E
    rows.append((r["method"], r["setting"], W, W - S, R, E, est))
print("| method | setting | timing run s | one round R s | evaluation E s | cpu cell estimate s |")
print("|---|---|---|---|---|---|")
for m, s, W, setup, R, E, est in sorted(rows, key=lambda r: (r[1], r[0])):
    print(f"| {m} | {s} | {W - setup:.0f} | {R:.1f} | {E:.0f} | {est:.0f} |")

# Totals of the cpu budget (3 seeds): per dataset, 2 distributions x (1-shot at 1x + 5-shot at 1x..2x).
est = {(m, s.split()[0]): e for m, s, W, setup, R, E, e in rows}
evals = {(m, s.split()[0]): E for m, s, W, setup, R, E, e in rows}
print()
print("| dataset | one seed, episodic rows | one seed, FRL + Per-FedAvg | one seed, controls | 3 seeds, total (h) |")
print("|---|---|---|---|---|")
grand = [0.0, 0.0]
for d in ("Omniglot", "FEMNIST", "HuffPost"):
    if (("FL-MAML", d) not in est) or (("FRL", d) not in est) or (("Per-FedAvg", d) not in est):
        continue
    maml, adv = est[("FL-MAML", d)], est[("FedFSL-MI-Adv", d)]
    row_lo = 2 * maml + 3 * maml + adv + est[("FL-Proto", d)] + est[("F2L", d)]   # Local, FL-MAML, naive/prox/MI low, MI-Adv
    row_hi = 2 * maml + 3 * adv + adv + est[("FL-Proto", d)] + est[("F2L", d)]
    episodic = (2 * (row_lo + row_lo), 2 * (row_hi + 2 * row_hi))  # IID/non-IID x (1-shot + 5-shot)
    deployed = 2 * (est[("FRL", d)] + est[("Per-FedAvg", d)])
    control = 4 * 4 * evals[("FL-MAML", d)]
    lo, hi = (3 * (episodic[i] + deployed + control) / 3600 for i in (0, 1))
    grand[0] += lo
    grand[1] += hi
    print(f"| {d} | {episodic[0]/60:.0f}-{episodic[1]/60:.0f} min | {deployed/60:.0f} min | {control/60:.0f} min | {lo:.1f}-{hi:.1f} |")
print(f"| all | | | | {grand[0]:.1f}-{grand[1]:.1f} |")
