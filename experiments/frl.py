"""FRL (Park et al. 2021): Tables 1-3, Fig. 2 and the mismatched-R study, written into docs/frl/.

Each method's config (configs/frl/<dataset>_<method>.yaml) is prepared once; the prepared model is
then deployed under every protocol (section 2.3) on the same seeded groups:

* Table 2's protocol: non-IID groups of K = 10 clients, two single-class shards each, tau = 5
  unseen classes (the configs' own deployment options);
* Table 1's protocol: the same with IID groups (every client holds all tau classes);
* Table 3's protocol: non-IID groups of 2 unseen + 3 seen classes (seen-class samples no
  participant holds); the paper runs it on CIFAR-100 and mini-ImageNet only;
* mismatched R: FRL prepared for R = 3, deployed with R = 1, 2, 3, 5 (non-IID);
* Fig. 2: deployment accuracy (``--fig-groups`` groups) at checkpoints of the preparation stage,
  against preparation rounds (an FRL episode counts R + 1 rounds);
* the untrained control: FRL's deployment (R rounds of prototype FL, distance to the global
  prototypes) from the initial model, before any preparation, on the same groups. The linear-head
  baselines' control is "FedAvg from random init." itself (the same deployment from round 0).

Results are cached per method in docs/frl/<folder>/<method>.json (``--force`` recomputes);
``--tables-only`` rebuilds the markdown and the figure from the cache. ``--scale K`` multiplies the
preparation rounds of every method (``--groups G``: G deployment groups) and writes to
docs/frl/<dataset>_x<K>/, for the headline cell at a larger budget.

    .venv/bin/python experiments/frl.py --dataset femnist
    .venv/bin/python experiments/frl.py --dataset femnist --only frl finetune
    .venv/bin/python experiments/frl.py --dataset femnist --scale 5 --groups 100 --only frl finetune scratch \
        --protocols table2_noniid
    .venv/bin/python experiments/frl.py --dataset omniglot
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from fedfew.config import load_config
from fedfew.engine.algorithm import Algorithm
from fedfew.engine.simulator import Simulator
from fedfew.experiment import build_experiment

ROOT = Path(__file__).resolve().parents[1]

#: (method key, label in the tables); configs are configs/frl/<dataset>_<key>.yaml.
METHODS = [
    ("scratch", "FedAvg from random init."),
    ("finetune", "Fine-tuning via FedAvg"),
    ("oneshot", "Fine-tuning via one-shot FL (at deployment, as the paper)"),
    ("oneshot_preparation", "(ours) one-shot FL in the preparation stage"),
    ("per_fedavg_fo", "Personalized FL: linear (Per-FedAvg FO), Xavier head at deployment"),
    ("per_fedavg_hf", "Personalized FL: linear (Per-FedAvg HF), Xavier head at deployment"),
    ("per_fedavg_fo_meta", "Personalized FL: linear (Per-FedAvg FO), meta-learned head"),
    ("per_fedavg_hf_meta", "Personalized FL: linear (Per-FedAvg HF), meta-learned head"),
    ("per_fedavg_distance", "Personalized FL: distance-based (Per-FedAvg FO)"),
    ("frl_linear", "FRL, linear classifier, Xavier head per episode"),
    ("frl_linear_meta", "FRL, linear classifier, meta-learned head"),
    ("frl_distance", "FRL, distance-based"),
    ("frl", "FRL, distance-based + GPAL"),
    ("frl_additive", "(ours) FRL, distance-based + GPAL, eq. 3 additive as the authors' code"),
    ("frl_authors", "FRL, authors'-code preset"),
]
#: The paper's FEMNIST numbers (%, mean ± 95% CI over 1000 groups): Table 2 (non-IID) and Table 1
#: (IID); its Table 3 has no FEMNIST column. Per-FedAvg's rows are "Personalized FL: linear
#: classifier [4]" (the paper does not say FO or HF).
PAPER_FEMNIST = {
    "scratch": ("59.22 ± 0.18", "74.76 ± 0.35"),
    "finetune": ("58.23 ± 0.65", "91.95 ± 0.28"),
    "oneshot": ("57.88 ± 0.67", "93.62 ± 0.26"),
    "per_fedavg_fo": ("80.59 ± 0.51", "93.19 ± 0.12"),
    "per_fedavg_hf": ("80.59 ± 0.51", "93.19 ± 0.12"),
    "per_fedavg_distance": ("88.07 ± 0.37", "94.11 ± 0.12"),
    "frl_linear": ("85.14 ± 0.44", "94.86 ± 0.13"),
    "frl_linear_meta": ("85.14 ± 0.44", "94.86 ± 0.13"),
    "per_fedavg_fo_meta": ("80.59 ± 0.51", "93.19 ± 0.12"),
    "per_fedavg_hf_meta": ("80.59 ± 0.51", "93.19 ± 0.12"),
    "frl_distance": ("88.60 ± 0.42", "95.07 ± 0.10"),
    "frl": ("92.42 ± 0.32", "96.61 ± 0.09"),
}
#: methods whose untrained (round-0) model is also deployed, with every protocol they are scored on
UNTRAINED = ("frl",)
#: protocol key -> (column title, changes to the deployment options)
PROTOCOLS = {
    "table2_noniid": ("non-IID, 5 unseen (Table 2)", {}),
    "table1_iid": ("IID, 5 unseen (Table 1)", {"iid": True}),
    "table3_seen": ("non-IID, 2 unseen + 3 seen (Table 3's protocol)", {"seen_classes": 3}),
}
#: protocols scored for each (dataset, method) when not all of them (compute budget; see docs/frl.md)
PROTOCOLS_OF: dict[str, dict[str, list[str]]] = {
    "femnist": {key: ["table2_noniid"] for key in ("frl_linear", "frl_distance", "frl_authors", "per_fedavg_fo",
                                                    "per_fedavg_hf", "per_fedavg_distance",
                                                    "frl_additive", "frl_linear_meta", "per_fedavg_fo_meta",
                                                    "per_fedavg_hf_meta")},
    # Omniglot participants hold whole characters (2 shards x 10 of 20 drawings): no seen-class
    # sample is left for Table 3.
    "omniglot": {key: ["table2_noniid", "table1_iid"] for key, _ in METHODS},
}
MISMATCHED_R = [1, 2, 5]
#: methods whose preparation is also scored along the way (Fig. 2)
FIGURE_METHODS = ("frl", "finetune")
FIGURE_POINTS = 4
FIGURE_DATASETS = ("femnist",)


def evaluate_with(algorithm: Algorithm, simulator: Any, test: Any, **changes: Any) -> dict[str, float]:
    """The algorithm's deployment score with its deployment options changed for this call only."""
    options = algorithm.options
    deployment = options.deployment.model_copy(update=changes)  # type: ignore[attr-defined]
    algorithm.options = options.model_copy(update={"deployment": deployment})
    try:
        start = time.perf_counter()
        result = simulator.evaluate(test)
        result["seconds"] = time.perf_counter() - start
        return result
    finally:
        algorithm.options = options


def rounds_per_step(config: Any) -> int:
    """Preparation-stage communication rounds of one simulator round (R + 1 for an FRL episode)."""
    if config.algorithm.name == "frl":
        return int(config.algorithm.options.get("rounds", 3)) + 1
    if config.algorithm.name == "frl-scratch":
        return 0
    return 1


def run_method(dataset: str, key: str, fig_groups: int, threads: int, overrides: list[str], scale: int = 1,
               groups: int | None = None, only_protocols: list[str] | None = None,
               mismatched: bool = True) -> dict[str, Any]:
    path = ROOT / "configs" / "frl" / f"{dataset}_{key}.yaml"
    config = load_config(path, overrides)
    extra = []
    if scale != 1 and rounds_per_step(config) > 0 and config.federation.rounds > 1:
        extra.append(f"federation.rounds={config.federation.rounds * scale}")
    if groups is not None:
        extra.append(f"algorithm.options.deployment.groups={groups}")
    if extra:
        config = load_config(path, [*overrides, *extra])
    protocols = PROTOCOLS_OF.get(dataset, {}).get(key)
    if only_protocols:
        protocols = [p for p in (protocols or list(PROTOCOLS)) if p in only_protocols]
    torch.set_num_threads(threads)
    experiment = build_experiment(config)
    torch.set_num_threads(threads)
    # No test data in the simulator: it would score the last round with the full G; the protocols
    # below score the prepared model instead.
    simulator = Simulator(experiment.algorithm, experiment.clients, config.seed)
    algorithm = experiment.algorithm
    per_step = rounds_per_step(config)
    total = config.federation.rounds
    in_figure = key in FIGURE_METHODS and dataset in FIGURE_DATASETS
    checkpoints = {max(1, round(total * (i + 1) / FIGURE_POINTS)) for i in range(FIGURE_POINTS)} if in_figure else set()
    curve: list[dict[str, float]] = []
    if in_figure:
        start = evaluate_with(algorithm, simulator, experiment.test, groups=fig_groups)
        curve.append({"rounds": 0, "accuracy": start["accuracy"], "ci95": start["ci95"]})
    untrained: dict[str, Any] = {}
    if key in UNTRAINED:  # the same deployment from the initial model, on the same groups
        for protocol, (_, changes) in PROTOCOLS.items():
            if protocols is not None and protocol not in protocols:
                continue
            untrained[protocol] = evaluate_with(algorithm, simulator, experiment.test, **changes)
            print(f"  {key}: untrained, {protocol}: {fmt(untrained[protocol])}", flush=True)

    def on_round(r: int, record: dict[str, float]) -> None:
        if r in checkpoints:
            score = evaluate_with(algorithm, simulator, experiment.test, groups=fig_groups)
            curve.append({"rounds": r * per_step, "accuracy": score["accuracy"], "ci95": score["ci95"],
                          "seconds": score["seconds"]})
            print(f"  {key}: step {r}/{total}: {100 * score['accuracy']:.2f} ± {100 * score['ci95']:.2f}", flush=True)

    start = time.perf_counter()
    # eval.every beyond the run: the simulator scores nothing itself; the protocols below do.
    outcome = simulator.run(total, config.federation.clients_per_round, total + 1, False, on_round)
    # Fig. 2's evaluations ran inside the preparation loop: their time is not preparation.
    preparation_seconds = time.perf_counter() - start - sum(p.get("seconds", 0.0) for p in curve[1:])
    comm = outcome["comm"]
    result: dict[str, Any] = {
        "method": key,
        "config": str(path.relative_to(ROOT)),
        "algorithm": config.algorithm.name,
        "simulator_rounds": total,
        "preparation_rounds": total * per_step,
        "preparation_mb": (sum(comm.down) + sum(comm.up)) / 1e6,
        "preparation_seconds": preparation_seconds,
        "last_train_metrics": {k: v for k, v in outcome["history"][-1].items() if k.startswith("train_")},
        "protocols": {},
        "curve": curve,
        "untrained": untrained,
        "groups": int(config.algorithm.options.get("deployment", {}).get("groups", 1000)),
        "overrides": [*overrides, *extra],
    }
    for protocol, (_, changes) in PROTOCOLS.items():
        if protocols is not None and protocol not in protocols:
            continue
        score = evaluate_with(algorithm, simulator, experiment.test, **changes)
        result["protocols"][protocol] = score
        print(f"  {key}: {protocol}: {100 * score['accuracy']:.2f} ± {100 * score['ci95']:.2f} "
              f"({score['seconds']:.0f} s)", flush=True)
    if key == "frl" and mismatched:
        result["mismatched_r"] = {}
        for rounds in MISMATCHED_R:
            score = evaluate_with(algorithm, simulator, experiment.test, rounds=rounds)
            result["mismatched_r"][str(rounds)] = score
            print(f"  {key}: deployed with R={rounds}: {100 * score['accuracy']:.2f} ± {100 * score['ci95']:.2f}",
                  flush=True)
    return result


def fmt(score: dict[str, float] | None) -> str:
    if not score:
        return "not run"
    return f"{100 * score['accuracy']:.2f} ± {100 * score['ci95']:.2f}"


def write_tables(dataset: str, folder: Path) -> str:
    """The markdown table of every cached method in ``folder`` (docs/frl/<tag>/), with the paper's
    FEMNIST numbers beside ours, the untrained control, the mismatched-R study and Fig. 2."""
    tag = folder.name
    results = {key: json.loads((folder / f"{key}.json").read_text())
               for key, _ in METHODS if (folder / f"{key}.json").exists()}
    if not results:
        return ""
    counts = sorted({int(v["groups"]) for r in results.values() for v in r["protocols"].values()})
    used = [p for p in PROTOCOLS if any(p in r["protocols"] for r in results.values())]
    paper = dataset == "femnist"
    paper_titles = ["paper, Table 2 FEMNIST", "paper, Table 1 FEMNIST"] if paper else []
    lines = [f"# FRL on {dataset}: deployment accuracy (%) ± 95% CI over {'/'.join(map(str, counts))} groups", "",
             "Generated by `.venv/bin/python experiments/frl.py --dataset " + dataset
             + (f" {results[next(iter(results))].get('cli', '')}" if tag != dataset else "") + "`; configs in "
             "`configs/frl/" + dataset + "_*.yaml`.", "",
             "| method | preparation rounds | preparation MB | " + " | ".join(PROTOCOLS[p][0] for p in used)
             + "".join(f" | {t}" for t in paper_titles) + " | preparation s |",
             "|---|---|---|" + "---|" * (len(used) + len(paper_titles)) + "---|"]
    for key, label in METHODS:
        if key not in results:
            continue
        r = results[key]
        cells = " | ".join(fmt(r["protocols"].get(p)) for p in used)
        paper_cells = "".join(f" | {v}" for v in PAPER_FEMNIST.get(key, ("—", "—"))) if paper else ""
        lines.append(f"| {label} | {r['preparation_rounds']} | {r['preparation_mb']:.1f} | {cells}{paper_cells} | "
                     f"{r['preparation_seconds']:.0f} |")
        if r.get("untrained"):
            cells = " | ".join(fmt(r["untrained"].get(p)) for p in used)
            paper_cells = " | — | —" if paper else ""
            lines.append(f"| (control) {label}: the untrained initial model, same deployment | 0 | 0.0 | {cells}"
                         f"{paper_cells} | 0 |")
    if "frl" in results and results["frl"].get("mismatched_r"):
        by_r = {int(k): v for k, v in results["frl"]["mismatched_r"].items()}
        by_r[3] = results["frl"]["protocols"]["table2_noniid"]  # the R it was prepared for
        order = sorted(by_r)
        lines += ["", "### Mismatched R: FRL prepared for R = 3, deployed with R rounds (non-IID, 5 unseen)", "",
                  "| R at deployment | " + " | ".join(str(r) for r in order) + " |",
                  "|---|" + "---|" * len(order),
                  "| accuracy (%) | " + " | ".join(fmt(by_r[r]) for r in order) + " |"]
    curves = {key: results[key]["curve"] for key in FIGURE_METHODS if key in results and results[key]["curve"]}
    if curves:
        lines += ["", "### Fig. 2: deployment accuracy versus preparation rounds (non-IID, 5 unseen)", "",
                  f"![Fig. 2]({tag}/fig2.png)", "", "| method | " + " | ".join(["rounds: accuracy"]) + " |",
                  "|---|---|"]
        for key, points in curves.items():
            text = "; ".join(f"{p['rounds']}: {100 * p['accuracy']:.1f} ± {100 * p['ci95']:.1f}" for p in points)
            lines.append(f"| {dict(METHODS)[key]} | {text} |")
        plot_curves(curves, folder / "fig2.png", dataset)
    text = "\n".join(lines) + "\n"
    (folder.parent / f"tables_{tag}.md").write_text(text)
    splice(folder.parent.parent / "frl.md", tag, text.split("\n", 1)[1].lstrip("\n"))
    return text


def splice(page: Path, dataset: str, text: str) -> None:
    """Put ``text`` between the page's ``<!-- frl-results:<dataset> -->`` markers (if the page has them)."""
    begin, end = f"<!-- frl-results:{dataset} begin -->", f"<!-- frl-results:{dataset} end -->"
    if not page.exists():
        return
    content = page.read_text()
    if begin not in content or end not in content:
        return
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    # the page lives one folder up from the tables: its image links need the frl/ prefix
    page.write_text(head + begin + "\n" + text.replace("](" + dataset + "/", "](frl/" + dataset + "/") + end + tail)


def plot_curves(curves: dict[str, list[dict[str, float]]], path: Path, dataset: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for key, points in curves.items():
        x = [p["rounds"] for p in points]
        y = [100 * p["accuracy"] for p in points]
        err = [100 * p["ci95"] for p in points]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=dict(METHODS)[key])
    ax.set_xlabel("preparation-stage communication rounds")
    ax.set_ylabel("deployment accuracy (%)")
    ax.set_title(f"FRL vs fine-tuning via FedAvg ({dataset}, R = 3)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="femnist", choices=["femnist", "omniglot"])
    parser.add_argument("--only", nargs="*", help="method keys to (re)compute (default: every config present)")
    parser.add_argument("--force", action="store_true", help="recompute methods already in the cache")
    parser.add_argument("--fig-groups", type=int, default=20, help="groups per Fig. 2 point")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tables-only", action="store_true")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides for every config (a quick check; the docs use none)")
    parser.add_argument("--scale", type=int, default=1, help="multiply every method's preparation rounds")
    parser.add_argument("--groups", type=int, help="deployment groups (default: the configs')")
    parser.add_argument("--protocols", nargs="*", choices=list(PROTOCOLS), help="score only these protocols")
    parser.add_argument("--out", default=str(ROOT / "docs" / "frl"))
    args = parser.parse_args()
    folder = Path(args.out) / (args.dataset if args.scale == 1 else f"{args.dataset}_x{args.scale}")
    folder.mkdir(parents=True, exist_ok=True)
    cli = " ".join([f"--scale {args.scale}"] * (args.scale != 1) + [f"--groups {args.groups}"] * (args.groups is not None)
                   + ([f"--protocols {' '.join(args.protocols)}"] if args.protocols else []))
    if not args.tables_only:
        for key, label in METHODS:
            if args.only and key not in args.only:
                continue
            if not (ROOT / "configs" / "frl" / f"{args.dataset}_{key}.yaml").exists():
                continue
            target = folder / f"{key}.json"
            if target.exists() and not args.force:
                continue
            print(f"{label} ({key})", flush=True)
            start = time.perf_counter()
            result = run_method(args.dataset, key, args.fig_groups, args.threads, args.set, args.scale, args.groups,
                                args.protocols, mismatched=args.scale == 1)
            result["total_seconds"] = time.perf_counter() - start
            result["cli"] = cli
            target.write_text(json.dumps(result, indent=1))
            print(f"  {key}: done in {result['total_seconds']:.0f} s", flush=True)
    print(write_tables(args.dataset, folder))


if __name__ == "__main__":
    # The committed configs name no data folder: read $FEDFEW_DATA, else the repository's sibling
    # ../shared/data where these results were produced.
    os.environ.setdefault("FEDFEW_DATA", str(ROOT.parent / "shared" / "data"))
    main()
