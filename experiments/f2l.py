"""F2L (Wang et al. KDD'23) experiments: Table 1, the ablation (Fig. 4), the lambda sensitivity
(Fig. 5) and the client-count study (Fig. 6), at the reduced scale of configs/f2l/*.yaml.

    .venv/bin/python experiments/f2l.py table    [--datasets huffpost femnist] [--methods ...]
    .venv/bin/python experiments/f2l.py ablation [--datasets huffpost]
    .venv/bin/python experiments/f2l.py lambda   [--shots 1]
    .venv/bin/python experiments/f2l.py clients  [--datasets femnist] [--methods f2l fl-proto]
    .venv/bin/python experiments/f2l.py preset   (the authors'-code preset beside the paper's F2L)
    .venv/bin/python experiments/f2l.py adaptation  (choose the inner step sizes on validation tasks)
    .venv/bin/python experiments/f2l.py control  [--datasets huffpost femnist]   (untrained, round-0 controls)
    .venv/bin/python experiments/f2l.py mi       (L_MI with eq. 10's softmax over C(i), beside ours)
    .venv/bin/python experiments/f2l.py report   (tables and plots from docs/f2l/results.jsonl only)

Every run appends one line to docs/f2l/results.jsonl (label, overrides, test accuracy and CI,
selected round, seconds); a label already there is not run again (delete the line to rerun).
Tables (docs/f2l/*.md) and plots (docs/f2l/*.png) are written from that file after every command.
Run folders go to runs/f2l/ (not committed). All runs use the config's seed, so every method is
scored on the same fixed meta-test tasks.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "f2l"
DOCS = REPO / "docs" / "f2l"
RESULTS = DOCS / "results.jsonl"

DISTRIBUTIONS = {
    "IID": {"name": "iid", "options": {}},
    "Non-IID": {"name": "dirichlet", "options": {"alpha": 1.0}},  # the paper's non-IID: Dirichlet(1.0)
}
METHOD_NAMES = {"local": "Local", "fl-maml": "FL-MAML", "fl-proto": "FL-Proto", "fedfsl": "FedFSL",
                "f2l": "F2L"}
ABLATIONS = {"F2L\\M": {"decoupled": False}, "F2L\\T": {"transfer": False}, "F2L\\A": {"distill": False},
             "F2L": {}}
LAMBDAS = [0.0, 0.25, 0.5, 0.75, 1.0]
CLIENT_COUNTS = [1, 2, 5, 10, 20, 50]

#: Table 1 of the paper (accuracy %, 5-way; mean ± std over ten repetitions).
PAPER_TABLE1 = {
    "Huffpost": {
        "Local": ["34.02±1.67", "49.95±1.54", "33.09±2.28", "47.18±1.43"],
        "FL-MAML": ["37.47±1.43", "52.85±1.43", "36.01±2.17", "50.56±2.08"],
        "FL-Proto": ["37.87±1.23", "51.90±1.43", "34.05±1.35", "50.52±1.33"],
        "FedFSL": ["39.18±1.42", "53.81±1.36", "37.86±1.46", "52.18±1.82"],
        "F2L": ["42.12±2.12", "57.88±2.17", "41.64±1.81", "57.12±1.87"],
    },
    "FC100": {
        "Local": ["33.45±1.68", "50.89±1.56", "32.40±1.76", "50.29±2.24"],
        "FL-MAML": ["34.10±1.29", "50.66±1.68", "36.06±1.78", "50.35±1.57"],
        "FL-Proto": ["36.11±1.49", "54.74±2.05", "35.54±1.71", "52.31±1.76"],
        "FedFSL": ["39.38±1.95", "52.25±1.84", "38.60±2.00", "53.90±1.80"],
        "F2L": ["42.52±2.06", "58.60±2.09", "42.56±2.25", "59.52±2.14"],
    },
}
PAPER_COLUMNS = ["IID 1-shot", "IID 5-shot", "Non-IID 1-shot", "Non-IID 5-shot"]
#: (our dataset config, the paper's dataset its Table 1 row is shown beside). huffpost_minilm is
#: HuffPost with frozen MiniLM sentence vectors in place of the BiLSTM (beyond the paper).
TABLE1_DATASETS = [("huffpost", "Huffpost"), ("huffpost_minilm", "Huffpost"), ("femnist", "FC100")]


# -- running -----------------------------------------------------------------------------------------
def load_results() -> dict[str, dict[str, Any]]:
    if not RESULTS.is_file():
        return {}
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    return {row["label"]: row for row in rows}


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "options":
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def methods() -> dict[str, dict[str, Any] | None]:
    return yaml.safe_load((CONFIGS / "methods.yaml").read_text())


def adaptation_choices() -> dict[str, dict[str, dict[str, Any]]]:
    path = CONFIGS / "adaptation.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def cell_config(dataset: str, method: str, distribution: str, shot: int,
                algorithm_options: dict[str, Any] | None = None, num_clients: int | None = None) -> dict[str, Any]:
    """The config dict of one cell: the dataset's F2L config with the method's algorithm block,
    the partition and the shot count changed (and F2L options / the number of clients if given)."""
    base = yaml.safe_load((CONFIGS / f"{dataset}.yaml").read_text())
    block = methods()[method]
    changes: dict[str, Any] = {"partition": dict(DISTRIBUTIONS[distribution]), "episodes": {"k_shot": shot}}
    if block is not None:
        changes["algorithm"] = block
    config = deep_merge(base, changes)
    tuned = adaptation_choices().get(dataset, {}).get(method)
    if tuned:  # the inner step sizes chosen on validation tasks (``adaptation``; configs/f2l/adaptation.yaml)
        config["algorithm"]["options"] = {**config["algorithm"]["options"], **tuned}
    config["partition"]["num_clients"] = num_clients or base["partition"]["num_clients"]
    config["federation"]["clients_per_round"] = config["partition"]["num_clients"]  # all clients, every round
    if algorithm_options:
        config["algorithm"]["options"] = {**config["algorithm"]["options"], **algorithm_options}
    return config


@functools.cache
def _cached_dataset(name: str, root: str | None, options: str) -> Any:
    from fedfew.data import load_dataset

    return load_dataset(name, root, **json.loads(options))


def install_dataset_cache() -> None:
    """Load each dataset once per process (HuffPost's tokenisation and GloVe lookup take seconds):
    a speed cache only, build_experiment still builds everything else per run."""
    import fedfew.experiment

    fedfew.experiment.load_dataset = lambda name, root=None, **options: _cached_dataset(  # type: ignore[assignment]
        name, root, json.dumps(options, sort_keys=True))


def run(label: str, config: dict[str, Any], extra: dict[str, Any], curve: bool = False) -> dict[str, Any]:
    """Run one config unless ``label`` is already in docs/f2l/results.jsonl; return its record
    (with the test accuracy at every evaluated round if ``curve``)."""
    done = load_results()
    if label in done:
        return done[label]
    from fedfew.config import load_config
    from fedfew.runner import run_experiment

    config = {**config, "name": label.replace(" ", "_").replace("\\", "-").replace("/", "_")}
    start = time.perf_counter()
    summary = run_experiment(load_config(config), REPO / "runs" / "f2l", progress=False, label=label)
    record = {"label": label, **extra, "test_accuracy": summary["test"]["accuracy"],
              "test_ci95": summary["test"]["ci95"], "selected_round": summary["selected_round"],
              "rounds": summary["rounds"], "seconds": round(time.perf_counter() - start, 1),
              "algorithm": config["algorithm"], "partition": config["partition"], "episodes": config["episodes"]}
    record["train"] = {k: v for k, v in summary["history"][-1].items() if k.startswith("train_")}
    if curve:
        record["curve"] = [[h["round"], h["test_accuracy"]] for h in summary["history"] if "test_accuracy" in h]
    DOCS.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"{label}: {100 * record['test_accuracy']:.2f} ± {100 * record['test_ci95']:.2f} "
          f"({record['seconds']} s)", flush=True)
    return record


def control_run(label: str, config: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The untrained control of one cell: the run's own round-0 state (the simulator's initial server
    and client states for the config's seed), scored by the method's own evaluation on the same fixed
    meta-test tasks. Recorded in docs/f2l/results.jsonl like a run (study "control")."""
    done = load_results()
    if label in done:
        return done[label]
    from fedfew.config import load_config
    from fedfew.experiment import build_experiment

    start = time.perf_counter()
    experiment = build_experiment(load_config(config))
    test = experiment.simulator().evaluate(experiment.test)
    record = {"label": label, **extra, "test_accuracy": test["accuracy"], "test_ci95": test["ci95"],
              "selected_round": 0, "rounds": 0, "seconds": round(time.perf_counter() - start, 1),
              "algorithm": config["algorithm"], "partition": config["partition"], "episodes": config["episodes"]}
    DOCS.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"{label}: {100 * record['test_accuracy']:.2f} ± {100 * record['test_ci95']:.2f} "
          f"({record['seconds']} s)", flush=True)
    return record


def cmd_control(args: argparse.Namespace) -> None:
    for dataset in args.datasets:
        for distribution in DISTRIBUTIONS:
            for shot in (1, 5):
                for method in args.methods:
                    control_run(f"control {dataset} {distribution} {shot}-shot {method}",
                                cell_config(dataset, method, distribution, shot),
                                {"study": "control", "dataset": dataset, "distribution": distribution, "shot": shot,
                                 "method": method})


#: The cells of ``mi``: L_MI's softmax over C(i) as eq. 10 and 13 write it (at 1 shot it is 0).
MI_CELLS = [("IID", 1), ("IID", 5), ("Non-IID", 5)]


def cmd_mi(args: argparse.Namespace) -> None:
    for distribution, shot in MI_CELLS:
        run(f"mi huffpost {distribution} {shot}-shot mi_normaliser=class",
            cell_config("huffpost", "f2l", distribution, shot, {"mi_normaliser": "class"}),
            {"study": "mi", "dataset": "huffpost", "distribution": distribution, "shot": shot, "method": "f2l"})


def cmd_table(args: argparse.Namespace) -> None:
    for dataset in args.datasets:
        for distribution in DISTRIBUTIONS:
            for shot in (1, 5):
                for method in args.methods:
                    label = f"table {dataset} {distribution} {shot}-shot {method}"
                    run(label, cell_config(dataset, method, distribution, shot),
                        {"study": "table", "dataset": dataset, "distribution": distribution, "shot": shot,
                         "method": method})


def cmd_ablation(args: argparse.Namespace) -> None:
    for dataset in args.datasets:
        for distribution in args.distributions:
            for shot in args.shots:
                for variant, options in ABLATIONS.items():
                    # the full F2L is the Table 1 cell: the same config, so the same label and numbers
                    label = (f"table {dataset} {distribution} {shot}-shot f2l" if not options else
                             f"ablation {dataset} {distribution} {shot}-shot {variant}")
                    run(label, cell_config(dataset, "f2l", distribution, shot, options),
                        {"study": "table" if not options else "ablation", "dataset": dataset,
                         "distribution": distribution, "shot": shot, "method": "f2l", "variant": variant})


def cmd_lambda(args: argparse.Namespace) -> None:
    for shot in args.shots:
        for which, other in (("lambda_mi", "lambda_kd"), ("lambda_kd", "lambda_mi")):
            for value in LAMBDAS:
                options = {which: value, other: 0.5}
                label = (f"table huffpost Non-IID {shot}-shot f2l" if value == 0.5 else
                         f"lambda huffpost Non-IID {shot}-shot {which}={value}")
                run(label, cell_config("huffpost", "f2l", "Non-IID", shot, options if value != 0.5 else None),
                    {"study": "table" if value == 0.5 else "lambda", "dataset": "huffpost",
                     "distribution": "Non-IID", "shot": shot, "method": "f2l", "which": which, "value": value})


def cmd_clients(args: argparse.Namespace) -> None:
    for dataset in args.datasets:
        for shot in args.shots:
            for method in args.methods:
                for count in args.counts:
                    label = (f"table {dataset} Non-IID {shot}-shot {method}" if count == 10 else
                             f"clients {dataset} Non-IID {shot}-shot {method} I={count}")
                    run(label, cell_config(dataset, method, "Non-IID", shot, num_clients=count),
                        {"study": "table" if count == 10 else "clients", "dataset": dataset,
                         "distribution": "Non-IID", "shot": shot, "method": method, "clients": count})


def cmd_long(args: argparse.Namespace) -> None:
    """A longer run of one cell (FEMNIST has no validation classes, so the test accuracy is tracked
    every ``every`` rounds): does the ranking of the 4-round table hold with more rounds? A method may
    also be an ablation of F2L (F2L\\M, F2L\\T, F2L\\A)."""
    for method in args.methods:
        if method in ABLATIONS:
            config = cell_config(args.dataset, "f2l", args.distribution, args.shot, ABLATIONS[method])
        else:
            config = cell_config(args.dataset, method, args.distribution, args.shot)
        config["federation"]["rounds"] = args.rounds
        config["eval"] = {"every": args.every, "track_test": True}
        label = f"long {args.dataset} {args.distribution} {args.shot}-shot {method} R={args.rounds}"
        if args.local_steps is not None:  # tau; the paper's scale is --rounds 200 --local-steps 10
            config["algorithm"]["options"]["local_steps"] = args.local_steps
            label += f" tau={args.local_steps}"
        for option in args.option:  # e.g. test_client_model=average (a YAML value)
            key, _, value = option.partition("=")
            config["algorithm"]["options"][key] = yaml.safe_load(value)
            label += f" {key}={value}"
        run(label, config,
            {"study": "long", "dataset": args.dataset, "distribution": args.distribution, "shot": args.shot,
             "method": method, "rounds": args.rounds, "local_steps": config["algorithm"]["options"]["local_steps"]},
            curve=True)


def cmd_preset(args: argparse.Namespace) -> None:
    base = yaml.safe_load((CONFIGS / "authors_code_preset.yaml").read_text())
    for distribution in DISTRIBUTIONS:
        for shot in args.shots:
            config = deep_merge(base, {"partition": dict(DISTRIBUTIONS[distribution]), "episodes": {"k_shot": shot}})
            run(f"preset huffpost {distribution} {shot}-shot authors-code", config,
                {"study": "preset", "dataset": "huffpost", "distribution": distribution, "shot": shot,
                 "method": "f2l-authors-code"})


#: The grids of ``adaptation``: MAML's inner step (fl-maml, FedFSL) and F2L's eq. 3 fine-tuning.
MAML_INNER_LRS = [0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0]
F2L_FINETUNE = [(lr, steps) for lr in (0.01, 0.05, 0.1, 0.5, 1.0) for steps in (5, 20, 50)]
SELECTION_TASKS = 200
ADAPTATION_JSON = DOCS / "adaptation.json"


def cmd_adaptation(args: argparse.Namespace) -> None:
    """Validation accuracy of *untrained* models (the round-0 initialisation every method starts from)
    for each inner step size: with a few hundred local steps in all, a step size that cannot adapt at
    round 0 leaves a method at chance for the whole run (HuffPost's FL-MAML at alpha = 0.05). Tasks:
    the validation classes, or where a dataset has none (FEMNIST) fixed tasks from its base classes,
    never the novel ones. Writes docs/f2l/adaptation.{json,md}; the choices are copied by hand into
    configs/f2l/adaptation.yaml, which cell_config applies."""
    from fedfew.config import load_config
    from fedfew.engine import EvalData
    from fedfew.episodes import fixed_episodes
    from fedfew.experiment import build_experiment
    from fedfew.seeding import torch_generator

    results: dict[str, Any] = {}
    for dataset in args.datasets:
        grids = {"fl-maml": [{"inner_lr": lr, "test_inner_steps": 5} for lr in MAML_INNER_LRS],
                 "f2l": [{"finetune_lr": lr, "test_finetune_steps": steps} for lr, steps in F2L_FINETUNE]}
        for method, grid in grids.items():
            for options in grid:
                config = cell_config(dataset, method, "IID", args.shot, options)
                config["runtime"]["threads"] = 1
                config["episodes"]["val_episodes"] = SELECTION_TASKS
                experiment = build_experiment(load_config(config))
                data = experiment.val
                if data is None:
                    ds, shape = experiment.dataset, experiment.context.episode
                    data = EvalData("val", episodes=fixed_episodes(
                        ds, ds.splits["base"], shape.n_way, shape.k_shot, shape.q_query,
                        SELECTION_TASKS, config["seed"], tag="adaptation"))
                algorithm = experiment.algorithm
                generator = torch_generator(config["seed"], "adaptation")
                server = algorithm.init_server(generator)
                if algorithm.evaluates_clients:  # the clients' own (initial) client-models take part
                    simulator = experiment.simulator()
                    score = simulator.evaluate(data, server)
                    simulator.engine.close()
                else:
                    score = algorithm.evaluate(server, data, generator)
                key = f"{dataset} {method} " + " ".join(f"{k}={v}" for k, v in options.items())
                results[key] = {"dataset": dataset, "method": method, "options": options,
                                "tasks": "validation classes" if experiment.val is not None else "base classes",
                                "accuracy": score["accuracy"], "ci95": score["ci95"]}
                print(f"{key}: {100 * score['accuracy']:.1f} ± {100 * score['ci95']:.1f}", flush=True)
    DOCS.mkdir(parents=True, exist_ok=True)
    if ADAPTATION_JSON.is_file():  # keep other datasets' rows (e.g. `adaptation --datasets huffpost_minilm`)
        results = {**json.loads(ADAPTATION_JSON.read_text()), **results}
    ADAPTATION_JSON.write_text(json.dumps(results, indent=1) + "\n")
    adaptation_table()


def adaptation_table() -> None:
    """docs/f2l/adaptation.md from docs/f2l/adaptation.json: one row per step setting, one column per dataset."""
    if not ADAPTATION_JSON.is_file():
        return
    results = json.loads(ADAPTATION_JSON.read_text())
    datasets = list(dict.fromkeys(r["dataset"] for r in results.values()))
    tasks = {r["dataset"]: r["tasks"] for r in results.values()}
    lines = ["Accuracy (%) ± 95% CI of the untrained (round-0) models on 200 selection tasks ("
             + "; ".join(f"{d}: {tasks[d]}" for d in datasets) + "); 5-way 1-shot, IID clients.", ""]
    for method, title in (("fl-maml", "FL-MAML (and FedFSL): inner step, 5 steps"),
                          ("f2l", "F2L: finetune_lr, test_finetune_steps")):
        settings: dict[str, dict[str, str]] = {}
        for r in results.values():
            if r["method"] == method:
                o = r["options"]
                key = str(o["inner_lr"]) if method == "fl-maml" else f"{o['finetune_lr']}, {o['test_finetune_steps']}"
                settings.setdefault(key, {})[r["dataset"]] = f"{100 * r['accuracy']:.1f} ± {100 * r['ci95']:.1f}"
        lines += [f"| {title} | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
        lines += [f"| {key} | " + " | ".join(cells.get(d, "") for d in datasets) + " |" for key, cells in settings.items()]
        lines.append("")
    (DOCS / "adaptation.md").write_text("\n".join(lines))


# -- reporting ---------------------------------------------------------------------------------------
def fmt(row: dict[str, Any] | None) -> str:
    return "not run" if row is None else f"{100 * row['test_accuracy']:.2f} ± {100 * row['test_ci95']:.2f}"


def backfill_training_metrics(rows: dict[str, dict[str, Any]]) -> None:
    """Records written before "train" was stored get the last round's training metrics from their
    run folder (runs/f2l/<name>-<time>/metrics.jsonl), when it is still there."""
    changed = False
    for label, row in rows.items():
        if "train" in row:
            continue
        name = label.replace(" ", "_").replace("\\", "-").replace("/", "_")
        folders = sorted((REPO / "runs" / "f2l").glob(f"{name}-2*"))
        if folders and (folders[-1] / "metrics.jsonl").is_file():
            last = json.loads((folders[-1] / "metrics.jsonl").read_text().splitlines()[-1])
            row["train"] = {k: v for k, v in last.items() if k.startswith("train_")}
            changed = True
    if changed:
        RESULTS.write_text("".join(json.dumps(row) + "\n" for row in rows.values()))


def report(_: argparse.Namespace | None = None) -> None:
    rows = load_results()
    backfill_training_metrics(rows)
    DOCS.mkdir(parents=True, exist_ok=True)
    columns = [(d, s) for d in DISTRIBUTIONS for s in (1, 5)]
    lines: list[str] = []
    for dataset, paper in TABLE1_DATASETS:
        if dataset != "huffpost" and dataset != "femnist" and not any(
                label.startswith(f"table {dataset} ") for label in rows):
            continue
        lines += [f"### {dataset} (ours) and {paper} (paper)", "",
                  "| method | " + " | ".join(f"{d} {s}-shot ours" for d, s in columns) + " | "
                  + " | ".join(f"{c} paper" for c in PAPER_COLUMNS) + " |",
                  "|---|" + "---|" * (2 * len(columns))]
        for method, name in METHOD_NAMES.items():
            ours = [fmt(rows.get(f"table {dataset} {d} {s}-shot {method}")) for d, s in columns]
            lines.append(f"| {name} | " + " | ".join(ours) + " | " + " | ".join(PAPER_TABLE1[paper][name]) + " |")
        for method, name in METHOD_NAMES.items():
            controls = [rows.get(f"control {dataset} {d} {s}-shot {method}") for d, s in columns]
            if any(controls):
                lines.append(f"| (control) {name}, untrained (round 0) | " + " | ".join(fmt(c) for c in controls)
                             + " | — | — | — | — |")
        seconds = sum(r["seconds"] for label, r in rows.items() if label.startswith(f"table {dataset} "))
        lines += ["", f"Compute: {seconds:.0f} s for the {dataset} runs above.", ""]
    (DOCS / "table1.md").write_text("\n".join(lines))

    ablation = ["| variant | " + " | ".join(f"{d} {s}-shot" for d, s in columns) + " |", "|---|" + "---|" * 4]
    for variant, options in ABLATIONS.items():
        cells = []
        for d, s in columns:
            label = f"table huffpost {d} {s}-shot f2l" if not options else f"ablation huffpost {d} {s}-shot {variant}"
            cells.append(fmt(rows.get(label)))
        ablation.append(f"| {variant} | " + " | ".join(cells) + " |")
    (DOCS / "ablation.md").write_text("\n".join(ablation) + "\n")

    lam = ["| lambda | " + " | ".join(f"{w} (shot {s})" for s in (1, 5) for w in ("lambda_mi", "lambda_kd")) + " |",
           "|---|---|---|---|---|"]
    for value in LAMBDAS:
        cells = []
        for s in (1, 5):
            for which in ("lambda_mi", "lambda_kd"):
                label = (f"table huffpost Non-IID {s}-shot f2l" if value == 0.5 else
                         f"lambda huffpost Non-IID {s}-shot {which}={value}")
                cells.append(fmt(rows.get(label)))
        lam.append(f"| {value} | " + " | ".join(cells) + " |")
    (DOCS / "lambda.md").write_text("\n".join(lam) + "\n")

    clients = ["| method, shots | " + " | ".join(f"I={c}" for c in CLIENT_COUNTS) + " |",
               "|---|" + "---|" * len(CLIENT_COUNTS)]
    for method in METHOD_NAMES:
        for s in (1, 5):
            cells = [fmt(rows.get(f"table femnist Non-IID {s}-shot {method}" if c == 10 else
                                  f"clients femnist Non-IID {s}-shot {method} I={c}")) for c in CLIENT_COUNTS]
            if any(c != "not run" for c in cells[:3] + cells[4:]):  # more than the I=10 cell
                clients.append(f"| {METHOD_NAMES[method]}, {s}-shot | " + " | ".join(cells) + " |")
    (DOCS / "clients.md").write_text("\n".join(clients) + "\n")

    preset = ["| F2L | " + " | ".join(f"{d} {s}-shot" for d, s in columns) + " |", "|---|" + "---|" * 4,
              "| paper's equations (configs/f2l/huffpost.yaml) | "
              + " | ".join(fmt(rows.get(f"table huffpost {d} {s}-shot f2l")) for d, s in columns) + " |",
              "| authors' code preset (configs/f2l/authors_code_preset.yaml) | "
              + " | ".join(fmt(rows.get(f"preset huffpost {d} {s}-shot authors-code")) for d, s in columns) + " |"]
    (DOCS / "preset.md").write_text("\n".join(preset) + "\n")
    long_lines = ["| run | untrained (round 0) | test accuracy by round | final (validation-selected round) | "
                  "paper, same cell | seconds |", "|---|---|---|---|---|---|"]
    for label, r in rows.items():
        if r.get("study") == "long":
            curve = ", ".join(f"{x}: {100 * y:.1f}" for x, y in r.get("curve", []))
            paper = "—"  # the paper's HuffPost numbers sit beside our HuffPost runs (either encoder)
            if r["dataset"].startswith("huffpost") and r["method"] in METHOD_NAMES:
                paper = PAPER_TABLE1["Huffpost"][METHOD_NAMES[r["method"]]][
                    PAPER_COLUMNS.index(f"{r['distribution']} {r['shot']}-shot")]
            control = rows.get(f"control {r['dataset']} {r['distribution']} {r['shot']}-shot {r['method']}")
            plain = all(t.startswith(("R=", "tau=")) for t in r["label"].split() if "=" in t)  # no --option
            start = f"{100 * control['test_accuracy']:.1f}" if control and plain else "—"
            long_lines.append(f"| {label.removeprefix('long ')} | {start} | {curve} | {fmt(r)} (round "
                              f"{r['selected_round']}) | {paper} | {r['seconds']:.0f} |")
    (DOCS / "long.md").write_text("\n".join(long_lines) + "\n")

    mi = ["| F2L, HuffPost (Table 1 scale) | L_MI softmax over the support set (ours, default) | "
          "over C(i) (eq. 10 / 13 as written) |", "|---|---|---|"]
    for distribution, shot in MI_CELLS:
        mi.append(f"| {distribution} {shot}-shot | {fmt(rows.get(f'table huffpost {distribution} {shot}-shot f2l'))} | "
                  f"{fmt(rows.get(f'mi huffpost {distribution} {shot}-shot mi_normaliser=class'))} |")
    (DOCS / "mi.md").write_text("\n".join(mi) + "\n")

    import math

    diagnostics = ["| F2L run | server CE on support (last round) | ln of base classes | server accuracy on support "
                   "| client-model query accuracy (training) | L_MI | L_KD | T_i |", "|---|---|---|---|---|---|---|---|"]
    base_classes = {"huffpost": 20, "huffpost_minilm": 20, "femnist": 52}
    for label, r in rows.items():
        t = r.get("train", {})
        if r.get("method") == "f2l" and "train_ce_support" in t:
            diagnostics.append(
                f"| {label} | {t['train_ce_support']:.3f} | {math.log(base_classes[r['dataset']]):.3f} | "
                f"{100 * t['train_server_accuracy']:.1f} | {100 * t['train_accuracy']:.1f} | "
                f"{t.get('train_l_mi', float('nan')):.3f} | {t.get('train_l_kd', float('nan')):.3f} | "
                f"{t.get('train_kd_temperature', float('nan')):.3f} |")
    (DOCS / "diagnostics.md").write_text("\n".join(diagnostics) + "\n")
    adaptation_table()
    plots(rows, columns)
    fill_docs_page()


def fill_docs_page() -> None:
    """Copy each generated table into docs/f2l.md between its markers <!-- NAME:start --> and
    <!-- NAME:end --> (so the page's numbers are never typed by hand)."""
    page = REPO / "docs" / "f2l.md"
    if not page.is_file():
        return
    text = page.read_text()
    for table in sorted(DOCS.glob("*.md")):
        start, end = f"<!-- {table.stem}:start -->", f"<!-- {table.stem}:end -->"
        if start in text and end in text:
            head, rest = text.split(start, 1)
            _, tail = rest.split(end, 1)
            text = f"{head}{start}\n{table.read_text().strip()}\n{end}{tail}"
    page.write_text(text)


def plots(rows: dict[str, dict[str, Any]], columns: list[tuple[str, int]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def acc(label: str) -> float | None:
        row = rows.get(label)
        return None if row is None else 100 * row["test_accuracy"]

    # Longer runs: test accuracy against rounds.
    long_rows = [r for r in rows.values() if r.get("study") == "long" and r.get("curve")]
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in long_rows:
        groups.setdefault((r["dataset"], r["distribution"], r["shot"]), []).append(r)
    if groups:
        fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.5), squeeze=False)
        for ax, ((dataset, distribution, shot), members) in zip(axes[0], groups.items()):
            for r in members:
                xs, ys = zip(*r["curve"])
                tau = r.get("local_steps")
                ax.plot(xs, [100 * y for y in ys], "-o", ms=3,
                        label=f"{METHOD_NAMES.get(r['method'], r['method'])}" + (f", tau={tau}" if tau else ""))
            ax.set_xlabel("round")
            ax.set_ylabel("test accuracy (%)")
            ax.set_title(f"{dataset} {distribution} {shot}-shot, longer runs")
            ax.axhline(20, color="grey", lw=0.8, ls=":")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(DOCS / "long.png", dpi=110)
        plt.close(fig)

    # Fig. 4: ablation bars on HuffPost.
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.2
    drawn = False
    for k, (variant, options) in enumerate(ABLATIONS.items()):
        values = [acc(f"table huffpost {d} {s}-shot f2l" if not options else f"ablation huffpost {d} {s}-shot {variant}")
                  for d, s in columns]
        xs = [i + (k - 1.5) * width for i, v in enumerate(values) if v is not None]
        if xs:
            ax.bar(xs, [v for v in values if v is not None], width, label=variant)
            drawn = True
    if drawn:
        ax.set_xticks(range(4), [f"{'I' if d == 'IID' else 'N'}-{s}" for d, s in columns])
        ax.set_ylabel("test accuracy (%)")
        ax.set_title("Ablation on HuffPost (cf. paper Fig. 4b); dotted: chance")
        ax.axhline(20, color="grey", lw=0.8, ls=":")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(DOCS / "ablation.png", dpi=110)
    plt.close(fig)

    # Fig. 5: lambda sensitivity.
    fig, ax = plt.subplots(figsize=(5, 3.5))
    drawn = False
    for s in (1, 5):
        for which, style in (("lambda_mi", "-o"), ("lambda_kd", "--s")):
            points = [(v, acc(f"table huffpost Non-IID {s}-shot f2l" if v == 0.5 else
                              f"lambda huffpost Non-IID {s}-shot {which}={v}")) for v in LAMBDAS]
            points = [(v, a) for v, a in points if a is not None]
            if len(points) > 1:
                ax.plot(*zip(*points), style, label=f"{which}, {s}-shot")
                drawn = True
    if drawn:
        ax.set_xlabel("lambda (the other one at 0.5)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title("HuffPost, non-IID (cf. paper Fig. 5)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(DOCS / "lambda.png", dpi=110)
    plt.close(fig)

    # Fig. 6: number of clients.
    fig, ax = plt.subplots(figsize=(5, 3.5))
    drawn = False
    for method, name in METHOD_NAMES.items():
        for s, style in ((1, "-o"), (5, "--s")):
            points = [(c, acc(f"table femnist Non-IID {s}-shot {method}" if c == 10 else
                              f"clients femnist Non-IID {s}-shot {method} I={c}")) for c in CLIENT_COUNTS]
            points = [(c, a) for c, a in points if a is not None]
            if len(points) > 2:
                ax.plot(*zip(*points), style, label=f"{name}, {s}-shot")
                drawn = True
    if drawn:
        ax.set_xscale("log")
        ax.set_xticks(CLIENT_COUNTS, [str(c) for c in CLIENT_COUNTS])
        ax.set_xlabel("number of clients I")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title("FEMNIST, non-IID (cf. paper Fig. 6, FC100)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(DOCS / "clients.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("table")
    p.add_argument("--datasets", nargs="+", default=["huffpost", "femnist"])
    p.add_argument("--methods", nargs="+", default=list(METHOD_NAMES))
    p = sub.add_parser("ablation")
    p.add_argument("--datasets", nargs="+", default=["huffpost"])
    p.add_argument("--distributions", nargs="+", default=list(DISTRIBUTIONS), choices=list(DISTRIBUTIONS))
    p.add_argument("--shots", nargs="+", type=int, default=[1, 5])
    p = sub.add_parser("lambda")
    p.add_argument("--shots", nargs="+", type=int, default=[1])
    p = sub.add_parser("clients")
    p.add_argument("--datasets", nargs="+", default=["femnist"])
    p.add_argument("--methods", nargs="+", default=["f2l", "fl-proto"])
    p.add_argument("--shots", nargs="+", type=int, default=[1])
    p.add_argument("--counts", nargs="+", type=int, default=CLIENT_COUNTS)
    p = sub.add_parser("long")
    p.add_argument("--dataset", default="femnist")
    p.add_argument("--distribution", default="IID", choices=list(DISTRIBUTIONS))
    p.add_argument("--shot", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--local-steps", type=int, default=None, help="tau (default: the config's)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an algorithm option for every method of the run (repeatable)")
    p.add_argument("--methods", nargs="+", default=["f2l", "fl-proto"])
    p = sub.add_parser("adaptation")
    p.add_argument("--datasets", nargs="+", default=["huffpost", "femnist"])
    p.add_argument("--shot", type=int, default=1)
    p = sub.add_parser("preset")
    p.add_argument("--shots", nargs="+", type=int, default=[1, 5])
    p = sub.add_parser("control")
    p.add_argument("--datasets", nargs="+", default=["huffpost", "femnist"])
    p.add_argument("--methods", nargs="+", default=list(METHOD_NAMES))
    sub.add_parser("mi")
    sub.add_parser("report")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    install_dataset_cache()
    commands = {"table": cmd_table, "ablation": cmd_ablation, "lambda": cmd_lambda, "clients": cmd_clients,
                "long": cmd_long, "preset": cmd_preset, "adaptation": cmd_adaptation, "control": cmd_control,
                "mi": cmd_mi, "report": report}
    commands[args.command](args)
    report()
    return 0


if __name__ == "__main__":
    # The committed configs name no data folder: read $FEDFEW_DATA, else the repository's sibling
    # ../shared/data where these results were produced.
    os.environ.setdefault("FEDFEW_DATA", str(REPO.parent / "shared" / "data"))
    raise SystemExit(main())
