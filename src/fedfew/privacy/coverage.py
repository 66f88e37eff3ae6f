"""Which algorithms differential privacy covers, what each one uploads, and why the others refuse.

An algorithm says what its upload is with the capability :attr:`fedfew.engine.Algorithm.dp_upload`
(a property where it depends on the options): ``"model-delta"`` when ``upload["model"]`` is a model the
server averages into ``server["model"]`` and nothing else of the round leaves the clients. For these
DP-FedAvg clips the change (upload - the round's global model) and the server replaces the average by
the noised one. Two more kinds clip the shared model of an algorithm that also keeps private models
on the clients: ``"server-model-delta"`` (F2L: ``upload["server"]``, the shared server-model phi, into
``server["server"]``) and ``"meme-model-delta"`` (FML: its meme model, ``upload["model"]``); the guarantee
covers that shared model alone, and the scores of the private models these algorithms report are named
outside it. ``"shared-model-delta"`` is the same for any algorithm, a plugin's among them, whose
``upload["model"]`` is the shared model averaged into ``server["model"]`` beside private models that never
leave the clients (FedProto's global prototypes in docs/writing-an-algorithm.md). ``None`` (the default,
so a plugin is refused until it says what it uploads): private rounds are refused with the reason below,
never run with part of the upload unprotected.
"""

from __future__ import annotations

from fedfew.core.errors import ConfigError
from fedfew.core.jsontypes import JSONObject
from fedfew.interface.algorithm import Algorithm

__all__ = ["COVERED_UPLOADS", "NESTED", "PRIVATE_SCORES_OUTSIDE", "REPRODUCIBLE_NOISE", "SHARED_ONLY",
           "UPLOAD_KEYS", "PrivacyConfigError", "check_algorithm", "covers", "refused_because", "short_covers",
           "upload_key",
           "what_is_covered"]

#: The upload kinds :mod:`fedfew.privacy` can clip, with what is clipped (and, for an algorithm with
#: private models, what the guarantee leaves out).
COVERED_UPLOADS = {
    "model-delta": "each client's model update (its upload minus the round's global model)",
    "server-model-delta": (
        "each client's update of F2L's shared server-model phi (its upload minus the round's phi); only the "
        "server-model is covered: the private client-models never leave the clients, and the scores of them that "
        "test_client_model: each reports are outside the guarantee"),
    "frl-prototypes": (
        "each FRL participant's upload in every release of an episode, its model update in each of the R inner "
        "rounds and the meta-update with, in the inner rounds, its prototypes of the classes it holds, as one vector "
        "(our extension, not the FRL paper's: the global prototypes are a noised per-class sum over all preparation "
        "classes divided by the clients per round, never weighted by the clients' class counts, and all R + 1 "
        "releases of an episode are accounted; the deployment groups' R rounds run by the server on held-out clients "
        "only post-process phi for the preparation clients, and the held-out clients' own data is not protected)"),
    "meme-model-delta": (
        "each client's update of FML's meme model (its meme minus the round's global model); only the meme (global) "
        "model is covered: the private local models never leave the clients, and their accuracies on the clients' "
        "own validation sets (and a newcomer's curves) are reported outside the guarantee"),
    "shared-model-delta": (
        "each client's change of the shared model (its upload['model'] minus the round's server['model']) of an "
        "algorithm that also keeps private models on the clients; only the shared model is covered: the private "
        "models never leave the clients, and the scores of them the algorithm reports are outside the guarantee"),
}

#: The upload key and the server state key each kind's model lives under.
UPLOAD_KEYS = {"model-delta": "model", "server-model-delta": "server", "meme-model-delta": "model",
               "frl-prototypes": "model", "shared-model-delta": "model"}

#: Kinds whose algorithm plays its own (nested) rounds and runs each of them through DP itself (FRL's
#: episode: R inner rounds and the meta-update, :meth:`fedfew.algorithms.frl.FRL.play_round`).
NESTED = frozenset({"frl-prototypes"})

#: Kinds whose algorithm scores the clients' private models (``evaluates_clients``): allowed, the scores
#: named outside the guarantee in :data:`COVERED_UPLOADS`.
PRIVATE_SCORES_OUTSIDE = frozenset({"server-model-delta", "meme-model-delta", "shared-model-delta"})


class PrivacyConfigError(ConfigError):
    """Privacy asked of an algorithm or engine that cannot honour it (exit 2)."""


def check_algorithm(algorithm: Algorithm) -> str:
    """The algorithm's upload kind when DP covers it; otherwise :class:`PrivacyConfigError` naming the
    algorithm and why."""
    name = algorithm.name
    kind = algorithm.dp_upload
    if kind is None:
        raise PrivacyConfigError(f"privacy: algorithm {name} cannot run with differential privacy: "
                                 f"{refused_because(type(algorithm))}")
    if kind not in COVERED_UPLOADS:
        raise PrivacyConfigError(f"privacy: algorithm {name} declares dp_upload={kind!r}; fedfew clips only "
                                 f"{', '.join(COVERED_UPLOADS)}")
    if type(algorithm).play_round is not Algorithm.play_round and kind not in NESTED:
        raise PrivacyConfigError(f"privacy: algorithm {name} plays its own rounds (play_round): DP-FedAvg covers "
                                 "rounds of one broadcast, update and average")
    if algorithm.evaluates_clients and kind not in PRIVATE_SCORES_OUTSIDE:
        raise PrivacyConfigError(f"privacy: algorithm {name} reports scores of the clients' own models on their own "
                                 "data, which the guarantee does not cover")
    return kind


def refused_because(kind: type[Algorithm]) -> str:
    """Why differential privacy refuses the algorithm class ``kind`` (or, for one covered with some options
    only, the options it refuses): what the class itself declares (:attr:`~fedfew.interface.algorithm.
    Algorithm.dp_refused`), else that it does not say what its upload is."""
    return vars(kind).get("dp_refused") or (f"{kind.name or kind.__name__} does not say what its upload is (set "
                                            "dp_upload on the class when upload['model'] is a model the server "
                                            "averages)")


def upload_key(kind: str) -> str:
    """The key of the clipped model in an upload, the payload and the server state (``"model"``; F2L's
    shared server-model is ``"server"``)."""
    return UPLOAD_KEYS[kind]


def what_is_covered(mechanism: str, kind: str) -> str:
    """One sentence for the summary: what the guarantee protects, and against whom."""
    against = ("anyone who sees the global models (the server is trusted with the clipped updates)"
               if mechanism == "central-dp" else "the server and anyone who sees what the clients upload")
    return (f"client-level: {COVERED_UPLOADS[kind]} is clipped; every round's global model is protected against "
            f"{against}; not covered: which clients took part (the server knows it), timing, the clients' training metrics and "
            "private states")


#: What every report of a research-mode run says beside its epsilon.
REPRODUCIBLE_NOISE = "reproducible noise: not private against anyone who holds the seed"
#: What a run scored on clients' private models says beside its epsilon.
SHARED_ONLY = "epsilon covers the shared model only"


def covers(mechanism: str, kind: str, accounting: str, noise: str, evaluates_clients: bool,
           client_metrics: bool) -> JSONObject:
    """The summary's ``covers``: which model(s) the guarantee protects, whether the reported score comes
    from covered models, what the accounting assumes, the noise mode, and one line for tables
    (``short``)."""
    shared = kind in PRIVATE_SCORES_OUTSIDE or evaluates_clients
    models = ("the shared model only (every round's global model); the clients' private models are not covered"
              if shared else "every round's global model")
    notes = []
    if evaluates_clients:
        notes.append(SHARED_ONLY)
    notes.append({"poisson": "Poisson sample kept secret by the server", "none": "no amplification",
                  "without_replacement": "secret fixed-size sample"}[accounting])
    if noise == "seeded":
        notes.append(REPRODUCIBLE_NOISE)
    if client_metrics:
        notes.append("training metrics sent outside it")
    return {
        "models": models,
        "score_covered": not evaluates_clients,
        "score": ("the reported score is computed by the clients' private, un-noised models: outside the guarantee "
                  "(the last round is reported: no round is selected on those scores)"
                  if evaluates_clients else "the reported score is computed by the covered (global) model"),
        "accounting": accounting,
        "noise": noise,
        "client_metrics": ("the clients' training metrics were sent to the server and are not covered"
                           if client_metrics else "the clients' training metrics stayed on the clients"),
        "what": what_is_covered(mechanism, kind),
        "short": "; ".join(notes),
    }


def short_covers(privacy: object) -> str:
    """The one-line qualifier of a summary's ``privacy`` section ("" for a summary written before
    ``covers`` had it)."""
    if not isinstance(privacy, dict):
        return ""
    cov = privacy.get("covers")
    return str(cov.get("short", "")) if isinstance(cov, dict) else ""
