"""Secure aggregation on the Flower engines (``flower.secure_aggregation``; fedfew.flower.secagg, docs/privacy.md).

The default suite checks the pieces without a federation:

* for every covered algorithm, the results the server makes of the *sum* of the clients' vectors give
  exactly the algorithm's own aggregate of the individual uploads (and DP-FedAvg's, central and local,
  with adaptive clipping), and within the stated bound once the sum goes through Flower's quantisation;
* the table of covered algorithms agrees with what each built algorithm says of itself;
* every setting secure aggregation cannot honour (engine, algorithm, stragglers, protocol values,
  privacy) is one line naming the key, exit 2; a config without it keeps its stored key;
* the frl-* baselines' deployment groups on flower-sim run in the server's process (as on flower).

The runs on real Flower processes (the capture of what the server receives, with and without central
DP; SecAgg = plain within the bound; a SuperNode stopped after the key exchange, and one after its masked
vector) are marked ``flower``: tests/flower/test_simulation.py (class TestSecureAggregation) and tests/flower/test_flower.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedfew.algorithms import register_all
from fedfew.config.validation import ConfigError, SecureAggregationConfig, load_config
from fedfew.core.seeding import derive_seed, torch_generator
from fedfew.engine.schedule import client_schedule
from fedfew.engine.tasks import ClientTask, run_client_task
from fedfew.interface.algorithm import Algorithm, ClientResult
from fedfew.interface.protocol import init_generator, initial_client_state, initial_server_state
from fedfew.interface.registration import ALGORITHMS
from fedfew.interface.static import static_tensors
from fedfew.privacy.secure_sum import (
    SecureAggregationError,
    SecureSettings,
    check_algorithm,
    client_vector,
    layout,
    refusal,
    server_results,
)
from fedfew.run.experiment import build_experiment
from fedfew.study.grid import config_hash
from tests.cli.test_fuzz import run_cli
from tests.tiny import ALGORITHM_SETUPS, tiny_config

REPO = Path(__file__).resolve().parents[2]
SECURE = {"secure_aggregation": {"enabled": True}}
register_all()
#: The registered algorithms that declare a secure-summation cover (Algorithm.secure_sum).
COVERED = sorted(name for name in ALGORITHMS.names() if vars(ALGORITHMS.get(name)).get("secure_sum") is not None)
# Research mode (``privacy.noise: seeded``): the secure sum is compared with the plain DP round, so both draw the seeded noise.
CENTRAL = {"mechanism": "central-dp", "clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-3, "noise": "seeded"}


def secure_config(name: str, **sections: Any) -> dict[str, Any]:
    """The tiny config of ``name`` on flower-sim with secure aggregation, one round of 3 of 4 clients."""
    sections.setdefault("federation", {"rounds": 1, "clients_per_round": 3})
    config = tiny_config(name, **sections)
    config["runtime"] = {**config["runtime"], "engine": "flower-sim"}
    config["flower"] = {**SECURE, **config.get("flower", {})}
    return config


def one_round(config: dict[str, Any], clip: float | None = None) -> dict[str, Any]:
    """Round 1 of ``config`` in this process: the server's state, each selected client's result (with
    the privacy spec's clip replaced by ``clip``), and the aggregation of the individual uploads."""
    cfg = load_config(config)
    experiment = build_experiment(cfg)  # nothing started: the engine is built by a simulator only
    algorithm, seed = experiment.algorithm, cfg.seed
    server, privacy = initial_server_state(algorithm, torch_generator(seed, "server-init")), experiment.privacy
    if privacy is not None:
        server = privacy.init_server(server)
    spec = privacy.client_spec(server).to_json() if privacy is not None else None
    if spec is not None and clip is not None:
        spec = {**spec, "clip": clip}
    task = ClientTask(0, "0", privacy=spec)
    selected = client_schedule(len(experiment.clients), cfg.federation.clients_per_round, 1, seed)[0]
    results = {}
    for cid in selected:
        client = experiment.clients[cid]
        state = initial_client_state(algorithm, client, init_generator(seed, cid))
        results[cid] = run_client_task(algorithm, task, client, algorithm.broadcast(server, cid), state, seed)
    return {"config": cfg, "experiment": experiment, "server": server, "results": results,
            "aggregate": aggregate(experiment, server, results)}


def aggregate(experiment: Any, server: Any, results: dict[int, ClientResult]) -> dict[str, torch.Tensor]:
    """The next global model, exactly as run_round makes it (the algorithm's, or DP-FedAvg's aggregation)."""
    seed = experiment.config.seed
    if experiment.privacy is not None:
        return experiment.privacy.aggregate(server, results, seed, "0")[0]["model"]
    torch.manual_seed(derive_seed(seed, "aggregate-global", "0"))
    return experiment.algorithm.aggregate(server, results, torch_generator(seed, "aggregate", "0"))["model"]


def quantised_sum(vectors: list[np.ndarray], c: float, levels: int) -> np.ndarray:
    """What Flower's unmask stage recovers from the clients' vectors: each quantised (stochastic rounding,
    flwr's own ``quantize``), summed, dequantised and shifted back (the masks cancel exactly mod M)."""
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    total = sum(quantize([v], c, levels)[0].astype(np.int64) for v in vectors)
    return dequantize([total], c, levels)[0] - (len(vectors) - 1) * c


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())


def secure_aggregate(setup: dict[str, Any], results: dict[int, ClientResult], quantise: bool,
                     margin: float = 0.0) -> tuple[dict[str, torch.Tensor], float]:
    """(the next global model from the sum of the clients' vectors, the bound of its error)."""
    from fedfew.flower.secagg import SecureRounds

    experiment, server = setup["experiment"], setup["server"]
    settings = SecureSettings.from_config(setup["config"].flower.secure_aggregation, experiment)
    assert settings is not None
    rounds = SecureRounds(settings, experiment.algorithm)
    frozen = static_tensors(experiment.algorithm).keys()
    shapes = layout(server["model"], frozen)
    spec, _, _ = rounds.spec(ClientTask(0, "0", privacy=(experiment.privacy.client_spec(server).to_json()
                                                         if experiment.privacy else None)), shapes)
    vectors, skipped = {}, set()
    for cid, result in results.items():
        vectors[cid], sat_out = client_vector(spec, server["model"], result, frozen)
        if sat_out:
            skipped.add(cid)
    cids = sorted(vectors)
    total = (quantised_sum([vectors[c] for c in cids], settings.clipping_range, settings.quantization_range)
             if quantise else np.sum([vectors[c] for c in cids], axis=0))
    privacy = experiment.privacy
    denominator = None if privacy is None else privacy.per_round if privacy.central else len(cids) - len(skipped)
    out = server_results(spec, server["model"], total, cids, skipped, settings.step, frozen, denominator, margin)
    assert sorted(out.results) == cids and out.trained == sorted(set(cids) - skipped)
    return aggregate(experiment, server, out.results), out.error_bound


# -- the sum gives the algorithm's own aggregate -------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(n for n in ALGORITHM_SETUPS if n in COVERED))
def test_the_sum_gives_the_algorithms_aggregate(name: str) -> None:
    """The secure round's results, made of the sum alone, give the algorithm's aggregate of the individual
    uploads (to float rounding), and within the stated bound after Flower's quantisation."""
    pytest.importorskip("flwr")
    setup = one_round(secure_config(name))
    exact, _ = secure_aggregate(setup, setup["results"], quantise=False)
    assert max_difference(exact, setup["aggregate"]) < 1e-6
    quantised, bound = secure_aggregate(setup, setup["results"], quantise=True)
    error = max_difference(quantised, setup["aggregate"])
    assert 0 < bound < 1e-4 and error <= bound + 1e-6, (error, bound)


def test_a_weighting_by_samples_and_a_client_that_sat_out() -> None:
    """fl-proto weighted by samples (the largest client's samples as max_weight) with one client sitting
    the round out (too little data for an episode): it sends zeros and is left out, as in the plain round."""
    pytest.importorskip("flwr")
    config = secure_config("fl-proto", partition={"name": "dirichlet", "num_clients": 4, "options": {"alpha": 0.01}},
                           federation={"rounds": 1, "clients_per_round": 4})  # client 3 holds 2 samples
    config["algorithm"]["options"]["aggregation"] = "samples"
    setup = one_round(config)
    assert any(r.skipped for r in setup["results"].values()) and not all(r.skipped for r in setup["results"].values())
    exact, _ = secure_aggregate(setup, setup["results"], quantise=False)
    assert max_difference(exact, setup["aggregate"]) < 1e-6
    quantised, bound = secure_aggregate(setup, setup["results"], quantise=True)
    assert max_difference(quantised, setup["aggregate"]) <= bound + 1e-6


@pytest.mark.parametrize("privacy", [CENTRAL, {**CENTRAL, "adaptive_clip": {"count_noise": 2.0}},
                                     {**CENTRAL, "mechanism": "local-dp"}], ids=["central", "adaptive", "local"])
def test_with_differential_privacy_the_sum_is_dp_fedavgs(privacy: dict[str, Any]) -> None:
    """DP-FedAvg's clipped sum, noised by the server after unmasking: with the clients clipping to
    C - sqrt(d) steps (central-dp), the model is the plain DP run's within (K step + K margin) / m."""
    pytest.importorskip("flwr")
    config = secure_config("fl-proto", privacy=privacy)
    setup = one_round(config)
    server = setup["server"]
    clip = float(server["dp"]["clip"])
    d = sum(t.numel() for t in server["model"].values() if torch.is_floating_point(t))
    settings = SecureSettings.from_config(setup["config"].flower.secure_aggregation, setup["experiment"])
    assert settings is not None
    margin = float(np.sqrt(d) * settings.step) if privacy["mechanism"] == "central-dp" else 0.0
    clipped = one_round(config, clip=clip - margin)["results"] if margin else setup["results"]
    exact, _ = secure_aggregate(setup, clipped, quantise=False, margin=margin)
    m = setup["experiment"].privacy.per_round if privacy["mechanism"] == "central-dp" else len(clipped)
    assert max_difference(exact, setup["aggregate"]) <= len(clipped) * margin / m + 1e-6
    quantised, bound = secure_aggregate(setup, clipped, quantise=True, margin=margin)
    assert max_difference(quantised, setup["aggregate"]) <= bound + 1e-6
    if margin:  # the quantised update stays within the clip C: DP-FedAvg's sensitivity holds
        from flwr.common.secure_aggregation.quantization import dequantize, quantize

        for result in clipped.values():
            vector, _ = client_vector({"mode": "dp", "clipping_range": settings.clipping_range}, server["model"], result)
            back = dequantize(quantize([vector], settings.clipping_range, settings.quantization_range),
                              settings.clipping_range, settings.quantization_range)[0]
            assert np.linalg.norm(back[:d]) <= clip


def test_a_coordinate_beyond_the_clipping_range_stops_the_round() -> None:
    setup = one_round(secure_config("fl-proto"))
    spec = {"mode": "mean", "weight": "episodes", "max_weight": 2.0, "clipping_range": 1e-6}
    with pytest.raises(SecureAggregationError, match=r"clipping_range=1e-06: a client's update has a coordinate"):
        client_vector(spec, setup["server"]["model"], next(iter(setup["results"].values())))
    spec = {**spec, "clipping_range": 8.0, "max_weight": 1.0}
    with pytest.raises(SecureAggregationError, match="exceeds flower.secure_aggregation.max_weight=1"):
        client_vector(spec, setup["server"]["model"], next(iter(setup["results"].values())))


# -- which algorithms ------------------------------------------------------------------------------------------
VARIANTS = [(name, {}) for name in sorted(ALGORITHM_SETUPS)] + [
    ("fedavg", {"score_uploads": True}), ("fedfsl-mi", {"reference": "exclusive"}),
    ("fedfsl-mi-adv", {"reference": "exclusive"}), ("frl-oneshot", {"stage": "preparation"}),
    ("fl-maml", {"aggregation": "uniform"})]


@pytest.mark.parametrize("name, options", VARIANTS, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in VARIANTS])
def test_the_declared_cover_agrees_with_each_built_algorithm(name: str, options: dict[str, Any]) -> None:
    """The config check (the class's declaration and the options) and the engine's check (of the built
    algorithm) agree."""
    config = tiny_config(name)
    config["algorithm"]["options"].update(options)
    if options.get("score_uploads"):
        config.update(task="classification", partition={"name": "iid", "num_clients": 4},
                      model={"name": "mlp", "options": {"hidden": 16}}, classification={"client_val_fraction": 0.2})
    cfg = load_config(config)
    algorithm = build_experiment(cfg).algorithm
    reason = refusal(ALGORITHMS.get(name), cfg.algorithm_options())
    try:
        kind = check_algorithm(algorithm)
    except SecureAggregationError:
        assert reason is not None
    else:
        assert reason is None and kind == getattr(algorithm.options, "aggregation", "samples")


def test_the_cover_is_declared_by_each_class_and_a_plugin_can_opt_in() -> None:
    """Secure summation's cover is what each algorithm class declares (no table of names elsewhere): the
    covered ones are exactly the ones that say so; a subclass of a covered algorithm that does not declare
    it is refused (it may change what is aggregated); a plugin class that declares it is covered."""
    assert COVERED == ["fedavg", "fedfsl-mi", "fedfsl-mi-adv", "fedfsl-prox", "fedprox", "fl-maml", "fl-proto",
                       "frl-finetune", "frl-oneshot", "frl-per-fedavg", "frl-per-fedavg-distance"]
    fedavg = ALGORITHMS.get("fedavg")
    default = fedavg.Options()
    assert refusal(fedavg, default) is None
    assert "score_uploads" in str(refusal(fedavg, default.model_copy(update={"score_uploads": True})))

    class Unsaid(fedavg):  # type: ignore[misc, valid-type]
        pass

    class Declared(Algorithm):
        secure_sum = ""

    assert refusal(Unsaid, default) == Algorithm.secure_sum_refused
    assert refusal(Declared, Declared.Options()) is None
    assert "is none of" in str(refusal(Declared, {"aggregation": "median"}))
    for name in ALGORITHMS.names():
        kind = ALGORITHMS.get(name)
        if name not in COVERED:
            assert kind.secure_sum_refusal(None) == vars(kind)["secure_sum_refused"], name


#: Every refusal a covered algorithm makes for options of its own (the options, the words of the refusal).
OPTION_REFUSALS = {
    "fedavg": ({"score_uploads": True}, "with score_uploads each client's own model is scored on its own data"),
    "fedprox": ({"score_uploads": True}, "with score_uploads each client's own model is scored on its own data"),
    "frl-finetune": ({"score_uploads": True}, "with score_uploads each client's own model is scored on its own data"),
    "frl-oneshot": ({"stage": "preparation"},
                    "stage: preparation keeps the best individual uploads by their cross-validation scores"),
    "fedfsl-mi": ({"reference": "exclusive"},
                  "reference: exclusive broadcasts w_{-k}, an average of the other clients' individual uploads"),
    "fedfsl-mi-adv": ({"reference": "exclusive"},
                      "reference: exclusive broadcasts w_{-k}, an average of the other clients' individual uploads"),
}


def test_the_options_secure_summation_needs_are_declared() -> None:
    """``secure_sum_requires`` replaces the classes' own ``secure_sum_refusal``: the refusal of each option
    that breaks the sum is the class's ``secure_sum_refused``, a subclass keeps its parents' requirements and
    adds its own, and the cover itself (``secure_sum``) stays each class's own."""
    for name in ALGORITHMS.names():
        assert "secure_sum_refusal" not in vars(ALGORITHMS.get(name)), name  # declared, not written
    for name, (options, message) in OPTION_REFUSALS.items():
        kind = ALGORITHMS.get(name)
        default = kind.Options()
        assert kind.secure_sum_refusal(default) is None, name
        assert kind.secure_sum_refusal(default.model_copy(update=options)) == message, name
        assert kind.secure_sum_refusal({**default.model_dump(), **options}) is None, name  # a mapping has no attributes

    class Mean(Algorithm):
        secure_sum = "with weighting: samples"
        secure_sum_requires = {"weighting": "samples"}
        secure_sum_refused = "weighting: median is no mean"

    class Sub(Mean):  # keeps Mean's requirement, adds one, declares no cover of its own
        secure_sum_requires = {"bits": 32}

    class Covered(Sub):
        secure_sum = ""

    class Options:
        def __init__(self, **values: object) -> None:
            self.__dict__.update(values)

    assert Mean.secure_sum_refusal(Options(weighting="samples")) is None
    assert Mean.secure_sum_refusal(Options(weighting="median")) == "weighting: median is no mean"
    assert Mean.secure_sum_refusal(Options()) is None  # an option the options lack counts as asked
    assert Covered.secure_sum_refusal(Options(weighting="samples", bits=32)) is None
    assert Covered.secure_sum_refusal(Options(weighting="median", bits=32)) == "weighting: median is no mean"
    assert Covered.secure_sum_refusal(Options(weighting="samples", bits=16)) == "weighting: median is no mean"
    assert Sub.secure_sum_refusal(Options(weighting="samples", bits=32)) == Algorithm.secure_sum_refused  # no cover


def test_fedfew_list_secure_aggregation(capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.cli.main import main

    assert main(["list", "secure-aggregation"]) == 0
    out = capsys.readouterr().out
    assert "flower, flower-sim" in out.splitlines()[0]
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["fl-proto"].split()[1] == "covered:" and lines["oneshot"].split()[1] == "refused:"
    assert "score_uploads: false" in lines["fedavg"]


# -- refusals ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, message", [
    ({"runtime": {"engine": "inprocess"}}, "flower.secure_aggregation: runtime.engine=inprocess cannot honour it"),
    ({"runtime": {"engine": "workers"}}, "flower.secure_aggregation: runtime.engine=workers cannot honour it"),
    ({"algorithm": {"name": "oneshot"}}, "flower.secure_aggregation: algorithm oneshot cannot run with secure"),
    ({"algorithm": {"name": "f2l"}}, "flower.secure_aggregation: algorithm f2l cannot run"),
    ({"algorithm": {"name": "fedfsl-mi", "options": {"reference": "exclusive"}}}, "algorithm fedfsl-mi cannot run"),
    ({"federation": {"stragglers": 0.3}}, "federation.stragglers=0.3 drops replies"),
    ({"federation": {"clients_per_round": 1}}, "a round sums 1 client(s)"),
    ({"flower": {"num_shares": 2}}, "flower.secure_aggregation.num_shares=2: a count must be at least 3"),
    ({"flower": {"num_shares": 1.5}}, "flower.secure_aggregation.num_shares=1.5: a fraction must be in (0, 1]"),
    ({"flower": {"num_shares": 5}}, "flower.secure_aggregation.num_shares=5 exceeds the 3 clients"),
    ({"flower": {"reconstruction_threshold": 4}}, "reconstruction_threshold=4 asks 4 shares of the 3"),
    ({"flower": {"reconstruction_threshold": 1}}, "reconstruction_threshold=1: a count must be at least 2"),
    ({"flower": {"modulus_range": 3000000}}, "modulus_range=3000000 must be a power of 2"),
    ({"flower": {"quantization_range": 2**30, "modulus_range": 2**31}}, "the sum of 3 clients' quantised values would wrap"),
    ({"flower": {"clipping_range": -1}}, "flower.secure_aggregation.clipping_range"),
    ({"flower": {"enabled": False, "clipping_range": 2.0}}, "flower.secure_aggregation.clipping_range is set but "
                                                              "flower.secure_aggregation.enabled is false"),
    ({"privacy": {**CENTRAL, "client_metrics": True}}, "privacy.client_metrics sends each client's training metrics"),
    ({"privacy": {**CENTRAL, "clip": 9.0}}, "clipping_range=8 is below privacy.clip=9"),
    ({"privacy": {**CENTRAL, "adaptive_clip": {"count_noise": 2.0}}, "flower": {"clipping_range": 3.0}},
     "with privacy.adaptive_clip, quantization_range / (2 clipping_range) must be an integer"),
])
def test_what_it_cannot_honour_is_one_line_naming_the_key(change: dict[str, Any], message: str, tmp_path: Path) -> None:
    config = secure_config("fl-proto")
    for section, values in change.items():
        if section == "flower":
            config["flower"]["secure_aggregation"] = {**config["flower"]["secure_aggregation"], **values}
        elif section == "algorithm":
            base, options = ALGORITHM_SETUPS[values["name"]]
            config.update({k: v for k, v in base.items() if k in ("task", "partition", "model")})
            config["algorithm"] = {"name": values["name"], "options": {**options, **values.get("options", {})}}
        else:
            config[section] = {**config.get(section, {}), **values}
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    code, err = run_cli(["run", str(path)], tmp_path / "out")  # before any run folder, any process
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


# -- off: nothing changes ---------------------------------------------------------------------------------------
def test_stored_cells_keep_their_keys_and_secure_aggregation_makes_a_new_one() -> None:
    records = sorted((REPO / "studies" / "store").glob("*/*.json"))
    assert records, "no stored records to check"
    for path in records[:: max(1, len(records) // 20)]:
        record = json.loads(path.read_text())
        config = load_config(record["config"])
        assert config.flower.secure_aggregation == SecureAggregationConfig()
        if config.privacy.enabled and "noise" not in record["config"]["privacy"]:
            # a DP cell stored before issue 51: its guarantee (secure noise, its accounting) is in the key now,
            # so the key moved (the cells re-run since carry the new keys, and keep them)
            assert config_hash(config) != record["config_hash"], path
        else:
            assert config_hash(config) == record["config_hash"], path
    config = load_config(json.loads(records[0].read_text())["config"])
    on = config.model_copy(update={"flower": config.flower.model_copy(
        update={"secure_aggregation": SecureAggregationConfig(enabled=True)})})
    assert config_hash(on) != config_hash(config)



def test_frl_deployment_groups_on_flower_sim_run_in_this_process() -> None:
    """The frl-* baselines evaluate on deployment groups, new clients their algorithm federates itself
    (experiment.federation_factory, without an experiment): on flower-sim they run in the server's
    process, as on flower (a simulation engine cannot be started for them)."""
    from fedfew.engine.base import EngineSetup, Faults, InProcessEngine, NoOptions
    from fedfew.flower.launch import FlowerSimLaunch

    experiment = build_experiment(load_config(tiny_config("frl-finetune")))
    setup = EngineSetup(experiment.algorithm, {c.client_id: c for c in experiment.clients}, 0, None, Faults())
    engine = FlowerSimLaunch.build(setup, NoOptions())
    assert type(engine) is InProcessEngine
