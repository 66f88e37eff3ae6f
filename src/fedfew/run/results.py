"""What a finished run reports: its summary, a markdown table and an accuracy-versus-round plot
(the run folder itself is :mod:`fedfew.run.folder`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Required, TypedDict, cast

from fedfew.config.validation import ExperimentConfig
from fedfew.core.jsontypes import JSONObject


class AgainstInitial(TypedDict, total=False):
    """The initial model's score and the trained models' against it (:func:`against_initial`)."""

    initial_score: JSONObject
    selected_score: float
    final_score: float
    below_initial: bool


class Participation(TypedDict, total=False):
    """Who trained (:func:`participation`)."""

    rounds_trained: dict[str, int]
    clients_never_trained: list[int]
    personalised: dict[str, int]
    participation_secret: bool


class RunSummary(AgainstInitial, Participation, total=False):
    """A finished run's summary: what summary.json holds (built by :func:`summarise`, in this key
    order), and what :func:`fedfew.run.runner.run_experiment` and ``resume_run`` return, which adds
    ``history``, ``folder`` and ``label``. Every value is JSON."""

    name: Required[str]
    algorithm: Required[str]
    dataset: Required[str]
    task: Required[str]
    seed: Required[int]
    rounds: Required[int]
    selected_round: Required[int]
    test: Required[dict[str, Any]]
    bytes_down: Required[int]
    bytes_up: Required[int]
    seconds: Required[float]
    chance: Required[float | None]
    at_chance: Required[bool]
    rounds_without_training: Required[int]
    #: "untrained": a run of 0 rounds, a control by design.
    control: str
    #: A private run's guarantee (config ``privacy``).
    privacy: JSONObject
    #: The loading of the data set, with any text encoding.
    data_seconds: float
    #: Which precision ran and why, where fp32 was not asked for.
    precision: JSONObject
    #: A resumed run: the seconds of the sittings before its last (``seconds`` counts each once).
    seconds_resumed_from: float
    #: The membership-inference attack on the selected model (``eval.membership_inference``).
    membership: JSONObject
    #: False where ``eval.initial: auto`` left round 0 unscored.
    initial_scored: bool
    #: {written_by, resumed_by}: resumed with another version (--allow-other-version).
    other_version: JSONObject
    #: Not in summary.json: every round's metrics, the run folder, the run's label.
    history: list[dict[str, Any]]
    folder: str
    label: str


def as_json(summary: RunSummary) -> JSONObject:
    """The summary as the JSON object it is (for what reads summaries without their schema)."""
    return cast(JSONObject, summary)


def chance_level(config: ExperimentConfig, context: object = None) -> float | None:
    """Accuracy of guessing: 1/N for N-way tasks, 1/classes for classification."""
    if config.task == "fewshot":
        return 1.0 / config.episodes.n_way
    classes = getattr(context, "num_classes", None)
    return 1.0 / classes if classes else None


def at_chance(test: dict[str, float], chance: float | None) -> bool:
    """True when the test accuracy is not distinguishable from guessing (within its 95% CI, or
    within one point where no CI is reported)."""
    if chance is None or "accuracy" not in test:
        return False
    margin = max(test.get("ci95", 0.0), 0.01)
    return test["accuracy"] - margin <= chance


def summarise(config: ExperimentConfig, outcome: dict[str, Any], seconds: float, context: object = None, *,
              data_seconds: float, participants: Participation, precision: JSONObject | None = None,
              seconds_resumed_from: float | None = None, membership: JSONObject | None = None,
              other_version: JSONObject | None = None) -> RunSummary:
    """The summary of a finished run (summary.json), built here only: ``outcome`` of
    :meth:`~fedfew.engine.simulator.Simulator.run`, ``seconds`` of training and evaluation in all its
    sittings, ``data_seconds`` of loading the data, who trained (:func:`participation`); the precision
    that ran where fp32 was not asked for, the seconds before the last sitting (a resumed run), the
    membership attack (opt-in) and the two versions of a run resumed with another one, where given."""
    comm = outcome["comm"]
    chance = chance_level(config, context)
    summary: RunSummary = {
        "name": config.name,
        "algorithm": config.algorithm.name,
        "dataset": config.dataset.name,
        "task": config.task,
        "seed": config.seed,
        "rounds": config.federation.rounds,
        "selected_round": outcome["selected_round"],
        "test": outcome["test"],
        "bytes_down": sum(comm.down),
        "bytes_up": sum(comm.up),
        "seconds": round(seconds, 2),
        "chance": chance,
        "at_chance": at_chance(outcome["test"], chance),
        "rounds_without_training": sum(1 for h in outcome["history"] if h.get("no_training")),
    }
    if config.federation.rounds == 0:  # a control by design, not a run in which nothing trained
        summary["control"] = "untrained"
    if outcome.get("privacy"):
        summary["privacy"] = outcome["privacy"]
    summary.update(against_initial(outcome))
    summary["data_seconds"] = round(data_seconds, 2)
    if precision is not None:
        summary["precision"] = precision
    if seconds_resumed_from is not None:  # also tells fedfew.study.run_readback.run_seconds that these
        summary["seconds_resumed_from"] = round(seconds_resumed_from, 2)  # seconds count each sitting once
    if membership is not None:
        summary["membership"] = membership
    if outcome.get("initial") is None and config.eval.initial != "always":
        summary["initial_scored"] = False  # eval.initial: auto left round 0 unscored (no selection reads it)
    if other_version:
        summary["other_version"] = other_version
    summary.update(participants)
    return summary


def privacy_budget(summary: Mapping[str, Any]) -> str | None:
    """"ε = 3.21, δ = 1e-05" for a private run's summary, with what it covers where that qualifies it
    (its accounting, "epsilon covers the shared model only", "reproducible noise: ..."); None for a
    run without privacy."""
    from fedfew.privacy.coverage import short_covers

    p = summary.get("privacy")
    if not p:
        return None
    short = short_covers(p)
    warning = f"; {p['warning']}" if p.get("warning") else ""
    return f"ε = {p['epsilon']:.2f}, δ = {p['delta']:g}" + (f"; {short}" if short else "") + warning


def privacy_line(summary: Mapping[str, Any]) -> str | None:
    """One sentence on a private run's guarantee (results.md); None for a run without privacy."""
    budget = privacy_budget(summary)
    if budget is None:
        return None
    p = summary["privacy"]
    z = "none (no round ran)" if p["noise_multiplier"] is None else f"{p['noise_multiplier']:.4g}"
    if "target_epsilon" in p and p["noise_multiplier"] is not None:
        z += f", solved for target ε = {p['target_epsilon']:g}"
    clip = f"{p['clip']:g}"
    if "adaptive_clip" in p:
        clip += (f" at first, adaptive toward the {p['adaptive_clip']['target_quantile']:g} quantile of the update "
                 f"norms (last {p['adaptive_clip']['final_clip']:.4g})")
    from fedfew.privacy.coverage import REPRODUCIBLE_NOISE

    cov = p["covers"]
    if isinstance(cov, dict):  # what it covers, the score, who took part, the noise (summaries since `covers`)
        extra = f" Without amplification by sampling: ε = {p['epsilon_no_amplification']:.2f}." \
            if "epsilon_no_amplification" in p else ""
        kept = " The clients' private states were saved (privacy.keep_private_states)." \
            if p.get("keep_private_states") else ""
        return (f"Privacy: {p['mechanism']}, client-level ({budget}) after {p['rounds']} rounds; clip {clip}, noise "
                f"multiplier {z}, sampling rate {p['sampling_rate']:g}; {p['accountant']}; neighbouring runs: "
                f"{p['adjacency']}. Accounting: {p['accounting']} ({p['participation']}).{extra} Covers: "
                f"{cov['models']}; {cov['score']}; {cov['client_metrics']}; noise: {p['noise']}"
                f"{' (' + REPRODUCIBLE_NOISE + ')' if p['noise'] == 'seeded' else ' (OS randomness)'}. "
                f"{cov['what']}.{kept}")
    return (f"Privacy: {p['mechanism']}, client-level ({budget}) after {p['rounds']} rounds; clip {clip}, noise "
            f"multiplier {z}, sampling rate {p['sampling_rate']:g}; {p['accountant']}; neighbouring runs: "
            f"{p['adjacency']}. Covers: {cov}.")


def participation(history: list[dict[str, Any]], client_ids: list[int],
                  personal_states: Mapping[int, object] | None = None) -> Participation:
    """Who trained: ``rounds_trained`` (client id -> rounds in which it trained), the clients that never
    did, and for personalised scores (``personal_states``: the private models scored, None for none)
    how many of the models averaged were ever trained."""
    if any(isinstance(r.get("clients", {}).get("trained"), int) for r in history):
        # A private run's secret sample: the history holds counts only, and so does the summary.
        return {"participation_secret": True}
    counts = {cid: 0 for cid in client_ids}
    for record in history:
        for cid in record.get("clients", {}).get("trained", []):
            counts[cid] = counts.get(cid, 0) + 1
    result: Participation = {"rounds_trained": {str(c): n for c, n in sorted(counts.items())},
                             "clients_never_trained": [c for c, n in sorted(counts.items()) if n == 0]}
    if personal_states is not None:
        scored = [c for c in client_ids if _has_state(personal_states, c)]
        result["personalised"] = {"models": len(scored), "trained": sum(1 for c in scored if counts[c] > 0)}
    return result


def _has_state(states: Mapping[int, object], cid: int) -> bool:
    try:
        return states.get(cid) is not None
    except Exception:  # states held elsewhere (Flower nodes): every client has its model there
        return True


def against_initial(outcome: dict[str, Any]) -> AgainstInitial:
    """The initial (round-0) model's score and whether the selected or the final model scores below
    it on the same split (validation, or test without one): training that made things worse."""
    initial = outcome.get("initial")
    if not initial or "accuracy" not in initial:
        return {}
    report: AgainstInitial = {"initial_score": {k: v for k, v in initial.items()}}
    scores: dict[str, float] = {k: outcome[k] for k in ("selected_score", "final_score") if k in outcome}
    if scores:
        if "selected_score" in scores:
            report["selected_score"] = scores["selected_score"]
        if "final_score" in scores:
            report["final_score"] = scores["final_score"]
        report["below_initial"] = min(scores.values()) < initial["accuracy"]
    return report


def _decimals_apart(a: float, b: float, most: int = 6) -> int:
    """The fewest decimals (2 or more) at which the percentages ``100 a`` and ``100 b`` print differently."""
    for decimals in range(2, most + 1):
        if f"{100 * a:.{decimals}f}" != f"{100 * b:.{decimals}f}":
            return decimals
    return most


def below_initial_message(summary: Mapping[str, Any]) -> str:
    """One line saying which model scored below the untrained one, on which split, by how much."""
    initial = summary["initial_score"]
    split = "validation" if initial["split"] == "val" else "test"
    # Without validation the reported model is the last round's: selected and final are one model.
    candidates = ("selected", "final") if initial["split"] == "val" else ("final",)
    below = [which for which in candidates if summary.get(f"{which}_score", 1.0) < initial["accuracy"]]
    # As many decimals as it takes to show the two apart (49.167% below 49.170%, never 49.17% below 49.17%).
    decimals = max((_decimals_apart(summary[f"{which}_score"], initial["accuracy"]) for which in below), default=2)
    worse = [f"the {which} model ({'round ' + str(summary['selected_round']) if which == 'selected' else 'last round'}) "
             f"{100 * summary[f'{which}_score']:.{decimals}f}%" for which in below]
    text = (f"{summary['name']}: {' and '.join(worse)} scored below the untrained initial model "
            f"({100 * initial['accuracy']:.{decimals}f}%) on {split}")
    if initial["split"] == "val" and summary["selected_round"] == 0:
        text += "; round 0 (the untrained model) is the selected one"
    return text


def format_accuracy(test: dict[str, float]) -> str:
    """"63.40 ± 1.03" (a symmetric interval) or "91.20 [90.41, 91.92]" (Wilson's, asymmetric)."""
    if "accuracy" not in test:
        return "n/a"
    text = f"{100 * test['accuracy']:.2f}"
    if "ci_low" in test and "ci_high" in test:
        text += f" [{100 * test['ci_low']:.2f}, {100 * test['ci_high']:.2f}]"
    elif "ci95" in test:
        text += f" ± {100 * test['ci95']:.2f}"
    return text


def markdown_table(summaries: Sequence[Mapping[str, Any]], label_key: str = "name") -> str:
    """One row per run; the interval column says how each accuracy's 95% interval was computed
    (normal over the fixed test episodes, 1.96 std / sqrt(T); Wilson's over labelled test samples).
    "seconds" is the run (training and evaluation); "data s" the loading of its data set, with any
    text encoding, which a batch or sweep pays once per data set. Where some run is private (config
    ``privacy``), a last column gives each run's (ε, δ), or "not private"."""
    lines = [
        f"| {label_key} | algorithm | test accuracy (%), 95% interval | interval over | selected round | "
        "MB sent (down+up) | seconds | data s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    private = any(s.get("privacy") for s in summaries)  # a column for (ε, δ) only where some run has it
    if private:
        lines[0] += " privacy (ε, δ) |"
        lines[1] += "---|"
    for s in summaries:
        mb = (s["bytes_down"] + s["bytes_up"]) / 1e6
        lines.append(
            f"| {s.get(label_key, s['name'])} | {s['algorithm']} | {format_accuracy(s['test'])} | "
            f"{s['test'].get('ci_method', '-')} | {s['selected_round']}/{s['rounds']} | {mb:.2f} | {s['seconds']:.1f} | "
            f"{s.get('data_seconds', 0.0):.1f} |" + (f" {privacy_budget(s) or 'not private'} |" if private else "")
        )
    return "\n".join(lines) + "\n"


def plot_curves(histories: dict[str, list[dict[str, float]]], path: Path, title: str = "") -> bool:
    """Accuracy versus round for each labelled history (validation accuracy where measured, else
    test). Returns False when no history holds an accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for label, history in histories.items():
        for key, style in (("val_accuracy", "-"), ("test_accuracy", "--")):
            points = [(h["round"], 100 * h[key]) for h in history if key in h]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, marker="o", markersize=3, label=f"{label} ({key.split('_')[0]})")
                drawn = True
    if drawn:
        ax.set_xlabel("round")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn
