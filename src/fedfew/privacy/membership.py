"""Membership inference against the released model: the loss-threshold attack (Yeom et al. 2018,
"Privacy Risk in Machine Learning: Analyzing the Connection to Overfitting", Algorithm 1/adversary A_L).

The attacker sees an example and the model's loss on it and guesses "member" when the loss is low.
Its **advantage** is how much better than a coin it separates members from non-members.

* **Members**: the training clients' examples.
* **Non-members**: held-out examples of the *same training classes*, which no client ever holds: with
  the attack on, ``examples`` examples of the training pool are drawn (a generator of their own) and
  kept from the partition, so the run trains on that many fewer examples than it would without it.

A few-shot model's loss needs an episode (labels are positions within an episode, and MAML adapts on
its support set). Both kinds are scored in the same episodes: N-way K-shot episodes of the run's shape
over the training classes, whose support is K member examples per class and whose queries are pairs,
one held-out example and one member example of the same class; each query's loss is the cross-entropy
of the algorithm's own prediction (prototypes, or the MAML adaptation at test time). Member and
non-member of a pair share class, support and episode, so they differ only in whether a client trained
on them. (Non-members from unseen classes would also measure the gap between seen and novel classes:
an untrained network already tells the digits' base classes from its novel ones.)

Two advantages, each with a 95% percentile bootstrap interval over examples (members and non-members
resampled apart, from a generator of its own):

* ``advantage``: the AUC-based advantage 2 AUC - 1 (AUC: the chance a random member's loss is below a
  random non-member's, ties half; the Mann-Whitney statistic). About 0 for a model that learned nothing
  of its members, and unbiased there: this is the headline number.
* ``best_threshold_advantage``: max over thresholds t of TPR(t) - FPR(t), guessing "member" when the
  loss is at most t (Yeom's attack with the best threshold, chosen on the same examples). Never below 0
  and biased upward on finite samples: it is the one-sided two-sample Kolmogorov-Smirnov statistic D+,
  whose null (a model that learned nothing, n examples a side; P(D+ > x sqrt(2 / n)) -> exp(-2 x^2)) has
  mean about sqrt(pi / 8) sqrt(2 / n) = 0.63 sqrt(2 / n) and 95th percentile about
  sqrt(ln(20) / 2) sqrt(2 / n) = 1.22 sqrt(2 / n) (0.040 and 0.077 at n = 500), so it is reported beside
  the headline, not as it. (The AUC advantage's null has mean 0 and standard deviation
  2 sqrt((2n + 1) / (12 n^2)), about 0.037 at n = 500.)

Beside them (issue 51), what a real attacker could do, who must fix the threshold before scoring:

* ``split_threshold_advantage``: the pairs split in two halves at random (a generator of its own); the
  best threshold of the first half, scored as TPR - FPR on the second (no selection bias: about 0 for a
  model that learned nothing, and it can be negative);
* ``tpr_at_fpr``: the TPR at FPR 1% and 0.1% (the threshold at that quantile of the non-members'
  losses; Carlini et al. 2022's low-FPR reading), on all the examples.

**Members are the rows the released model trained on**: the support and query rows of the episodes of
every update aggregated up to the selected round (the clients return them with the run's
``eval.membership_inference`` on: ``ClientResult.rows_used``; :func:`member_pool`). At small budgets
many rows a client holds are never drawn, and counting them as members would dilute any leakage. Where
no rows were recorded up to the selected round (the initial model was selected, or the rounds ran under
SecAgg+, whose clients send the server nothing but the masked vector), the members are every row the
training clients hold, and the summary's ``member_pool`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedfew.core import stats
from fedfew.core.errors import ConfigError
from fedfew.core.seeding import numpy_generator
from fedfew.data import LabelledDataset
from fedfew.fewshot.episodes import Episode
from fedfew.interface.algorithm import Algorithm, Parts
from fedfew.interface.state import load_state_

#: How the numbers are computed, written into the summary beside them.
METHOD = ("loss threshold (Yeom et al. 2018); advantage = 2 AUC - 1; best_threshold_advantage = max TPR - FPR; "
          "95% percentile bootstrap over examples")
#: What the numbers added in issue 51 are (the summary's ``membership.held_out_method``).
HELD_OUT_METHOD = ("split_threshold_advantage: threshold chosen on a random half of the pairs, TPR - FPR on the "
                   "other half; tpr_at_fpr: TPR at the non-members' 1% and 0.1% loss quantiles")
#: The false-positive rates ``tpr_at_fpr`` reads.
LOW_FPRS = (0.01, 0.001)


def auc_advantage(member_losses: np.ndarray, non_member_losses: np.ndarray) -> float:
    """2 AUC - 1, AUC = P(member loss < non-member loss) + P(equal) / 2, by the rank-sum (Mann-Whitney)."""
    from scipy.stats import rankdata  # here, not at import: scipy.stats costs every run ~0.3 s to import

    m, n = len(member_losses), len(non_member_losses)
    ranks = rankdata(np.concatenate([member_losses, non_member_losses]))  # ascending loss, ties averaged
    # The non-members' rank sum counts, for each non-member, the members below it (ties half) plus itself.
    auc = (float(ranks[m:].sum()) - n * (n + 1) / 2) / (m * n)
    return 2 * auc - 1


def best_threshold_advantage(member_losses: np.ndarray, non_member_losses: np.ndarray) -> tuple[float, float]:
    """(max over t of TPR(t) - FPR(t), the smallest t reaching it), guessing "member" when loss <= t.
    The empty guess (t below every loss: 0 - 0) is a candidate, so the advantage is never below 0."""
    members, others = np.sort(member_losses), np.sort(non_member_losses)
    thresholds = np.unique(np.concatenate([members, others]))
    tpr = np.searchsorted(members, thresholds, side="right") / len(members)
    fpr = np.searchsorted(others, thresholds, side="right") / len(others)
    gaps = tpr - fpr
    best = int(np.argmax(gaps))
    if gaps[best] <= 0:
        return 0.0, float("-inf")
    return float(gaps[best]), float(thresholds[best])


def bootstrap_intervals(member_losses: np.ndarray, non_member_losses: np.ndarray, rng: np.random.Generator,
                        draws: int) -> dict[str, tuple[float, float]]:
    """The 95% percentile bootstrap interval of both advantages: each draw resamples the members and the
    non-members apart, with replacement (:func:`fedfew.core.stats.percentile_interval`)."""
    m, n = len(member_losses), len(non_member_losses)
    replicates = np.empty((draws, 2))
    for b in range(draws):
        mb = member_losses[rng.integers(0, m, m)]
        nb = non_member_losses[rng.integers(0, n, n)]
        replicates[b] = auc_advantage(mb, nb), best_threshold_advantage(mb, nb)[0]
    low, high = stats.percentile_interval(replicates)
    return {"advantage": (float(low[0]), float(high[0])), "best_threshold_advantage": (float(low[1]), float(high[1]))}


@dataclass(frozen=True)
class AttackResult:
    """The attack's numbers (the summary's ``membership`` section)."""

    advantage: float
    ci95: tuple[float, float]
    best_threshold_advantage: float
    best_threshold_ci95: tuple[float, float]
    threshold: float
    members: int
    non_members: int
    member_loss: float
    non_member_loss: float

    def to_json(self) -> dict[str, Any]:
        return {"advantage": self.advantage, "ci95": list(self.ci95),
                "best_threshold_advantage": self.best_threshold_advantage,
                "best_threshold_ci95": list(self.best_threshold_ci95),
                "threshold": self.threshold if np.isfinite(self.threshold) else None,
                "members": self.members, "non_members": self.non_members,
                "member_loss_mean": self.member_loss, "non_member_loss_mean": self.non_member_loss,
                "method": METHOD}


def attack(member_losses: np.ndarray, non_member_losses: np.ndarray, rng: np.random.Generator,
           draws: int = 1000) -> AttackResult:
    """Both advantages of the loss-threshold attack on these losses, with their bootstrap intervals."""
    member_losses = np.asarray(member_losses, dtype=np.float64)
    non_member_losses = np.asarray(non_member_losses, dtype=np.float64)
    if len(member_losses) == 0 or len(non_member_losses) == 0:
        raise ValueError("membership inference needs members and non-members")
    best, threshold = best_threshold_advantage(member_losses, non_member_losses)
    intervals = bootstrap_intervals(member_losses, non_member_losses, rng, draws)
    return AttackResult(auc_advantage(member_losses, non_member_losses), intervals["advantage"], best,
                        intervals["best_threshold_advantage"], threshold, len(member_losses),
                        len(non_member_losses), float(member_losses.mean()), float(non_member_losses.mean()))


def split_threshold_advantage(member_losses: np.ndarray, non_member_losses: np.ndarray,
                              rng: np.random.Generator) -> float:
    """TPR - FPR on one random half of each side at the best threshold of the other half (the threshold
    chosen before it is scored, as a real attacker must). 0 when a half is empty."""
    members, others = rng.permutation(member_losses), rng.permutation(non_member_losses)
    mh, nh = len(members) // 2, len(others) // 2
    if min(mh, nh, len(members) - mh, len(others) - nh) == 0:
        return 0.0
    best, threshold = best_threshold_advantage(members[:mh], others[:nh])
    if best <= 0:  # the first half's best guess is "nobody is a member": 0 - 0 on the other half
        return 0.0
    tpr = float(np.mean(members[mh:] <= threshold))
    fpr = float(np.mean(others[nh:] <= threshold))
    return tpr - fpr


def tpr_at_fpr(member_losses: np.ndarray, non_member_losses: np.ndarray,
               rates: tuple[float, ...] = LOW_FPRS) -> dict[str, float]:
    """{"0.01": TPR, ...}: the members' share at or below the largest threshold whose FPR is at most
    each rate (none when no threshold reaches it: TPR 0)."""
    others = np.sort(non_member_losses)
    out = {}
    for rate in rates:
        allowed = int(np.floor(rate * len(others)))  # non-members a threshold may let through
        threshold = others[allowed - 1] if allowed > 0 else -np.inf
        if allowed > 0 and allowed < len(others) and others[allowed] == threshold:  # ties: stay within the rate
            threshold = np.nextafter(threshold, -np.inf)
        out[f"{rate:g}"] = float(np.mean(member_losses <= threshold)) if np.isfinite(threshold) else 0.0
    return out


# -- held-out examples: the non-members ----------------------------------------------------------------
def hold_out(labels: torch.Tensor, examples: int, seed: int) -> np.ndarray:
    """Positions (into ``labels``, the training pool's) of ``examples`` examples drawn, without
    replacement, from a generator of their own, to be kept from every client: the attack's non-members.
    Refuses more than a quarter of the pool (the clients would lose too much of their data)."""
    if examples > len(labels) // 4:
        raise ConfigError(f"eval.membership_inference.examples: {examples} held-out examples is more than a quarter "
                          f"of the {len(labels)} training examples; lower it")
    rng = numpy_generator(seed, "membership", "holdout")
    return np.sort(rng.choice(len(labels), size=examples, replace=False))


# -- paired episodes: members and non-members scored the same way ---------------------------------------
@dataclass
class PairedEpisode:
    """An episode whose queries are pairs (a member and a held-out non-member of the same class)."""

    episode: Episode
    is_member: torch.Tensor  # bool [queries]


def paired_episodes(dataset: LabelledDataset, member_rows: np.ndarray, other_rows: np.ndarray, n_way: int,
                    k_shot: int, rng: np.random.Generator) -> list[PairedEpisode]:
    """Episodes of the run's N-way K-shot shape over the training classes: each held-out example
    (``other_rows``) is a query beside a member query of its class, both classified against the same K
    member support examples per class, so the two differ only in whether a client trained on them.
    Up to N pairs an episode (distinct classes), the episode's other classes filled from the training
    classes; a held-out example whose class has fewer than K + 1 members is left out."""
    labels = dataset.labels.cpu().numpy()
    by_class: dict[int, list[int]] = {}
    for row in np.sort(member_rows):
        by_class.setdefault(int(labels[row]), []).append(int(row))
    usable = sorted(c for c, rows in by_class.items() if len(rows) >= k_shot + 1)
    if len(usable) < n_way:
        raise ConfigError(f"eval.membership_inference: {len(usable)} training classes have {k_shot + 1} member "
                          f"examples, fewer than the {n_way} an episode needs")
    pending = [int(r) for r in rng.permutation(other_rows) if int(labels[r]) in set(usable)]
    out = []
    while pending:
        chosen: dict[int, int] = {}  # class -> its held-out row, in the episode's class order
        rest = []
        for row in pending:
            c = int(labels[row])
            if c in chosen or len(chosen) == n_way:
                rest.append(row)
            else:
                chosen[c] = row
        pending = rest
        others = [c for c in usable if c not in chosen]
        classes = [*chosen, *(int(c) for c in rng.choice(others, n_way - len(chosen), replace=False))]
        support: list[int] = []
        query: list[int] = []
        query_labels: list[int] = []
        member: list[bool] = []
        for label, c in enumerate(classes):
            picks = rng.choice(by_class[c], k_shot + (c in chosen), replace=False)
            support.extend(int(p) for p in picks[:k_shot])  # class-major, K each: the samplers' layout
            if c in chosen:
                query += [int(picks[k_shot]), chosen[c]]
                query_labels += [label, label]
                member += [True, False]
        out.append(PairedEpisode(_episode(dataset, classes, support, query, query_labels), torch.tensor(member)))
    return out


def _episode(dataset: LabelledDataset, classes: list[int], support: list[int], query: list[int],
             query_labels: list[int]) -> Episode:
    device = dataset.labels.device
    s, q = torch.tensor(support, device=device), torch.tensor(query, device=device)
    k = len(support) // len(classes)
    lengths = dataset.lengths
    return Episode(support=dataset.inputs[s], support_labels=torch.arange(len(classes), device=device).repeat_interleave(k),
                   query=dataset.inputs[q], query_labels=torch.tensor(query_labels, device=device),
                   classes=torch.tensor(classes, device=device), support_index=s, query_index=q,
                   support_lengths=None if lengths is None else lengths[s],
                   query_lengths=None if lengths is None else lengths[q])


# -- the released model's losses ------------------------------------------------------------------------
def can_attack(algorithm: Algorithm) -> bool:
    """Whether ``algorithm`` releases one server model scored by an episodic learner (``model`` and
    ``learner``, as the episodic FedAvg family: FL-Proto, FL-MAML, the FedFSL variants)."""
    return algorithm.predicts_episodes and hasattr(algorithm, "learner") and hasattr(algorithm, "model")


def check(algorithm: Algorithm, task: str) -> None:
    """Refuses, in one line naming the key, a run the attack cannot score (before any round runs)."""
    if task != "fewshot" or not can_attack(algorithm):
        raise ConfigError(f"eval.membership_inference: {algorithm.name} on a {task} task has no per-example "
                          "query loss of one released model (it needs few-shot episodes scored on the server's "
                          "model, e.g. fl-proto, fl-maml, fedfsl-*); leave eval.membership_inference out")


def query_losses(algorithm: Any, server: Parts, episodes: list[PairedEpisode]) -> tuple[np.ndarray, np.ndarray]:
    """(members' losses, non-members' losses): each query example's cross-entropy under the algorithm's
    own prediction for its episode (the logits its score takes the argmax of), from the server's model."""
    model = load_state_(algorithm.model, server["model"])
    was_training = model.training
    model.eval()
    members, others = [], []
    for paired in episodes:
        ep = paired.episode
        # In float64: a float32 cross-entropy rounds a confident prediction's loss to exactly 0, and ties
        # between members and non-members would hide the ordering the attack reads.
        logits = algorithm.learner.predict(model, ep).detach().double()
        loss = F.cross_entropy(logits, ep.query_labels, reduction="none")
        mask = paired.is_member.to(loss.device)
        members.append(loss[mask])
        others.append(loss[~mask])
    model.train(was_training)
    return torch.cat(members).double().cpu().numpy(), torch.cat(others).double().cpu().numpy()


#: The summary's ``membership.member_pool``: what the members are.
POOL_EPISODES = "rows the training episodes used, up to the selected round"
POOL_HELD = "every row the training clients hold"


def member_pool(rows_used: list[int] | None, selected_round: int,
                held: torch.Tensor | None) -> tuple[torch.Tensor | None, str]:
    """(member rows, what they are): the rows the selected round's model trained on (``rows_used``, as
    recorded by the run), or every row the clients hold, with why, where none were recorded."""
    if rows_used:
        return torch.tensor(rows_used, dtype=torch.long), POOL_EPISODES
    if selected_round == 0:
        why = "the initial model was selected: it trained on no row"
    elif rows_used is None:
        why = "the rows the episodes used were not recorded (a run resumed from an older checkpoint)"
    else:
        why = "no update returned the rows its episodes used (under secure aggregation the clients send none)"
    return held, f"{POOL_HELD} ({why})"


def membership_inference(algorithm: Algorithm, server: Parts, dataset: LabelledDataset,
                         member_rows: torch.Tensor | None, held_rows: torch.Tensor | None, n_way: int, k_shot: int,
                         draws: int, seed: int) -> dict[str, Any]:
    """The attack on ``server``'s model: ``held_rows`` (rows of ``dataset`` no client holds) against as
    many of ``member_rows`` (the rows the model trained on: :func:`member_pool`), in paired episodes; the
    summary's ``membership`` section. Runs under a forked global random state: nothing drawn after it
    moves. Where the members cannot be paired with any held-out example (too few of their classes in the
    rows a short run used), the section says so (``scored: false`` and why) and holds no number."""
    if member_rows is None or held_rows is None:
        raise ConfigError("eval.membership_inference: the run kept no held-out examples to attack with")
    rng = numpy_generator(seed, "membership", "episodes")
    try:
        episodes = paired_episodes(dataset, member_rows.cpu().numpy(), held_rows.cpu().numpy(), n_way, k_shot, rng)
    except ConfigError as err:  # after the rounds, a short run's few member rows: not a config error
        return {"scored": False, "why": str(err).removeprefix("eval.membership_inference: "), "method": METHOD}
    if not episodes:
        return {"scored": False, "why": f"no held-out example's class has {k_shot + 1} member rows to pair it "
                                        "with", "method": METHOD}
    with torch.random.fork_rng(devices=[]):
        member_losses, other_losses = query_losses(algorithm, server, episodes)
    result = attack(member_losses, other_losses, numpy_generator(seed, "membership", "bootstrap"), draws)
    # Added in issue 51, each from a generator of its own, so the numbers above are those of before.
    split = split_threshold_advantage(member_losses, other_losses, numpy_generator(seed, "membership", "split"))
    return {**result.to_json(), "split_threshold_advantage": split,
            "tpr_at_fpr": tpr_at_fpr(member_losses, other_losses), "held_out_method": HELD_OUT_METHOD}
