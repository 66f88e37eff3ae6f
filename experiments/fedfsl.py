"""FedFSL (Fan & Huang 2021) experiments: the tables and figures of docs/fedfsl.md.

    .venv/bin/python experiments/fedfsl.py toy         # section 5.3 / Fig. 6 on MNIST (2-D features)
    .venv/bin/python experiments/fedfsl.py toy-control # Fig. 6's untrained control
    .venv/bin/python experiments/fedfsl.py ceiling     # what the Fig. 6 network reaches trained centrally
    (Table 3 and section 5.4.4 are studies now: studies/fedfsl_table3.yaml, studies/fedfsl_reference.yaml.)
    .venv/bin/python experiments/fedfsl.py devices     # Fig. 8: FedFSL-naive, -MI, -MI-Adv for K = 1..30 devices
    .venv/bin/python experiments/fedfsl.py headline --rounds 50 --local-steps 4   # Table 3's headline cell, larger budget
    .venv/bin/python experiments/fedfsl.py page        # (each command does this too) tables -> docs/fedfsl.md

The untrained control of a table is the same network at round 0 (the server's initial state),
scored by the same evaluation (the same fixed episodes and test-time adaptation) as the trained
models: ``build_experiment(config).simulator().evaluate(test)`` before any round.

Every run is a committed config (configs/fedfsl/) plus ``--set``-style overrides, run through
:func:`fedfew.runner.run_experiment`; finished runs are cached in ``runs/fedfsl/cache.jsonl`` by their
overrides, so an interrupted command resumes.
Outputs (small markdown, JSON and PNG files) go to ``docs/fedfsl/``, and the markdown tables are
copied into ``docs/fedfsl.md`` between its ``<!-- begin:NAME -->`` / ``<!-- end:NAME -->`` markers.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.func import functional_call

import fedfew.experiment
from fedfew.config import load_config
from fedfew.data import load_dataset
from fedfew.engine.state import load_state_
from fedfew.evaluation import confusion
from fedfew.runner import run_experiment

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "fedfsl"
DOCS = REPO / "docs" / "fedfsl"
RUNS = REPO / "runs" / "fedfsl"
CACHE = RUNS / "cache.jsonl"
#: extra ``key=value`` overrides for every run (``--set``), e.g. to scale a quick check down.
EXTRA: list[str] = []
#: whether the committed runs (docs/fedfsl/*.json) may stand in for cache entries (``--fresh``: no)
USE_COMMITTED = [True]

# Several runs in one process read the same dataset: load it once (a speed cache; the loaders are
# deterministic and experiments never modify the dataset they are given).
fedfew.experiment.load_dataset = functools.lru_cache(maxsize=2)(load_dataset)

MLP = ["algorithm.options.classifier=mlp"]  # the paper's network (section 5.1), explicit in every cache key
LINEAR = ["algorithm.options.classifier=linear"]
METHODS = [  # (row label, algorithm name, extra overrides) in the order of the paper's Table 3
    # FSL-local: each client's own MAML model; `local` has only the zoo model's linear head (ours).
    ("FSL-local", "local", []),
    # the paper's network for every FedFSL row: the encoder and a two-layer classifier (section 5.1).
    # FedFSL-naive = fedfsl-prox with mu = 0 (bit for bit fl-maml on the same network, tested).
    ("FedFSL-naive", "fedfsl-prox", ["algorithm.options.mu=0.0", *MLP]),
    ("FedFSL-prox", "fedfsl-prox", MLP),
    ("FedFSL-MI", "fedfsl-mi", MLP),
    ("FedFSL-MI-Adv", "fedfsl-mi-adv", []),
    # ours: the linear-head network of our earlier table (fl-maml's), for comparison
    ("(ours) FedFSL-naive, linear head", "fl-maml", []),
    ("(ours) FedFSL-prox, linear head", "fedfsl-prox", LINEAR),
    ("(ours) FedFSL-MI, linear head", "fedfsl-mi", LINEAR),
]
#: The paper's Table 3 (a) miniImageNet and (b) FC100, 5-way, 10 clients, in the order of SETTINGS.
PAPER_TABLE3 = {
    "FSL-local": (("50.83", "67.47", "48.08", "63.25"), ("36.45", "47.68", "35.90", "52.93")),
    "FedFSL-naive": (("53.00", "67.63", "49.95", "66.11"), ("38.42", "49.97", "36.11", "51.58")),
    "FedFSL-prox": (("53.03", "69.05", "50.08", "68.53"), ("37.62", "48.99", "36.95", "53.02")),
    "FedFSL-MI": (("54.98", "69.07", "51.07", "68.57"), ("39.78", "50.65", "38.08", "52.98")),
    "FedFSL-MI-Adv": (("56.42", "70.92", "53.69", "69.61"), ("40.22", "51.18", "38.51", "54.43")),
}
#: The untrained controls: (row label, algorithm whose network and test-time adaptation is scored at round 0).
CONTROLS = [
    ("(control) untrained: the paper's network (two-layer classifier), round 0", "fedfsl-mi", MLP),
    ("(control) untrained: the linear-head network, round 0", "fl-maml", []),
]
SETTINGS = [  # (column label, overrides)
    ("IID 1-shot", ["partition.name=iid", "episodes.k_shot=1"]),
    ("IID 5-shot", ["partition.name=iid", "episodes.k_shot=5"]),
    ("non-IID 1-shot", ["partition.name=dirichlet", "episodes.k_shot=1"]),
    ("non-IID 5-shot", ["partition.name=dirichlet", "episodes.k_shot=5"]),
]


def cached_run(config_file: str, overrides: list[str], keep_simulator: bool = False) -> dict[str, Any]:
    """Run ``configs/fedfsl/<config_file>`` with ``overrides`` (or return the cached summary)."""
    overrides = [*overrides, *EXTRA]
    # the key holds the config file's text too, so editing a config never reuses a stale result
    key = json.dumps([config_file, (CONFIGS / config_file).read_text(), overrides])
    if not keep_simulator and CACHE.is_file():
        for line in CACHE.read_text().splitlines():
            record = json.loads(line)
            if record["key"] == key:
                return record["summary"]
    config = load_config(CONFIGS / config_file, overrides)
    print(f"running {config_file} {' '.join(overrides)}", file=sys.stderr, flush=True)
    summary = run_experiment(config, RUNS / "runs", progress=False, label=" ".join(overrides))
    kept = {k: v for k, v in summary.items() if k not in ("history", "_simulator")}
    print(f"  -> {kept['test']} in {kept['seconds']:.0f} s", file=sys.stderr, flush=True)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with CACHE.open("a") as f:
        f.write(json.dumps({"key": key, "summary": kept}) + "\n")
    return summary if keep_simulator else kept


def pct(test: dict[str, float]) -> str:
    return f"{100 * test['accuracy']:.1f} ± {100 * test['ci95']:.1f}"


# --- section 5.3, Fig. 6: MNIST in a 2-D feature space ---------------------------------------


def novel_confusion(algorithm: Any, episodes: Any) -> tuple[torch.Tensor, list[int]]:
    """Confusion counts [true, predicted] over the novel digits, pooled over all test episodes
    (episode labels mapped back to the digits they stand for)."""
    model = algorithm.model
    model.eval()
    preds, trues = [], []
    for ep in episodes:
        logits = algorithm.learner.predict(model, ep)
        preds.append(ep.classes[logits.argmax(-1)])
        trues.append(ep.classes[ep.query_labels])
    classes = sorted({int(c) for ep in episodes for c in ep.classes})
    matrix = confusion(torch.cat(preds), torch.cat(trues), max(classes) + 1)
    return matrix[classes][:, classes], classes


def adapted_feature_space(algorithm: Any, episode: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The encoder's and the classifier's parameters after test-time adaptation on ``episode``."""
    learner, model = algorithm.learner, algorithm.model
    params = {name: p.detach().requires_grad_() for name, p in model.named_parameters() if p.requires_grad}
    with torch.enable_grad():
        adapted = learner.adapt(model, params, episode, learner.test_inner_steps, create_graph=False)
    encoder = {k.removeprefix("encoder."): v.detach() for k, v in adapted.items() if k.startswith("encoder.")}
    head = {k.removeprefix("head."): v.detach() for k, v in adapted.items() if k.startswith("head.")}
    return encoder, head


def draw_feature_spaces(panels: list[tuple[str, Any, dict[str, float]]], dataset: Any, episode: Any, path: Path,
                        num_episodes: int) -> None:
    """For each method: novel test digits (up to 150 per digit) in the adapted 2-D feature space, the
    adapted classifier's decision regions, and the episode's support samples (stars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    digits = [int(c) for c in episode.classes]
    colours = {d: plt.cm.tab10(d) for d in range(10)}
    g = torch.Generator().manual_seed(0)
    picks = torch.cat([torch.nonzero(dataset.labels == d).flatten()[torch.randperm(
        int((dataset.labels == d).sum()), generator=g)[:150]] for d in digits])
    images, labels = dataset.inputs[picks], dataset.labels[picks]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.8))
    for ax, (title, algorithm, test) in zip(axes, panels):
        encoder, head = adapted_feature_space(algorithm, episode)
        with torch.no_grad():
            features = functional_call(algorithm.model.encoder, encoder, (images,))
            support = functional_call(algorithm.model.encoder, encoder, (episode.support,))
            lo, hi = features.min(0).values, features.max(0).values
            margin = 0.1 * (hi - lo)
            xs = torch.linspace(float(lo[0] - margin[0]), float(hi[0] + margin[0]), 300)
            ys = torch.linspace(float(lo[1] - margin[1]), float(hi[1] + margin[1]), 300)
            grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).reshape(-1, 2)
            regions = functional_call(algorithm.model.head, head, (grid,)).argmax(-1).reshape(300, 300)
        cmap = ListedColormap([colours[d] for d in digits])
        ax.contourf(xs, ys, regions, levels=torch.arange(-0.5, len(digits)).tolist(), cmap=cmap, alpha=0.22)
        for d in sorted(digits):
            mask = labels == d
            ax.scatter(features[mask, 0], features[mask, 1], s=5, color=colours[d], label=str(d))
        for i, d in enumerate(digits):
            ax.scatter(support[i, 0], support[i, 1], marker="*", s=260, color=colours[d], edgecolors="black",
                       linewidths=1.2)
        ax.set_title(f"{title}: {pct(test)}% ({num_episodes} test episodes)", fontsize=10)
        ax.set_xlabel("feature 1")
        ax.set_ylabel("feature 2")
        ax.legend(title="digit", fontsize=7, markerscale=2, loc="best")
    fig.suptitle("MNIST 5-way 1-shot on unseen digits 5-9: adapted 2-D features and decision regions "
                 "(stars: the episode's support samples)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def toy() -> None:
    """Train FedFSL-MI and FedFSL-MI-Adv on digits 0-4, test on 5-9; draw Fig. 6 and the confusions.
    Always trains (about 3 minutes): the picture needs the trained models, which the cache does not keep."""
    rows, panels, episode, dataset = [], [], None, None
    for title, name in (("FedFSL-MI", "fedfsl-mi"), ("FedFSL-MI-Adv", "fedfsl-mi-adv")):
        summary = cached_run("mnist_toy.yaml", [f"algorithm.name={name}"], keep_simulator=True)
        simulator = summary["_simulator"]
        algorithm = simulator.algorithm
        load_state_(algorithm.model, simulator.best_server["model"])
        episodes = simulator.test.episodes
        matrix, classes = novel_confusion(algorithm, episodes)
        recall = matrix.diag().double() / matrix.sum(1).double()
        worst = int(recall.argmin())
        off = matrix[worst].clone()
        off[worst] = -1
        confused = int(off.argmax())
        rows.append({
            "method": title, "test": summary["test"], "seconds": summary["seconds"],
            "per_digit_accuracy": {str(c): round(float(r), 4) for c, r in zip(classes, recall)},
            "least_accurate": classes[worst], "least_accurate_accuracy": float(recall[worst]),
            "confused_with": classes[confused],
            "confused_share": float(matrix[worst, confused] / matrix[worst].sum()),
            "confusion": matrix.tolist(), "classes": classes,
        })
        panels.append((title, algorithm, summary["test"]))
        episode, dataset = episodes[0], episodes.sampler.dataset
    DOCS.mkdir(parents=True, exist_ok=True)
    draw_feature_spaces(panels, dataset, episode, DOCS / "mnist_fig6.png", len(episodes))
    (DOCS / "mnist_toy.json").write_text(json.dumps(rows, indent=1) + "\n")
    paper = {"FedFSL-MI": "83.6", "FedFSL-MI-Adv": "87.5"}
    lines = ["| method | ours: accuracy (%) ± 95% CI | paper (%) | least accurate digit (accuracy) | "
             "most often taken for | run time (s) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {pct(r['test'])} | {paper[r['method']]} | {r['least_accurate']} "
                     f"({100 * r['least_accurate_accuracy']:.1f}%) | {r['confused_with']} "
                     f"({100 * r['confused_share']:.1f}% of its queries) | {r['seconds']:.0f} |")
    lines += ["", f"Per-digit accuracy (%), pooled over the {len(episodes)} test episodes' queries:", "",
              "| method | " + " | ".join(str(c) for c in rows[0]["classes"]) + " |",
              "|---|" + "---|" * len(rows[0]["classes"])]
    for r in rows:
        lines.append(f"| {r['method']} | " + " | ".join(f"{100 * v:.1f}" for v in r["per_digit_accuracy"].values()) + " |")
    (DOCS / "mnist_toy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def toy_control() -> None:
    """Fig. 6's untrained control: the MNIST network (the same for FedFSL-MI and -MI-Adv: feature
    generator and two-layer classifier) at round 0, on the same 300 test episodes."""
    result = untrained("mnist_toy.yaml", [])
    lines = ["| method | ours: accuracy (%) ± 95% CI | paper (%) |", "|---|---|---|",
             f"| (control) untrained: the Fig. 6 network at round 0, same test episodes | {pct(result['test'])} | — |"]
    DOCS.mkdir(parents=True, exist_ok=True)
    (DOCS / "mnist_toy_control.md").write_text("\n".join(lines) + "\n")
    (DOCS / "mnist_toy_control.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(lines))


# --- the MNIST example's ceiling: the same network trained centrally ---------------------------

#: (row, training digits, feature dimension). Test: 5-way 1-shot on digits 5-9 of held-out images.
CEILING_ROWS = [
    ("digits 0-4 -> unseen 5-9, 2-D features (the paper's setting)", [0, 1, 2, 3, 4], 2),
    ("digits 0-4 -> unseen 5-9, 64-D features", [0, 1, 2, 3, 4], 64),
    ("digits 0-9 -> 5-9 (test digits seen in training), 2-D features", list(range(10)), 2),
    ("digits 5-9 -> 5-9 (only the test digits), 2-D features", [5, 6, 7, 8, 9], 2),
]


def ceiling(steps: int = 1500, seed: int = 0) -> None:
    """Train the Fig. 6 network (configs/fedfsl/mnist_toy.yaml's feature generator, two-layer classifier
    and MAML inner loop) centrally, with no federation and no MI or adversarial term, on one half of
    each digit's images; test 5-way 1-shot 15-query on the other half of digits 5-9. Centralised
    training bounds what any federated method can reach with this network and data, so the rows say
    which setting the paper's 83.6% / 87.5% can come from."""
    from fedfew.algorithms.fedfsl import two_layer_classifier
    from fedfew.episodes import EpisodeSampler, FixedEpisodes
    from fedfew.meta.learners import MAML
    from fedfew.models import build_model
    from fedfew.seeding import seed_torch_init, torch_generator

    config = load_config(CONFIGS / "mnist_toy.yaml")
    torch.set_num_threads(config.runtime.threads)
    options = config.algorithm.options
    dataset = load_dataset(config.dataset.name, config.dataset.root, **config.dataset.options)
    # One seeded half of every digit's images for training, the other half for testing.
    order = torch.randperm(len(dataset), generator=torch_generator(seed, "ceiling-split"))
    halves = torch.zeros(len(dataset), dtype=torch.bool)
    for digit in range(10):
        mine = order[dataset.labels[order] == digit]
        halves[mine[: len(mine) // 2]] = True
    train_idx, test_idx = torch.nonzero(halves).flatten(), torch.nonzero(~halves).flatten()
    n_way, k_shot, q_query = config.episodes.n_way, config.episodes.k_shot, config.episodes.q_query
    test = FixedEpisodes(EpisodeSampler(dataset, n_way, k_shot, q_query, classes=[5, 6, 7, 8, 9], indices=test_idx),
                         config.episodes.test_episodes, seed, tag="ceiling-test")
    learner = MAML(inner_lr=options["inner_lr"], inner_steps=options["inner_steps"],
                   test_inner_steps=options["test_inner_steps"], first_order=options["first_order"])
    rows = []
    for title, digits, feature_dim in CEILING_ROWS:
        seed_torch_init(torch_generator(seed, "ceiling-init"))
        model = build_model(config.model.name, dataset.input_shape, None,
                            **{**config.model.options, "feature_dim": feature_dim})
        model.head = two_layer_classifier(model.feature_dim, options["classifier_hidden"], n_way)
        sampler = EpisodeSampler(dataset, n_way, k_shot, q_query, classes=digits, indices=train_idx)
        optimiser = torch.optim.Adam(model.parameters(), lr=options["lr"])
        generator = torch_generator(seed, "ceiling-train", title)
        start = time.perf_counter()
        for _ in range(steps):
            loss, _ = learner.loss(model, sampler.sample(generator))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        accuracies = torch.tensor([float((learner.predict(model, e).argmax(1) == e.query_labels).float().mean())
                                   for e in test])
        result = {"accuracy": float(accuracies.mean()),
                  "ci95": float(1.96 * accuracies.std() / len(accuracies) ** 0.5)}
        rows.append({"setting": title, "train_digits": digits, "feature_dim": feature_dim, "steps": steps,
                     "test": result, "seconds": round(time.perf_counter() - start, 1)})
        print(f"{title}: {pct(result)} ({rows[-1]['seconds']} s)", flush=True)
    DOCS.mkdir(parents=True, exist_ok=True)
    (DOCS / "mnist_ceiling.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [f"| centralised training ({steps} episodes, one process, no federation) | test accuracy on "
             "held-out images of 5-9 (%) ± 95% CI |", "|---|---|"]
    lines += [f"| {r['setting']} | {pct(r['test'])} |" for r in rows]
    (DOCS / "mnist_ceiling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# --- Table 3 ---------------------------------------------------------------------------------


def seed_cache(record_file: Path, config_file: str) -> None:
    """Put the committed runs of ``record_file`` ({row: {column: summary}}, whose summaries carry their
    overrides as ``label``) into the cache, so that a fresh clone rebuilds the tables without re-running
    them (the key is that of :func:`cached_run` with the current config text)."""
    if not record_file.is_file() or not USE_COMMITTED[0]:
        return
    known = set()
    if CACHE.is_file():
        known = {json.loads(line)["key"] for line in CACHE.read_text().splitlines()}
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with CACHE.open("a") as f:
        for row in json.loads(record_file.read_text()).values():
            for summary in row.values():
                if "label" not in summary:
                    continue
                overrides = summary["label"].split(" ")
                # runs made while fedfsl-prox/-mi defaulted to the linear head: make that explicit
                if any(o in ("algorithm.name=fedfsl-prox", "algorithm.name=fedfsl-mi") for o in overrides) and not any(
                        o.startswith("algorithm.options.classifier=") for o in overrides):
                    overrides = [*overrides, *LINEAR]
                key = json.dumps([config_file, (CONFIGS / config_file).read_text(), overrides])
                if key not in known:
                    f.write(json.dumps({"key": key, "summary": summary}) + "\n")
                    known.add(key)


def untrained(config_file: str, overrides: list[str]) -> dict[str, Any]:
    """The untrained control: the configured network at round 0, scored by the algorithm's own
    evaluation on the same fixed test episodes."""
    config = load_config(CONFIGS / config_file, [*overrides, *EXTRA])
    start = time.perf_counter()
    experiment = fedfew.experiment.build_experiment(config)
    test = experiment.simulator().evaluate(experiment.test)
    return {"test": {"accuracy": test["accuracy"], "ci95": test["ci95"]}, "seconds": time.perf_counter() - start,
            "label": " ".join(overrides)}




def headline(rounds: int, local_steps: int) -> None:
    """Table 3's headline cell (non-IID 1-shot, where the paper's MI-Adv leads naive by 3.7 points on
    miniImageNet and 2.4 on FC100) at a larger budget, with the untrained controls. Each budget run is
    kept in docs/fedfsl/headline.json; the table shows every budget run so far beside Table 3's."""
    column, settings = SETTINGS[2]
    budget = [f"federation.rounds={rounds}", f"algorithm.options.local_steps={local_steps}", f"eval.every={rounds}"]
    rows = [m for m in METHODS if m[1] != "local" and not m[0].startswith("(ours)")]  # FSL-local: 10 models to score
    path = DOCS / "headline.json"
    saved: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    if "rounds" in saved:  # a single record (the first format)
        saved = {f"{saved['rounds']}x{saved['local_steps']}": saved}
    record: dict[str, Any] = {"rounds": rounds, "local_steps": local_steps, "setting": column, "methods": {},
                              "controls": {}}
    for row, name, extra in rows:
        record["methods"][row] = cached_run("omniglot.yaml", [f"algorithm.name={name}", *settings, *extra, *budget])
    for row, name, extra in CONTROLS:
        record["controls"][row] = untrained("omniglot.yaml", [f"algorithm.name={name}", *settings, *extra])
    saved[f"{rounds}x{local_steps}"] = record
    budgets = sorted(saved, key=lambda k: saved[k]["rounds"] * saved[k]["local_steps"])
    small = json.loads((DOCS / "table3.json").read_text()) if (DOCS / "table3.json").is_file() else {}
    titles = ["20 x 2 (Table 3, 400 client episodes)"] + [
        f"{saved[b]['rounds']} x {saved[b]['local_steps']} ({10 * saved[b]['rounds'] * saved[b]['local_steps']} client "
        "episodes)" for b in budgets]
    lines = [f"| method ({column}), rounds x local steps | " + " | ".join(titles)
             + " | paper miniImageNet | paper FC100 |", "|---|" + "---|" * (len(titles) + 2)]
    for row, _, _ in rows:
        mini, fc100 = PAPER_TABLE3.get(row, (("—",) * 4, ("—",) * 4))
        cells = [pct(small[row][column]["test"]) if row in small else "—"]
        cells += [pct(saved[b]["methods"][row]["test"]) if row in saved[b]["methods"] else "—" for b in budgets]
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {mini[2]} | {fc100[2]} |")
    for row, _, _ in CONTROLS:
        control = saved[budgets[-1]]["controls"].get(row)
        cells = [pct(control["test"]) if control else "—"] * (len(titles))
        lines.append(f"| {row} | " + " | ".join(cells) + " | — | — |")
    times = "; ".join(f"{b}: " + ", ".join(f"{r} {saved[b]['methods'][r]['seconds']:.0f} s" for r in saved[b]["methods"])
                      for b in budgets)
    lines += ["", f"Run time (wall clock, shared machine): {times}."]
    DOCS.mkdir(parents=True, exist_ok=True)
    (DOCS / "headline.md").write_text("\n".join(lines) + "\n")
    path.write_text(json.dumps(saved, indent=1) + "\n")
    print("\n".join(lines))


# --- section 5.4.4: which global model the MI term uses --------------------------------------




# --- Fig. 8: the number of devices -----------------------------------------------------------


#: Fig. 8's methods. The paper's text names FedFSL-MI-Adv and FedFSL-MI among "all 3 approaches"; the
#: third is not named in the text we have (the figure is not in it): FedFSL-naive, its baseline.
DEVICE_METHODS = [("FedFSL-naive", "fedfsl-prox", ["algorithm.options.mu=0.0", *MLP]),
                  ("FedFSL-MI", "fedfsl-mi", MLP), ("FedFSL-MI-Adv", "fedfsl-mi-adv", [])]
DEVICE_COUNTS = [1, 2, 5, 10, 20, 30]
#: The only numbers of Fig. 8 in the paper's text (miniImageNet, non-IID 5-way 1-shot).
PAPER_FIG8 = {("FedFSL-MI-Adv", 1): "54.41", ("FedFSL-MI-Adv", 2): "54.96"}


def devices() -> None:
    """Fig. 8: non-IID 5-way 1-shot on Omniglot for K = 1..30 devices, all training every round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {(title, k): cached_run("omniglot.yaml", [f"algorithm.name={name}", "partition.name=dirichlet",
                                                      "episodes.k_shot=1", f"partition.num_clients={k}",
                                                      "federation.clients_per_round=1.0", *extra])
            for title, name, extra in DEVICE_METHODS for k in DEVICE_COUNTS}
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for title, _, _ in DEVICE_METHODS:
        acc = [100 * runs[title, k]["test"]["accuracy"] for k in DEVICE_COUNTS]
        ci = [100 * runs[title, k]["test"]["ci95"] for k in DEVICE_COUNTS]
        ax.errorbar(DEVICE_COUNTS, acc, yerr=ci, marker="o", capsize=3, label=title)
    ax.set_xscale("log")
    ax.set_xticks(DEVICE_COUNTS, [str(k) for k in DEVICE_COUNTS])
    ax.set_xlabel("number of devices K")
    ax.set_ylabel("5-way 1-shot accuracy (%)")
    ax.set_title("Omniglot, non-IID (Dirichlet 1.0), 20 rounds x 2 local steps", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    DOCS.mkdir(parents=True, exist_ok=True)
    fig.savefig(DOCS / "devices.png", dpi=100)
    plt.close(fig)
    local_steps = load_config(CONFIGS / "omniglot.yaml").algorithm.options["local_steps"]
    rounds = load_config(CONFIGS / "omniglot.yaml").federation.rounds
    lines = ["| K | local steps in all (K x rounds x local_steps) | "
             + " | ".join(f"{t} ours | {t} paper (miniImageNet)" for t, _, _ in DEVICE_METHODS) + " | run time (s), "
             + " / ".join(t for t, _, _ in DEVICE_METHODS) + " |", "|---|---|" + "---|" * (2 * len(DEVICE_METHODS) + 1)]
    for k in DEVICE_COUNTS:
        cells = " | ".join(f"{pct(runs[t, k]['test'])} | {PAPER_FIG8.get((t, k), '—')}" for t, _, _ in DEVICE_METHODS)
        times = " / ".join(f"{runs[t, k]['seconds']:.0f}" for t, _, _ in DEVICE_METHODS)
        lines.append(f"| {k} | {k * rounds * local_steps} | {cells} | {times} |")
    (DOCS / "devices.md").write_text("\n".join(lines) + "\n")
    (DOCS / "devices.json").write_text(json.dumps({f"{t} K={k}": runs[t, k] for t, k in runs}, indent=1) + "\n")
    print("\n".join(lines))


def fill_page() -> None:
    """Copy the generated tables into docs/fedfsl.md between its ``<!-- begin:NAME -->`` and
    ``<!-- end:NAME -->`` markers, so that the page never holds a hand-typed result."""
    page = REPO / "docs" / "fedfsl.md"
    if not page.is_file():
        return
    text = page.read_text()
    for name in ("mnist_toy", "mnist_toy_control", "mnist_ceiling", "devices", "headline"):
        table, begin, end = DOCS / f"{name}.md", f"<!-- begin:{name} -->", f"<!-- end:{name} -->"
        if table.is_file() and begin in text and end in text:
            head, rest = text.split(begin, 1)
            text = head + begin + "\n" + table.read_text() + end + rest.split(end, 1)[1]
    page.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["toy", "toy-control", "ceiling", "devices", "headline", "page"])
    parser.add_argument("--fresh", action="store_true",
                        help="do not seed the cache from the committed docs/fedfsl/*.json (re-run what is not cached)")
    parser.add_argument("--rounds", type=int, default=50, help="headline: rounds")
    parser.add_argument("--local-steps", type=int, default=4, help="headline: local steps per round")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra override for every run (repeatable), e.g. for a quick check")
    args = parser.parse_args(argv)
    EXTRA.extend(args.set)
    USE_COMMITTED[0] = not args.fresh
    start = time.perf_counter()
    torch.set_num_threads(1)
    if args.what == "toy":
        toy()
    elif args.what == "toy-control":
        toy_control()
    elif args.what == "ceiling":
        ceiling()
    elif args.what == "devices":
        devices()
    elif args.what == "headline":
        headline(args.rounds, args.local_steps)
    fill_page()
    print(f"done in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # The committed configs name no data folder: read $FEDFEW_DATA, else the repository's sibling
    # ../shared/data where these results were produced.
    os.environ.setdefault("FEDFEW_DATA", str(REPO.parent / "shared" / "data"))
    sys.exit(main())
