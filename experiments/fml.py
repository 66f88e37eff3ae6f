"""FML (Shen et al. 2020): the experiments behind docs/fml.md, from the configs in configs/fml/.

    .venv/bin/python experiments/fml.py tables     # Tables 1-2 and Fig. 5 (global and local accuracy)
    .venv/bin/python experiments/fml.py catfish    # section 6: one strong private model among weak ones
    .venv/bin/python experiments/fml.py newcomer   # Fig. 4: a new participant adapts by DML
    .venv/bin/python experiments/fml.py control    # the untrained control: each table cell's global model at round 0
    .venv/bin/python experiments/fml.py long --rounds 100   # MNIST MLP IID, FedAvg and FML for 5x our rounds
    .venv/bin/python experiments/fml.py all
    .venv/bin/python experiments/fml.py report     # re-render docs/fml/ from the saved JSON

Each config holds the FML setting; FedAvg runs on the same data with the same training options
(local epochs, batch size, SGD with momentum 0.9, lr) and uniform aggregation, as the paper compares
them. Rounds are driven with the engine's ``run_round`` on the simulator's own initial states (so a
run here equals ``fedfew run CONFIG``), evaluating every round: the global model on the held-out test
set, and each client's local model on its private validation set (FML: its private model; FedAvg: the
global model after the client's local training, i.e. its upload). Writes into docs/fml/.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from fedfew.algorithms.common import TrainOptions
from fedfew.algorithms.fml import FML
from fedfew.config import load_config
from fedfew.engine import client_schedule, load_state_
from fedfew.engine.simulator import simulate_round
from fedfew.evaluation import dataset_accuracy, mean_ci95
from fedfew.experiment import build_experiment
from fedfew.seeding import torch_generator

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "fml"

#: (config, models, label, seeds): the columns of Tables 1 and 2. MNIST is cheap enough for three
#: seeds; FEMNIST gets one (compute budget).
TABLE_COLUMNS = [
    ("mnist", ["mlp", "lenet5"], "MNIST", [0, 1, 2]),
    ("femnist", ["cnn1"], "FEMNIST", [0]),
]
#: The dynamic alpha/beta schedule is run where it is cheap (compute budget).
DYNAMIC_COLUMNS = {("mnist", "mlp")}
MODEL_LABEL = {"mlp": "MLP", "lenet5": "LeNet-5", "cnn1": "CNN1", "cnn2": "CNN2", "resnet18": "ResNet-18"}
METHODS = ["fedavg", "fml", "fml-dynamic"]
#: The paper's Tables 1 (IID) and 2 (non-IID), global accuracy (%), as extracted from its text, whose
#: header reads "MNIST | CIFAR10 | CIFAR100" over "MLP LeNet5 | CNN1 CNN2 | CNN2 ResNet18" (two model
#: columns per dataset as printed; LeNet5 at 68.13% on MNIST suggests the grouping may be MNIST: MLP,
#: CIFAR10: LeNet5 CNN1 CNN2; the text cannot settle it). Keyed by our model.
PAPER_TABLES = {
    "iid": {"fedavg": {"mlp": "98.27", "lenet5": "68.13", "cnn1": "81.23"},
            "fml": {"mlp": "98.36", "lenet5": "72.09", "cnn1": "82.89"}},
    "noniid": {"fedavg": {"mlp": "90.98", "lenet5": "50.21", "cnn1": "59.69"},
               "fml": {"mlp": "91.10", "lenet5": "50.45", "cnn1": "62.45"}},
}
PAPER_COLUMN = {"mlp": "MNIST MLP", "lenet5": "LeNet5, MNIST as printed", "cnn1": "CIFAR-10 CNN1"}
METHOD_LABEL = {"fedavg": "FedAvg", "fml": "FML", "fml-dynamic": "FML, dynamic α/β"}


# -- configs -------------------------------------------------------------------------------------


def read_config(name: str) -> dict[str, Any]:
    return yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())


def variant(base: dict[str, Any], method: str, model: str | None = None, seed: int | None = None) -> dict[str, Any]:
    """``base`` (an FML config) run as ``method``: fedavg with FML's training options and uniform
    aggregation, fml as configured, or fml-dynamic (section 6's schedule over all rounds)."""
    config = copy.deepcopy(base)
    if model is not None:
        config["model"] = {"name": model}
    if seed is not None:
        config["seed"] = seed
    options = dict(config["algorithm"].get("options", {}))
    if method == "fedavg":
        train = {k: v for k, v in options.items() if k in TrainOptions.model_fields}
        config["algorithm"] = {"name": "fedavg", "options": {**train, "aggregation": "uniform"}}
    elif method == "fml-dynamic":
        options.pop("alpha", None)
        options.pop("beta", None)
        options["dynamic"] = {"rounds": config["federation"]["rounds"]}
        config["algorithm"] = {"name": "fml", "options": options}
    elif method != "fml":
        raise ValueError(f"unknown method {method!r}")
    config["name"] = f"{config['name']}-{method}-{config['model']['name']}"
    return config


# -- one run -------------------------------------------------------------------------------------


def train(config_dict: dict[str, Any], newcomer_epochs: int = 0) -> dict[str, Any]:
    """Run one config round by round; returns per-round records and the final state."""
    config = load_config(config_dict)
    start = time.perf_counter()
    experiment = build_experiment(config)
    simulator = experiment.simulator()
    algorithm, clients, seed = experiment.algorithm, experiment.clients, config.seed
    test = experiment.test.dataset
    schedule = client_schedule(len(clients), config.federation.clients_per_round, config.federation.rounds, seed)
    records = []
    server, states = simulator.server, dict(simulator.client_states)
    for r, selected in enumerate(schedule):
        outcome = simulate_round(algorithm, server, clients, states, selected, seed, r)
        server = outcome.server
        global_model = load_state_(algorithm.model, server["model"])
        record: dict[str, Any] = {
            "round": r + 1,
            "global_accuracy": dataset_accuracy(global_model, test.inputs, test.labels, test.lengths),
            "bytes_up": outcome.bytes_up,
            "bytes_down": outcome.bytes_down,
        }
        if isinstance(algorithm, FML):
            local = algorithm.local_accuracies(states, clients)
        else:  # FedAvg: each client's "local model" is its upload, the global model after local training
            local = {}
            for cid, result in outcome.results.items():
                val = clients[cid].val
                model = load_state_(algorithm.model, result.upload["model"])
                local[cid] = dataset_accuracy(model, val.inputs, val.labels, val.lengths)
        record["local_accuracy"] = float(np.mean(list(local.values()))) if local else float("nan")
        record["local_by_client"] = {str(k): v for k, v in sorted(local.items())}
        record["seconds"] = time.perf_counter() - start
        records.append(record)
    # The classes any client trains on: the best a global model can do on the test set (non-IID).
    seen = torch.unique(torch.cat([c.train.labels for c in clients if c.client_id not in _newcomers(config)]))
    ceiling = float(torch.isin(test.labels, seen).float().mean())
    out = {
        "name": config.name,
        "algorithm": config.algorithm.name,
        "model": config.model.name,
        "seed": seed,
        "rounds": config.federation.rounds,
        "test_size": len(test),
        "test_ceiling": ceiling,
        "records": records,
        "seconds": time.perf_counter() - start,
    }
    if newcomer_epochs:
        out["newcomer"] = newcomer_curves(algorithm, server, clients, config, newcomer_epochs, test)
    return out


def _newcomers(config) -> list[int]:
    return list(getattr(config.algorithm_options(), "newcomers", []))


def newcomer_curves(algorithm: FML, server, clients, config, epochs: int, test) -> dict[str, list[dict[str, float]]]:
    """Fig. 4: each newcomer joins with its local model fresh or from the global model, by DML
    (the configured alpha, beta) or, as baselines, by cross-entropy alone (alpha = 1: a fresh model
    trained alone, or FedAvg-style fine-tuning of the global model)."""
    curves = {}
    for cid in _newcomers(config):
        for init in ("fresh", "global"):
            for how, alpha in (("dml", None), ("ce-only", 1.0)):
                generator = torch_generator(config.seed, "newcomer", cid, init)
                curves[f"client{cid}-{init}-{how}"] = algorithm.adapt_newcomer(
                    server, clients[cid], generator, init=init, epochs=epochs, alpha=alpha, test=test)
    return curves


# -- reporting -----------------------------------------------------------------------------------


def save_json(path: Path, data: Any) -> None:
    """Results as JSON, floats rounded to 5 digits (accuracies on <= 16k samples need no more)."""

    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 5)
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    path.write_text(json.dumps(rounded(data), indent=1) + "\n")


def partition_name(partition: str) -> str:
    return {"iid": "IID", "noniid": "non-IID"}.get(partition, partition)


def binomial_ci(p: float, n: int) -> float:
    """Half-width of the 95% normal-approximation interval of an accuracy measured on n samples."""
    return 1.96 * math.sqrt(max(p * (1 - p), 0.0) / max(n, 1))


def pct(p: float, ci: float | None = None) -> str:
    return f"{100 * p:.2f}" + (f" ± {100 * ci:.2f}" if ci is not None else "")


def plot(panels: list[tuple[str, dict[str, list[tuple[int, float]]]]], path: Path, ylabel: str, cols: int = 3,
         xlabel: str = "round") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.6 * rows), squeeze=False)
    for ax, (title, curves) in zip(axes.flat, panels):
        for label, points in curves.items():
            xs, ys = zip(*points)
            ax.plot(xs, [100 * y for y in ys], label=label, linewidth=1.3)
        ax.set_title(title, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_ylabel(ylabel, fontsize=7)
        ax.set_xlabel(xlabel, fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def run_key(r: dict[str, Any]) -> tuple[str, str, str, str, int]:
    return (r["dataset"], r["partition"], r["model"], r["method"], r["seed"])


def run_tables(out: Path, rounds: int | None, omniglot: bool, resume: bool) -> None:
    """Every (column, partition, model, method, seed) of TABLE_COLUMNS; results are merged into
    tables.json (a rerun replaces the same run); with ``resume`` runs already there are kept."""
    path = out / "tables.json"
    saved = {run_key(r): r for r in json.loads(path.read_text())} if path.exists() else {}
    grid = []
    for prefix, models, _, seeds in TABLE_COLUMNS:
        for partition in ("iid", "noniid"):
            for model in models:
                for method in METHODS:
                    if method == "fml-dynamic" and (prefix, model) not in DYNAMIC_COLUMNS:
                        continue
                    grid += [(prefix, partition, model, method, seed) for seed in seeds]
    if omniglot:
        grid += [("omniglot", "iid", "cnn1", method, 0) for method in ("fedavg", "fml")]
    for key in grid:
        if resume and key in saved:
            continue
        prefix, partition, model, method, seed = key
        base = read_config(f"{prefix}_{partition}")
        if rounds:
            base["federation"]["rounds"] = rounds
        result = train(variant(base, method, model, seed))
        result.update(dataset=prefix, partition=partition, method=method)
        last = result["records"][-1]
        print(f"{prefix:8s} {partition:7s} {model:7s} {method:12s} seed {seed}: global {pct(last['global_accuracy'])} "
              f"local {pct(last['local_accuracy'])}  {result['seconds']:.0f}s", flush=True)
        saved[key] = result
        save_json(path, list(saved.values()))  # after every run, so that --resume can pick up
    write_tables(list(saved.values()), out)


def write_tables(runs: list[dict[str, Any]], out: Path) -> None:
    def find(dataset: str, partition: str, model: str, method: str) -> list[dict[str, Any]]:
        return sorted((r for r in runs if (r["dataset"], r["partition"], r["model"], r["method"])
                       == (dataset, partition, model, method)), key=lambda r: r["seed"])

    columns = [(prefix, model, f"{label} {MODEL_LABEL[model]}") for prefix, models, label, _ in TABLE_COLUMNS
               for model in models]
    if any(r["dataset"] == "omniglot" for r in runs):
        columns.append(("omniglot", "cnn1", "Omniglot CNN1"))

    def seeds_note(cols: list[tuple[str, str, str]], partition: str) -> str:
        notes = []
        for prefix, model, label in cols:
            n = len(find(prefix, partition, model, "fml"))
            notes.append(f"{label}: {n} seed{'s' if n > 1 else ''}")
        return "; ".join(notes)

    lines = ["<!-- generated by experiments/fml.py; do not edit by hand -->", ""]
    for number, partition, title in ((1, "iid", "IID"), (2, "noniid", "pathological non-IID")):
        cols = [c for c in columns if find(c[0], partition, c[1], "fml")]
        lines += [f"**Table {number} (ours): global model's test accuracy (%), {title}, after the last round** — "
                  "mean ± 95% CI over seeds where there are several, else ± the 95% binomial interval of one "
                  f"run on the test set ({seeds_note(cols, partition)})", ""]
        lines.append("| method | " + " | ".join(c[2] for c in cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for method in METHODS:
            cells = []
            for prefix, model, _ in cols:
                chosen = find(prefix, partition, model, method)
                if not chosen:
                    cells.append("–")
                    continue
                finals = [r["records"][-1]["global_accuracy"] for r in chosen]
                if len(finals) > 1:
                    s = mean_ci95(finals)
                    cells.append(pct(s.mean, s.ci95))
                else:
                    cells.append(pct(finals[0], binomial_ci(finals[0], chosen[0]["test_size"])))
            if any(c != "–" for c in cells):
                lines.append(f"| {METHOD_LABEL[method]} | " + " | ".join(cells) + " |")
        for method in ("fedavg", "fml"):
            cells = [f"{PAPER_TABLES[partition][method].get(model, '—')} ({PAPER_COLUMN.get(model, '—')})"
                     for _, model, _ in cols]
            lines.append(f"| paper, Table {number}: {METHOD_LABEL[method]} | " + " | ".join(cells) + " |")
        controls = json.loads((out / "control.json").read_text()) if (out / "control.json").exists() else []
        cells = []
        for prefix, model, _ in cols:
            values = [c["global_accuracy"] for c in controls
                      if (c["dataset"], c["partition"], c["model"]) == (prefix, partition, model)]
            if not values:
                cells.append("–")
            elif len(values) > 1:
                stat = mean_ci95(values)
                cells.append(pct(stat.mean, stat.ci95))
            else:
                cells.append(pct(values[0]))
        if any(c != "–" for c in cells):
            lines.append("| (control) the initial global model, round 0 | " + " | ".join(cells) + " |")
        ceilings = []
        for prefix, model, label in cols:
            chosen = find(prefix, partition, model, "fml")
            ceiling = float(np.mean([r["test_ceiling"] for r in chosen]))
            if ceiling < 1.0:
                ceilings.append(f"{label}: {100 * ceiling:.1f}%")
        if ceilings:
            lines += ["", "Share of test samples whose class some client holds (the most a global model can reach): "
                      + "; ".join(ceilings) + "."]
        lines.append("")
    lines += ["**Fig. 5 (ours), final round: local models' accuracy (%) on the private validation sets** — mean "
              "± 95% CI over all (client, seed) pairs; FML: the private model; FedAvg: the global model after the "
              "client's local training (its upload)", ""]
    lines.append("| setting | FedAvg | FML | FML, dynamic α/β |")
    lines.append("|---|---|---|---|")
    for partition in ("iid", "noniid"):
        for prefix, model, label in columns:
            row = []
            for method in METHODS:
                values = [v for r in find(prefix, partition, model, method)
                          for v in r["records"][-1]["local_by_client"].values()]
                if not values:
                    row.append("–")
                    continue
                s = mean_ci95(values)
                row.append(pct(s.mean, s.ci95))
            if any(v != "–" for v in row):
                name = "IID" if partition == "iid" else "non-IID"
                lines.append(f"| {label}, {name} | " + " | ".join(row) + " |")
    seconds: dict[tuple[str, str, str], list[float]] = {}
    for r in runs:
        seconds.setdefault((r["dataset"], r["model"], r["method"]), []).append(r["seconds"])
    lines += ["", "Mean wall time per run (s; one thread on a 2-core CPU shared with other jobs): " + "; ".join(
        f"{d} {MODEL_LABEL[m]} {METHOD_LABEL[k]} {np.mean(v):.0f}" for (d, m, k), v in sorted(seconds.items())), ""]
    (out / "tables.md").write_text("\n".join(lines))
    # Fig. 5: curves per setting, averaged over seeds.
    for what, key, ylabel in (("global", "global_accuracy", "global test acc. (%)"),
                              ("local", "local_accuracy", "local val. acc. (%)")):
        panels = []
        for partition in ("iid", "noniid"):
            for prefix, model, label in columns:
                curves = {}
                for method in METHODS:
                    chosen = find(prefix, partition, model, method)
                    if chosen:
                        rounds_axis = [rec["round"] for rec in chosen[0]["records"]]
                        mean = np.mean([[rec[key] for rec in r["records"]] for r in chosen], axis=0)
                        curves[METHOD_LABEL[method]] = list(zip(rounds_axis, mean))
                if curves:
                    panels.append((f"{label}, {'IID' if partition == 'iid' else 'non-IID'}", curves))
        plot(panels, out / f"fig5_{what}.png", ylabel, cols=len(columns))


def run_control(out: Path) -> None:
    """The untrained control of every table cell: the global model the run starts from (the
    simulator's initial server state for the seed), scored on the same test set."""
    results = []
    for prefix, models, _, seeds in TABLE_COLUMNS:
        for partition in ("iid", "noniid"):
            for model in models:
                for seed in seeds:
                    config = load_config(variant(read_config(f"{prefix}_{partition}"), "fml", model, seed))
                    experiment = build_experiment(config)
                    simulator = experiment.simulator()
                    test = experiment.test.dataset
                    global_model = load_state_(experiment.algorithm.model, simulator.server["model"])
                    accuracy = dataset_accuracy(global_model, test.inputs, test.labels, test.lengths)
                    results.append({"dataset": prefix, "partition": partition, "model": model, "seed": seed,
                                    "global_accuracy": accuracy})
                    print(f"control {prefix} {partition} {model} seed {seed}: {pct(accuracy)}", flush=True)
    save_json(out / "control.json", results)
    report(out)


def run_long(out: Path, rounds: int, seeds: list[int]) -> None:
    """MNIST MLP, IID: FedAvg and FML for ``rounds`` rounds (our tables stop at 20), global accuracy
    every round: does FML's IID shortfall close with more rounds, as the paper's Table 1 implies?"""
    runs = []
    for seed in seeds:
        for method in ("fedavg", "fml"):
            base = read_config("mnist_iid")
            base["federation"]["rounds"] = rounds
            result = train(variant(base, method, "mlp", seed))
            result.update(dataset="mnist", partition="iid", method=method)
            print(f"long mnist iid mlp {method} seed {seed}: global {pct(result['records'][-1]['global_accuracy'])} "
                  f"{result['seconds']:.0f}s", flush=True)
            runs.append(result)
    save_json(out / "long.json", runs)
    write_long(runs, out)


def write_long(runs: list[dict[str, Any]], out: Path) -> None:
    rounds = runs[0]["rounds"]
    marks = sorted({r for r in (5, 10, 20, 40, 60, 80, 100, rounds) if r <= rounds})
    lines = ["<!-- generated by experiments/fml.py long; do not edit by hand -->", "",
             f"**FML vs FedAvg for {rounds} rounds (ours): MNIST MLP, IID, global test accuracy (%) by round** — "
             f"mean over {len({r['seed'] for r in runs})} seed(s)", "",
             "| method | " + " | ".join(f"round {m}" for m in marks) + f" | round {rounds}, mean ± 95% CI | wall s |",
             "|---|" + "---|" * (len(marks) + 2)]
    curves = {}
    for method in ("fedavg", "fml"):
        chosen = [r for r in runs if r["method"] == method]
        mean = np.mean([[rec["global_accuracy"] for rec in r["records"]] for r in chosen], axis=0)
        final = mean_ci95([r["records"][-1]["global_accuracy"] for r in chosen])
        lines.append(f"| {METHOD_LABEL[method]} | " + " | ".join(f"{100 * mean[m - 1]:.2f}" for m in marks)
                     + f" | {pct(final.mean, final.ci95)} | {np.mean([r['seconds'] for r in chosen]):.0f} |")
        curves[METHOD_LABEL[method]] = list(zip(range(1, rounds + 1), mean))
    lines.append("| paper, Table 1 (MNIST MLP, rounds not stated): FedAvg 98.27, FML 98.36 | "
                 + " | ".join("" for _ in marks) + " | | |")
    (out / "long.md").write_text("\n".join(lines) + "\n")
    plot([(f"MNIST MLP, IID, {rounds} rounds", curves)], out / "long.png", "global test acc. (%)", cols=1)


def run_catfish(out: Path, seeds: list[int], rounds: int | None) -> None:
    """Section 6: all-weak private models (MLP) versus client 0 with a strong one (LeNet-5)."""
    runs = []
    for partition in ("iid", "noniid"):
        base = read_config("catfish")
        if partition == "noniid":
            base["partition"] = read_config("mnist_noniid")["partition"]
        if rounds:
            base["federation"]["rounds"] = rounds
        for setting in ("all weak", "one strong"):
            for seed in seeds:
                config = variant(base, "fml", seed=seed)
                if setting == "one strong":
                    config["algorithm"]["options"]["local_models"] = ["lenet5"] + ["mlp"] * 4
                result = train(config)
                result.update(partition=partition, setting=setting)
                last = result["records"][-1]
                weak = [v for k, v in last["local_by_client"].items() if k != "0"]
                print(f"catfish {partition} {setting} seed {seed}: global {pct(last['global_accuracy'])} "
                      f"weak local {pct(float(np.mean(weak)))} client0 {pct(last['local_by_client']['0'])} "
                      f"{result['seconds']:.0f}s", flush=True)
                runs.append(result)
    save_json(out / "catfish.json", runs)
    write_catfish(runs, out)


def write_catfish(runs: list[dict[str, Any]], out: Path) -> None:
    seeds = sorted({r["seed"] for r in runs})
    lines = ["<!-- generated by experiments/fml.py catfish; do not edit by hand -->", "",
             f"**Catfish effect (ours): MNIST, global model MLP, private models MLP except client 0's; "
             f"after the last round; mean ± 95% CI over {len(seeds)} seeds**", "",
             "| partition | private models | global test acc. (%) | weak clients' local val. acc. (%) | "
             "client 0's local val. acc. (%) |", "|---|---|---|---|---|"]

    def weak_local(record: dict[str, Any]) -> float:
        return float(np.mean([v for k, v in record["local_by_client"].items() if k != "0"]))

    panels = []
    gains = []
    for partition in ("iid", "noniid"):
        curves = {}
        finals: dict[str, dict[int, dict[str, Any]]] = {}
        for setting in ("all weak", "one strong"):
            chosen = [r for r in runs if r["partition"] == partition and r["setting"] == setting]
            finals[setting] = {r["seed"]: r["records"][-1] for r in chosen}
            glob = mean_ci95([r["records"][-1]["global_accuracy"] for r in chosen])
            weak = mean_ci95([weak_local(r["records"][-1]) for r in chosen])
            first = mean_ci95([r["records"][-1]["local_by_client"]["0"] for r in chosen])
            models = "5 × MLP" if setting == "all weak" else "LeNet-5 + 4 × MLP"
            lines.append(f"| {partition_name(partition)} | {models} | {pct(glob.mean, glob.ci95)} | {pct(weak.mean, weak.ci95)} | "
                         f"{pct(first.mean, first.ci95)} |")
            rounds_axis = [rec["round"] for rec in chosen[0]["records"]]
            curves[f"{setting}: global"] = list(zip(rounds_axis, np.mean(
                [[rec["global_accuracy"] for rec in r["records"]] for r in chosen], axis=0)))
            curves[f"{setting}: weak local"] = list(zip(rounds_axis, np.mean(
                [[np.mean([v for k, v in rec["local_by_client"].items() if k != "0"]) for rec in r["records"]]
                 for r in chosen], axis=0)))
        panels.append((f"catfish, MNIST {partition_name(partition)}", curves))
        paired = sorted(set(finals["all weak"]) & set(finals["one strong"]))
        d_global = mean_ci95([finals["one strong"][s]["global_accuracy"] - finals["all weak"][s]["global_accuracy"]
                              for s in paired])
        d_weak = mean_ci95([weak_local(finals["one strong"][s]) - weak_local(finals["all weak"][s]) for s in paired])
        gains.append(f"| {partition_name(partition)} | {100 * d_global.mean:+.2f} ± {100 * d_global.ci95:.2f} | "
                     f"{100 * d_weak.mean:+.2f} ± {100 * d_weak.ci95:.2f} |")
    lines += ["", "Gain from the catfish (one strong minus all weak, paired by seed, which fixes the partition and "
              "the initialisations of the other models), percentage points, mean ± 95% CI:", "",
              "| partition | global test acc. | weak clients' local val. acc. |", "|---|---|---|", *gains, ""]
    (out / "catfish.md").write_text("\n".join(lines))
    plot(panels, out / "catfish.png", "accuracy (%)", cols=2)


def run_newcomer(out: Path, epochs: int, rounds: int | None) -> None:
    results = []
    for partition in ("iid", "noniid"):
        base = read_config(f"newcomer_{partition}")
        if rounds:
            base["federation"]["rounds"] = rounds
        result = train(variant(base, "fml"), newcomer_epochs=epochs)
        result["partition"] = partition
        results.append(result)
        print(f"newcomer {partition}: global {pct(result['records'][-1]['global_accuracy'])} "
              f"{result['seconds']:.0f}s", flush=True)
    save_json(out / "newcomer.json", results)
    write_newcomer(results, out)


def write_newcomer(results: list[dict[str, Any]], out: Path) -> None:
    epochs = len(next(iter(results[0]["newcomer"].values()))) - 1
    lines = ["<!-- generated by experiments/fml.py newcomer; do not edit by hand -->", "",
             "**A new participant (ours, Fig. 4): its local model's accuracy (%) on its private validation set "
             "per epoch of adaptation** (LeNet-5, MNIST, after 5 clients trained for "
             f"{results[0]['rounds']} rounds)", ""]
    header = "| partition | start | adapt by | " + " | ".join(f"epoch {e}" for e in range(epochs + 1)) + " |"
    lines += [header, "|---|---|---|" + "---|" * (epochs + 1)]
    panels = []
    for result in results:
        curves = {}
        for key, curve in result["newcomer"].items():
            _, init, how = key.split("-", 2)
            label = f"{init}, {'DML' if how == 'dml' else 'CE only'}"
            lines.append(f"| {partition_name(result['partition'])} | {init} | {'DML' if how == 'dml' else 'CE only (α = 1)'} | "
                         + " | ".join(f"{100 * row['local_accuracy']:.1f}" for row in curve) + " |")
            curves[label] = [(row["epoch"], row["local_accuracy"]) for row in curve]
        panels.append((f"newcomer, MNIST {partition_name(result['partition'])}", curves))
    lines.append("")
    (out / "newcomer.md").write_text("\n".join(lines))
    plot(panels, out / "fig4_newcomer.png", "newcomer local val. acc. (%)", cols=2, xlabel="epoch of adaptation")


def report(out: Path) -> None:
    """Re-render the tables and figures from the saved JSON (runs of columns no longer configured
    are dropped)."""
    if (out / "tables.json").exists():
        keep = {(prefix, model) for prefix, models, _, _ in TABLE_COLUMNS for model in models} | {("omniglot", "cnn1")}
        runs = [r for r in json.loads((out / "tables.json").read_text()) if (r["dataset"], r["model"]) in keep]
        save_json(out / "tables.json", runs)
        write_tables(runs, out)
    if (out / "catfish.json").exists():
        runs = json.loads((out / "catfish.json").read_text())
        save_json(out / "catfish.json", runs)
        write_catfish(runs, out)
    if (out / "newcomer.json").exists():
        results = json.loads((out / "newcomer.json").read_text())
        save_json(out / "newcomer.json", results)
        write_newcomer(results, out)
    if (out / "long.json").exists():
        write_long(json.loads((out / "long.json").read_text()), out)
    fill_page(out)


def fill_page(out: Path) -> None:
    """Copy the generated tables into docs/fml.md between its ``<!-- begin:NAME ... -->`` and
    ``<!-- end:NAME -->`` markers (the page's numbers are never typed by hand)."""
    page = out.parent / "fml.md"
    if not page.is_file():
        return
    text = page.read_text()
    for name in ("tables", "catfish", "newcomer", "long"):
        table = out / f"{name}.md"
        begin, end = f"<!-- begin:{name}", f"<!-- end:{name} -->"
        if not table.is_file() or begin not in text or end not in text:
            continue
        head, rest = text.split(begin, 1)
        marker, rest = rest.split("-->", 1)
        body = "\n".join(line for line in table.read_text().splitlines() if not line.startswith("<!-- generated"))
        text = f"{head}{begin}{marker}-->\n{body.strip()}\n{end}{rest.split(end, 1)[1]}"
    page.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["tables", "catfish", "newcomer", "control", "long", "all", "report"],
                        help="report: re-render docs/fml/ from the saved JSON without training")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "fml")
    parser.add_argument("--rounds", type=int, default=None, help="override every config's rounds (smoke tests)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the catfish runs")
    parser.add_argument("--newcomer-epochs", type=int, default=5)
    parser.add_argument("--omniglot", action="store_true", help="add the Omniglot CNN1 column (IID) to the tables")
    parser.add_argument("--resume", action="store_true", help="tables: keep the runs already in tables.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what in ("tables", "all"):
        run_tables(args.out, args.rounds, args.omniglot, args.resume)
    if args.what in ("catfish", "all"):
        run_catfish(args.out, args.seeds, args.rounds)
    if args.what in ("newcomer", "all"):
        run_newcomer(args.out, args.newcomer_epochs, args.rounds)
    if args.what == "control":
        run_control(args.out)
    if args.what == "long":
        run_long(args.out, args.rounds or 100, args.seeds)
    if args.what == "report":
        report(args.out)


if __name__ == "__main__":
    # The committed configs name no data folder: read $FEDFEW_DATA, else the repository's sibling
    # ../shared/data where these results were produced.
    os.environ.setdefault("FEDFEW_DATA", str(REPO.parent / "shared" / "data"))
    main()
