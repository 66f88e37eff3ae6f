"""Which algorithms differential privacy covers, what each one uploads, and why the others refuse.

An algorithm says what its upload is with the capability :attr:`fedfew.engine.Algorithm.dp_upload`
(a property where it depends on the options): ``"model-delta"`` when ``upload["model"]`` is a model the
server averages into ``server["model"]`` and nothing else of the round leaves the clients. For these
DP-FedAvg clips the change (upload - the round's global model) and the server replaces the average by
the noised one. ``None`` (the default, so a plugin is refused until it says what it uploads): private
rounds are refused with the reason below, never run with part of the upload unprotected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedfew.errors import ConfigError

if TYPE_CHECKING:
    from fedfew.engine.algorithm import Algorithm

__all__ = ["COVERED_UPLOADS", "NOT_COVERED", "PrivacyConfigError", "check_algorithm", "what_is_covered"]

#: The upload kinds :mod:`fedfew.privacy` can clip, with what is clipped.
COVERED_UPLOADS = {
    "model-delta": "each client's model update (its upload minus the round's global model)",
}

#: Why each built-in algorithm that refuses DP does (what its upload is, and what would leak).
NOT_COVERED = {
    "f2l": ("F2L's private client-models never leave the clients, but its uploads are the shared server-model "
            "phi (and, in F2L\\M, the client-model) under its own aggregation, and its scores may come from the "
            "private client-models: not covered yet"),
    "fml": ("FML uploads its meme model, but the accuracy it reports comes from the private local models "
            "scored on the clients' own data, and its server counts rounds in its aggregation: not covered yet"),
    "frl": ("FRL's rounds nest R rounds of FL and a meta-update, and GPAL uploads prototypes (class means of "
            "a few examples): clipping and noising them is not implemented yet"),
    "frl-scratch": "frl-scratch trains nothing in its rounds (it learns only at deployment): nothing to protect",
    "local": "local's clients train alone and upload nothing; its score comes from their private models",
    "oneshot": ("oneshot uploads whole models once and the server keeps or ensembles individual models: "
                "DP-FedAvg's noised average does not apply"),
    "adfl": ("AdFL's one round uploads whole models and the server ranks and ensembles individual models: "
             "DP-FedAvg's noised average does not apply"),
    "fedfsl-mi": ("fedfsl-mi with reference: exclusive broadcasts w_{-k}, an average of the other clients' "
                  "un-noised uploads (reference: global is covered)"),
    "fedfsl-mi-adv": ("fedfsl-mi-adv with reference: exclusive broadcasts w_{-k}, an average of the other "
                      "clients' un-noised uploads (reference: global is covered)"),
    "fedavg": ("fedavg with score_uploads scores each client's own model on its private validation set and "
               "reports the scores (score_uploads: false is covered)"),
    "fedprox": ("fedprox with score_uploads scores each client's own model on its private validation set and "
                "reports the scores (score_uploads: false is covered)"),
    "frl-oneshot": ("frl-oneshot with stage: preparation keeps the best individual uploads by their "
                    "cross-validation scores (stage: deployment is covered)"),
}


class PrivacyConfigError(ConfigError):
    """Privacy asked of an algorithm or engine that cannot honour it (exit 2)."""


def check_algorithm(algorithm: Algorithm) -> str:
    """The algorithm's upload kind when DP covers it; otherwise :class:`PrivacyConfigError` naming the
    algorithm and why."""
    name = algorithm.name
    kind = algorithm.dp_upload
    if kind is None:
        reason = NOT_COVERED.get(name, f"{name} does not say what its upload is (set dp_upload on the class when "
                                       "upload['model'] is a model the server averages)")
        raise PrivacyConfigError(f"privacy: algorithm {name} cannot run with differential privacy: {reason}")
    if kind not in COVERED_UPLOADS:
        raise PrivacyConfigError(f"privacy: algorithm {name} declares dp_upload={kind!r}; fedfew clips only "
                                 f"{', '.join(COVERED_UPLOADS)}")
    from fedfew.engine.algorithm import Algorithm as Base  # at call time: the engine imports this package

    if type(algorithm).play_round is not Base.play_round:
        raise PrivacyConfigError(f"privacy: algorithm {name} plays its own rounds (play_round): DP-FedAvg covers "
                                 "rounds of one broadcast, update and average")
    if algorithm.evaluates_clients:
        raise PrivacyConfigError(f"privacy: algorithm {name} reports scores of the clients' own models on their own "
                                 "data, which the guarantee does not cover")
    return kind


def what_is_covered(mechanism: str, kind: str) -> str:
    """One sentence for the summary: what the guarantee protects, and against whom."""
    against = ("anyone who sees the global models (the server is trusted with the clipped updates)"
               if mechanism == "central-dp" else "the server and anyone who sees what the clients upload")
    return (f"client-level: {COVERED_UPLOADS[kind]} is clipped; every round's global model is protected against "
            f"{against}; not covered: participation, timing, the clients' training metrics and private states")
