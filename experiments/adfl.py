"""AdFL (FedCSIS 2023) experiments: every one-shot method on the same trained clients.

All the compared methods share the client step (the initial model, Adam lr 1e-3, E local epochs on
all local data) and differ only on the server, so per setting and seed the 50 clients are trained
once (``run_round`` with the ``adfl`` algorithm, exactly as ``fedfew run`` would train them, with
5-fold cross-validation scores added for the CV baseline, which leave the returned models unchanged)
and every method's ``aggregate`` and ``evaluate`` is applied to the same returned models. Each
method is the base config plus ``--set`` overrides (METHODS below), so any single number can be
reproduced with ``fedfew run configs/adfl/<setting>.yaml --set seed=S --set ...``.

Beyond the paper (``--bad-seeds``): five of the clients are replaced by clients trained on flipped
labels (y -> 9 - y) or on pure noise images, and we record where the coherence score ranks them and
what the methods' accuracies become.

    .venv/bin/python experiments/adfl.py run --seeds 15 --bad-seeds 5 --ablation-seeds 5
    .venv/bin/python experiments/adfl.py control --seeds 15   # the initial model, before any training
    .venv/bin/python experiments/adfl.py report

``run`` appends one JSON line per (setting, seed) to runs/adfl/records.jsonl and skips those
already there (so an interrupted run resumes); ``report`` writes docs/adfl/results.md, the box
plots and docs/adfl/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedfew.algorithms.adfl import AdFL
from fedfew.algorithms.oneshot import ensemble_predictions, member_probabilities
from fedfew.config import load_config
from fedfew.engine import ALGORITHMS, ClientData
from fedfew.engine.algorithm import ClientResult
from fedfew.experiment import build_experiment
from fedfew.seeding import torch_generator

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "adfl"
SETTINGS = {"mnist_iid": "MNIST, IID", "mnist_label_skew": "MNIST, label skew (4 classes per client)"}
#: Epochs of each of the 5 cross-validation folds (Guha et al. train each fold like the final model,
#: i.e. 15 epochs; 2 here to fit the compute budget, see docs/adfl.md).
CV = ["algorithm.options.cv_folds=5", "algorithm.options.cv_epochs=2"]
ONESHOT = ["algorithm.name=oneshot"]
#: label -> overrides of the setting's config (which runs the AdFL ensemble).
METHODS: dict[str, list[str]] = {
    "AdFL ensemble": [],
    "AdFL vote": ["algorithm.options.combine=vote"],
    "AdFL CS-weighted": ["algorithm.options.combine=weighted"],
    "FedAvg (1 round)": ONESHOT + ["algorithm.options.selection=all", "algorithm.options.combine=average"],
    "random ensemble": ONESHOT + ["algorithm.options.selection=random"],
    "CV ensemble": ONESHOT + ["algorithm.options.selection=cv"] + CV,
    "data-size ensemble": ONESHOT + ["algorithm.options.selection=data_size"],
}
#: Server-side ablation on the first --ablation-seeds seeds: the other reading of the paper's alpha.
ABLATION = {"AdFL ensemble, alpha=1/255": ["algorithm.options.step_size=0.00392156862745098"]}
#: Methods re-run with bad clients.
BAD_METHODS = ["AdFL ensemble", "AdFL CS-weighted", "FedAvg (1 round)", "random ensemble", "CV ensemble"]
BAD_CLIENTS = 5
TRAIN_KEYS = ("local_epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay")
#: The paper's MNIST medians (%), section V.C (Figs. 2-3 are box plots; the text gives the medians).
#: Label skew: "aggregated versions of the models perform better than the ensembles, with AdFL and
#: FedAvg reaching 30.6% and 27.4%, and AdFL, cross-validation, and random ensembles reaching 24.6%,
#: 26.4%, 23.3%" (the aggregated AdFL is the CS-weighted average).
PAPER = {
    "mnist_iid": {"AdFL ensemble": "87.6", "CV ensemble": "86.9", "random ensemble": "86.9",
                  "FedAvg (1 round)": "82", "AdFL CS-weighted": "82.2"},
    "mnist_label_skew": {"AdFL CS-weighted": "30.6", "FedAvg (1 round)": "27.4", "AdFL ensemble": "24.6",
                         "CV ensemble": "26.4", "random ensemble": "23.3"},
}
CONTROL_LABEL = "(control) the initial model, before any training"


def method_algorithm(setting: str, seed: int, overrides: list[str], context: Any, shared: Any) -> Any:
    config = load_config(CONFIGS / f"{setting}.yaml", [f"seed={seed}", *overrides])
    options = config.algorithm_options()
    for key in TRAIN_KEYS:  # the client step must be the one the shared clients ran
        if getattr(options, key) != getattr(shared.options, key):
            raise ValueError(f"{overrides}: {key} differs from the shared client training")
    return ALGORITHMS.get(config.algorithm.name)(options, context)


def scores_of(server: dict[str, Any], ids: list[int]) -> dict[str, torch.Tensor]:
    """The coherence record of an AdFL server as the tensors ``AdFL.combine_scored`` takes."""
    out = {k: torch.tensor([server[k][i] for i in ids], dtype=torch.float64)
           for k in ("coherence", "was_predicted", "predicted_others")}
    out["own_success"] = torch.tensor(server["own_success"])
    return out


def apply_methods(names: dict[str, list[str]], setting: str, seed: int, experiment: Any, shared: AdFL,
                  server0: dict[str, Any], results: dict[int, ClientResult],
                  adfl_server: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Aggregate and evaluate every method on the same returned models. ``adfl_server`` is the
    AdFL ensemble's aggregate of these results, when already computed (its coherence scores are
    reused by the other AdFL combinations: no second attack)."""
    ids = sorted(results)
    states = [results[i].upload["model"] for i in ids]
    out: dict[str, dict[str, Any]] = {}
    for label, overrides in names.items():
        start = time.perf_counter()
        algorithm = method_algorithm(setting, seed, overrides, experiment.context, shared)
        generator = torch_generator(seed, "aggregate", 0)
        if isinstance(algorithm, AdFL) and adfl_server is not None and algorithm.options.step_size == shared.options.step_size:
            # The same samples and scores aggregate() would compute, and the generator as it would
            # stand after computing them, so the result is aggregate()'s.
            if label == "AdFL ensemble":
                server = adfl_server
            else:
                after = torch.Generator().set_state(adfl_server["_generator_after_scoring"].get_state())
                server = algorithm.combine_scored(server0, ids, states, scores_of(adfl_server, ids), after)
        else:
            server = algorithm.aggregate(server0, results, generator)
        metrics = algorithm.evaluate(server, experiment.test, torch_generator(seed, "evaluate", "test"))
        out[label] = {"accuracy": metrics["accuracy"], "member_ids": server.get("member_ids", []),
                      "seconds": round(time.perf_counter() - start, 2)}
        if "coherence" in server:
            out[label]["coherence"] = [server["coherence"][i] for i in ids]
            out[label]["own_success"] = server["own_success"]
    return out


def adfl_aggregate(shared: AdFL, server0: dict[str, Any], results: dict[int, ClientResult], seed: int) -> dict[str, Any]:
    """``shared.aggregate`` with the generator state after scoring kept, for the other combinations."""
    ids = sorted(results)
    states = [results[i].upload["model"] for i in ids]
    generator = torch_generator(seed, "aggregate", 0)
    scores = shared.score(states, generator)
    after = torch.Generator().set_state(generator.get_state())
    server = shared.combine_scored(server0, ids, states, scores, generator)
    return {**server, "_generator_after_scoring": after}


def corrupted(client: ClientData, kind: str, seed: int, num_classes: int) -> ClientData:
    data = client.train
    if kind == "flipped":
        return replace(client, train=replace(data, labels=num_classes - 1 - data.labels))
    noise = torch.rand(data.inputs.shape, generator=torch_generator(seed, "noise-client", client.client_id))
    return replace(client, train=replace(data, inputs=noise))


def rank_of(scores: list[float], ids: list[int]) -> list[int]:
    """1-based ranks (1 = highest score) of ``ids``."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return [order.index(i) + 1 for i in ids]


def run_seed(setting: str, seed: int, bad: bool, ablation: bool) -> dict[str, Any]:
    start, cpu = time.perf_counter(), time.process_time()
    config = load_config(CONFIGS / f"{setting}.yaml", [f"seed={seed}", *CV, "runtime.progress=false"])
    experiment = build_experiment(config)
    shared = experiment.algorithm
    assert isinstance(shared, AdFL)
    server0 = shared.init_server(torch_generator(seed, "server-init"))
    everyone = list(range(len(experiment.clients)))
    # The round as the simulator's run_round runs it: the same payloads and generators.
    results: dict[int, ClientResult] = {}
    for cid in everyone:
        payload = shared.broadcast(server0, cid)
        results[cid] = shared.client_update(payload, None, experiment.clients[cid],
                                            torch_generator(seed, "client", 0, cid))
    train_seconds, train_cpu = time.perf_counter() - start, time.process_time() - cpu
    adfl_server = adfl_aggregate(shared, server0, results, seed)
    record: dict[str, Any] = {"setting": setting, "seed": seed, "train_seconds": round(train_seconds, 1),
                              "train_cpu_seconds": round(train_cpu, 1)}
    names = {**METHODS, **(ABLATION if ablation else {})}
    record["methods"] = apply_methods(names, setting, seed, experiment, shared, server0, results, adfl_server)
    test = experiment.test.dataset
    states = [results[i].upload["model"] for i in everyone]
    probabilities = member_probabilities(shared.model, states, test.inputs)
    record["client_accuracy"] = (probabilities.argmax(-1) == test.labels).double().mean(1).tolist()
    record["all_clients_ensemble"] = float((ensemble_predictions(probabilities, "ensemble") == test.labels).double().mean())
    record["cv_score"] = [float(results[i].upload["cv_score"]) for i in everyone]
    record["coherence"] = [adfl_server["coherence"][i] for i in everyone]
    if bad:
        record["bad"] = {}
        bad_ids = list(range(BAD_CLIENTS))
        for kind in ("flipped", "noise"):
            replaced = dict(results)
            for cid in bad_ids:
                client = corrupted(experiment.clients[cid], kind, seed, experiment.context.num_classes)
                replaced[cid] = shared.client_update(shared.broadcast(server0, cid), None, client,
                                                     torch_generator(seed, "client", 0, cid))
            bad_server = adfl_aggregate(shared, server0, replaced, seed)
            methods = apply_methods({k: METHODS[k] for k in BAD_METHODS}, setting, seed, experiment, shared,
                                    server0, replaced, bad_server)
            coherence = [bad_server["coherence"][i] for i in everyone]
            cv = [float(replaced[i].upload["cv_score"]) for i in everyone]
            record["bad"][kind] = {
                "methods": methods,
                "coherence_ranks": rank_of(coherence, bad_ids),
                "cv_ranks": rank_of(cv, bad_ids),
                "coherence": coherence,
                "cv_score": cv,
            }
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["cpu_seconds"] = round(time.process_time() - cpu, 1)
    return record


def cmd_run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "records.jsonl"
    done = set()
    if path.exists():
        done = {(r["setting"], r["seed"]) for r in map(json.loads, path.read_text().splitlines())}
    for seed in range(args.seeds):  # seed-major, so that every setting has k seeds after k rounds
        for setting in args.settings:
            if (setting, seed) in done:
                continue
            record = run_seed(setting, seed, bad=seed < args.bad_seeds and setting in args.bad_settings,
                              ablation=seed < args.ablation_seeds)
            with path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            accs = ", ".join(f"{k}: {100 * v['accuracy']:.1f}" for k, v in record["methods"].items())
            print(f"[{setting} seed {seed}] {record['seconds']:.0f}s, cpu {record['cpu_seconds']:.0f}s "
                  f"(train {record['train_seconds']:.0f}s) {accs}",
                  flush=True)


# -- report ------------------------------------------------------------------------------------------


def pct(values: list[float]) -> str:
    return f"{100 * statistics.median(values):.1f} / {100 * max(values):.1f}"


def boxplot(groups: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    labels = list(groups)
    ax.boxplot([[100 * v for v in groups[k]] for k in labels], showmeans=False)
    ax.set_xticks(range(1, len(labels) + 1), [textwrap.fill(k, 13) for k in labels], fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def cmd_report(args: argparse.Namespace) -> None:
    records = [json.loads(line) for line in (Path(args.out) / "records.jsonl").read_text().splitlines()]
    docs = Path(args.docs)
    docs.mkdir(parents=True, exist_ok=True)
    lines = ["# AdFL on MNIST: test accuracy (%), median / max over seeds", ""]
    summary: dict[str, Any] = {}
    for setting, title in SETTINGS.items():
        rows = [r for r in records if r["setting"] == setting]
        if not rows:
            continue
        groups = {m: [r["methods"][m]["accuracy"] for r in rows] for m in METHODS}
        groups["single clients (all, every seed)"] = [a for r in rows for a in r["client_accuracy"]]
        groups["ensemble of all 50 clients"] = [r["all_clients_ensemble"] for r in rows]
        control_file = docs / "control.json"
        if control_file.is_file():
            controls = json.loads(control_file.read_text()).get(setting, [])
            if controls:
                groups[CONTROL_LABEL] = [c["accuracy"] for c in controls]
        boxplot(groups, docs / f"{setting}.png", f"{title}: {len(rows)} seeds")
        lines += [f"## {title} ({len(rows)} seeds)", "", "| method | ours: median / max | paper |", "|---|---|---|"]
        for m, values in groups.items():
            lines.append(f"| {m} | {pct(values)} | {PAPER[setting].get(m, '')} |")
        ablation = [r for r in rows if all(k in r["methods"] for k in ABLATION)]
        for name in ABLATION:
            if ablation:
                same = [r["methods"]["AdFL ensemble"]["accuracy"] for r in ablation]
                other = [r["methods"][name]["accuracy"] for r in ablation]
                own = [r["methods"][name]["own_success"] for r in ablation]
                own1 = [r["methods"]["AdFL ensemble"]["own_success"] for r in ablation]
                lines.append(f"| ablation, {len(ablation)} seeds: {name} | {pct(other)} (alpha=1 on the same "
                             f"seeds: {pct(same)}) | |")
                lines.append(f"| samples classified as their target by their own model | alpha=1/255: "
                             f"{100 * statistics.mean(own):.1f}%, alpha=1: {100 * statistics.mean(own1):.1f}% | |")
        wins = ", ".join(
            f"{m} in {sum(r['methods']['AdFL ensemble']['accuracy'] > r['methods'][m]['accuracy'] for r in rows)}"
            for m in ("random ensemble", "CV ensemble", "FedAvg (1 round)"))
        lines += ["", f"Paired on the same clients, the AdFL ensemble beats the {wins} of the {len(rows)} seeds."]
        corr = [float(torch.corrcoef(torch.tensor([r["coherence"], r["client_accuracy"]]))[0, 1]) for r in rows]
        cvcorr = [float(torch.corrcoef(torch.tensor([r["cv_score"], r["client_accuracy"]]))[0, 1]) for r in rows]
        lines += ["", f"Correlation of a client's coherence score with its own test accuracy, median over seeds: "
                  f"{statistics.median(corr):.2f} (its CV score: {statistics.median(cvcorr):.2f}). "
                  f"Client training per seed (50 clients, with their 5-fold CV): median "
                  f"{statistics.median(r['train_cpu_seconds'] for r in rows):.0f} s CPU "
                  f"({statistics.median(r['train_seconds'] for r in rows):.0f} s wall); whole seed median "
                  f"{statistics.median(r['cpu_seconds'] for r in rows):.0f} s CPU "
                  f"({statistics.median(r['seconds'] for r in rows):.0f} s wall); all seeds of this setting "
                  f"{sum(r['cpu_seconds'] for r in rows) / 60:.1f} min CPU.", ""]
        summary[setting] = {m: {"median": statistics.median(v), "max": max(v), "n": len(v)} for m, v in groups.items()}
        if setting == "mnist_label_skew":
            lines += coverage_lines(setting, rows)
        summary[setting]["coherence_accuracy_correlation"] = statistics.median(corr)
        bad_rows = [r for r in rows if "bad" in r]
        if bad_rows:
            bad_ids = set(range(BAD_CLIENTS))
            lines += [f"### {title}: {BAD_CLIENTS} of the 50 clients bad ({len(bad_rows)} seeds)", "",
                      "Where the bad clients rank (1 = best of 50), how many of the "
                      f"{BAD_CLIENTS * len(bad_rows)} bad client-seeds each ensemble took in, and test "
                      "accuracy (%) as median (min-max) over the seeds:", "",
                      "| bad clients | coherence rank, median (range) | in AdFL top 5 | CV-score rank, median (range) "
                      "| in CV top 5 | in random 5 | " + " | ".join(BAD_METHODS) + " |", "|---" * (6 + len(BAD_METHODS)) + "|"]

            def spread(values: list[float]) -> str:
                return f"{100 * statistics.median(values):.1f} ({100 * min(values):.1f}-{100 * max(values):.1f})"

            clean = " | ".join(spread([r["methods"][m]["accuracy"] for r in bad_rows]) for m in BAD_METHODS)
            lines.append(f"| none (same seeds) | | | | | | {clean} |")
            bad_groups: dict[str, list[float]] = {}
            for kind in ("flipped", "noise"):
                ranks = [k for r in bad_rows for k in r["bad"][kind]["coherence_ranks"]]
                cv_ranks = [k for r in bad_rows for k in r["bad"][kind]["cv_ranks"]]
                taken = {m: sum(len(bad_ids & set(r["bad"][kind]["methods"][m]["member_ids"])) for r in bad_rows)
                         for m in ("AdFL ensemble", "CV ensemble", "random ensemble")}
                accs = " | ".join(spread([r["bad"][kind]["methods"][m]["accuracy"] for r in bad_rows]) for m in BAD_METHODS)
                lines.append(f"| {kind} | {statistics.median(ranks):.0f} ({min(ranks)}-{max(ranks)}) | "
                             f"{taken['AdFL ensemble']} | {statistics.median(cv_ranks):.0f} ({min(cv_ranks)}-{max(cv_ranks)}) | "
                             f"{taken['CV ensemble']} | {taken['random ensemble']} | {accs} |")
                for m in ("AdFL ensemble", "random ensemble", "CV ensemble", "FedAvg (1 round)"):
                    bad_groups[f"{m}, {kind}"] = [r["bad"][kind]["methods"][m]["accuracy"] for r in bad_rows]
                summary[setting][f"bad_{kind}_coherence_rank_median"] = statistics.median(ranks)
            lines.append("")
            boxplot(bad_groups, docs / f"{setting}_bad_clients.png", f"{title}: 5 bad clients of 50")
    (docs / "results.md").write_text("\n".join(lines) + "\n")
    (docs / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    fill_page(Path(args.page), lines[2:])
    print("\n".join(lines))


def coverage_lines(setting: str, rows: list[dict[str, Any]]) -> list[str]:
    """How many of the 10 classes the ensembles' members hold between them, from each seed's
    partition (rebuilt from the config; no training)."""
    covered: dict[str, list[int]] = {}
    for r in rows:
        experiment = build_experiment(load_config(CONFIGS / f"{setting}.yaml", [f"seed={r['seed']}"]))
        classes = [set(c.train.labels.unique().tolist()) for c in experiment.clients]
        for m, result in r["methods"].items():
            if m in METHODS and result["member_ids"] and len(result["member_ids"]) < len(classes):
                covered.setdefault(m, []).append(len(set().union(*(classes[i] for i in result["member_ids"]))))
    cells = " | ".join(f"{statistics.median(v):.0f} ({min(v)}-{max(v)})" for v in covered.values())
    return ["Classes (of 10) present in the 5 ensemble members' data, median (range) over seeds:", "",
            "| " + " | ".join(covered) + " |", "|---" * len(covered) + "|", f"| {cells} |", ""]


def fill_page(page: Path, lines: list[str]) -> None:
    """Replace the generated block of the docs page (between the two markers) with ``lines``."""
    if not page.exists():
        return
    text = page.read_text()
    begin, end = "<!-- results:begin (experiments/adfl.py report) -->", "<!-- results:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"{page} lacks the markers {begin} ... {end}")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    body = "\n".join(line.replace("## ", "### ", 1) if line.startswith("## ") else
                     line.replace("### ", "#### ", 1) if line.startswith("### ") else line for line in lines)
    page.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def cmd_control(args: argparse.Namespace) -> None:
    """The untrained control: the initial model every client starts from (the server's seeded
    initial state, as ``run`` builds it), scored on the same test set. Writes docs/adfl/control.json."""
    torch.set_num_threads(1)
    out: dict[str, list[dict[str, Any]]] = {}
    for setting in args.settings:
        for seed in range(args.seeds):
            config = load_config(CONFIGS / f"{setting}.yaml", [f"seed={seed}", "runtime.progress=false"])
            experiment = build_experiment(config)
            shared = experiment.algorithm
            server0 = shared.init_server(torch_generator(seed, "server-init"))
            test = experiment.test.dataset
            probabilities = member_probabilities(shared.model, [server0["model"]], test.inputs)
            accuracy = float((probabilities[0].argmax(-1) == test.labels).double().mean())
            out.setdefault(setting, []).append({"seed": seed, "accuracy": accuracy})
            print(f"[{setting} seed {seed}] initial model: {100 * accuracy:.1f}%", flush=True)
    path = Path(args.docs) / "control.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and score; appends to OUT/records.jsonl")
    run.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    run.add_argument("--seeds", type=int, default=15)
    run.add_argument("--bad-seeds", type=int, default=5, help="seeds (the first k) with the bad-client study")
    run.add_argument("--bad-settings", nargs="+", default=["mnist_iid"], choices=list(SETTINGS))
    run.add_argument("--ablation-seeds", type=int, default=5, help="seeds (the first k) with the alpha ablation")
    run.add_argument("--out", default=str(REPO / "runs" / "adfl"))
    control = sub.add_parser("control", help="the initial model's test accuracy per seed, into docs/adfl/control.json")
    control.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    control.add_argument("--seeds", type=int, default=15)
    control.add_argument("--docs", default=str(REPO / "docs" / "adfl"))
    report = sub.add_parser("report", help="tables and box plots into docs/adfl/")
    report.add_argument("--out", default=str(REPO / "runs" / "adfl"))
    report.add_argument("--docs", default=str(REPO / "docs" / "adfl"))
    report.add_argument("--page", default=str(REPO / "docs" / "adfl.md"), help="docs page whose results block is filled")
    args = parser.parse_args(argv)
    {"run": cmd_run, "control": cmd_control, "report": cmd_report}[args.command](args)


if __name__ == "__main__":
    # The committed configs name no data folder: read $FEDFEW_DATA, else the repository's sibling
    # ../shared/data where these results were produced.
    os.environ.setdefault("FEDFEW_DATA", str(REPO.parent / "shared" / "data"))
    main(sys.argv[1:])
