"""Communication counts what moves: a text model's frozen parameters (the word-vector table) are held by
both sides and never cross; bytes sent count the rest. One test per text model (gru, bilstm: frozen
table left out, trainable table sent; sentence_mlp: nothing frozen, everything sent), and the Flower
records carry exactly the counted bytes and put the frozen tensors back on the other side."""

from __future__ import annotations

import pytest
import torch

from fedfew.algorithms.fl_proto import FLProto
from fedfew.algorithms.parts.episodic import EpisodicOptions
from fedfew.core.seeding import torch_generator
from fedfew.data import LabelledDataset
from fedfew.engine.simulator import Simulator
from fedfew.interface.protocol import initial_server_state
from fedfew.interface.static import StaticMismatchError, crossing_bytes, static_tensors
from tests.helpers import clients_from, context_for

VOCAB, DIM, LENGTH = 40, 6, 5


def token_dataset(classes: int = 6, per_class: int = 8) -> LabelledDataset:
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(classes).repeat_interleave(per_class)
    ids = torch.randint(1, VOCAB, (len(labels), LENGTH), generator=g)
    ids[:, 0] = labels + 1  # a class word, so the task is learnable
    return LabelledDataset(ids, labels, [str(c) for c in range(classes)], name="tokens",
                           lengths=torch.full((len(labels),), LENGTH),
                           splits={"base": list(range(classes)), "val": [], "novel": []})


def setup(model: str, **options):
    data = token_dataset()
    ctx = context_for(data, model=model, n_way=3, k_shot=1, q_query=2, **options)
    algorithm = FLProto(EpisodicOptions(local_steps=1), ctx)
    clients = clients_from(data, list(torch.randperm(len(data), generator=torch.Generator().manual_seed(1)).chunk(2)))
    return algorithm, clients


def bytes_of(params: dict[str, torch.Tensor], leave_out: str | None = None) -> int:
    return sum(t.numel() * t.element_size() for k, t in params.items() if k != leave_out)


TABLE = "encoder.embedding.weight"


@pytest.mark.parametrize("model, options", [
    ("gru", {"hidden": 4}),
    ("bilstm", {"hidden": 4}),
])
@pytest.mark.parametrize("freeze", [True, False])
def test_a_frozen_word_table_does_not_cross(model: str, options: dict, freeze: bool) -> None:
    pretrained = torch.randn(VOCAB, DIM, generator=torch.Generator().manual_seed(2))
    algorithm, clients = setup(model, pretrained=pretrained, freeze_embedding=freeze, **options)
    state = initial_server_state(algorithm, torch_generator(0, "init"))["model"]
    assert TABLE in state and torch.equal(state[TABLE], pretrained)
    simulator = Simulator(algorithm, clients, seed=3)
    simulator.run(rounds=2, clients_per_round=2)
    full, without_table = bytes_of(state), bytes_of(state, TABLE)
    expected = 2 * (without_table if freeze else full)  # two clients a round, down and up alike
    assert simulator.state.comm.down == [expected, expected]
    assert simulator.state.comm.up == [expected, expected]
    assert (TABLE in static_tensors(algorithm)) == freeze
    if freeze:  # the table did not change, and without_table is hand-countable: all but VOCAB x DIM floats
        assert torch.equal(simulator.server["model"][TABLE], pretrained)
        assert full - without_table == VOCAB * DIM * 4


def test_sentence_vectors_model_sends_everything() -> None:
    """sentence_mlp's frozen encoder lives outside the model (its vectors are the inputs): every
    parameter trains and crosses."""
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(6).repeat_interleave(8)
    data = LabelledDataset(torch.randn(len(labels), 12, generator=g) + labels[:, None], labels,
                           [str(c) for c in range(6)], name="vectors",
                           splits={"base": list(range(6)), "val": [], "novel": []})
    ctx = context_for(data, model="sentence_mlp", n_way=3, k_shot=1, q_query=2, hidden=8, feature_dim=4)
    algorithm = FLProto(EpisodicOptions(local_steps=1), ctx)
    clients = clients_from(data, list(torch.arange(len(data)).chunk(2)))
    simulator = Simulator(algorithm, clients, seed=3)
    simulator.run(rounds=1, clients_per_round=2)
    assert static_tensors(algorithm) == {}
    assert simulator.state.comm.down == [2 * bytes_of(simulator.server["model"])]


@pytest.mark.parametrize("model", ["gru", "bilstm"])
def test_flower_records_carry_the_counted_bytes_and_restore_the_table(model: str) -> None:
    pytest.importorskip("flwr")
    from fedfew.flower.records import array_bytes, from_records, to_records

    pretrained = torch.randn(VOCAB, DIM, generator=torch.Generator().manual_seed(2))
    algorithm, _ = setup(model, pretrained=pretrained, freeze_embedding=True, hidden=4)
    payload = {"model": initial_server_state(algorithm, torch_generator(0, "init"))["model"]}
    static = static_tensors(algorithm)
    arrays, meta = to_records(payload, static)
    assert array_bytes(arrays) == crossing_bytes(payload, static) == bytes_of(payload["model"], TABLE)
    back = from_records(arrays, meta, static)
    assert all(torch.equal(back["model"][k], payload["model"][k]) for k in payload["model"])
    other = {TABLE: pretrained + 1}  # a node whose word vectors came from other files
    with pytest.raises(StaticMismatchError, match="differs"):
        from_records(arrays, meta, other)
