"""The client side of differential privacy (fedfew.privacy.clipping): the clip bound holds after the
float32 cast, a client that sat out sends nothing, local-dp's noise is z C on each update and not
reproducible from the config seed, and FRL's prototypes are clipped with its upload."""

from __future__ import annotations

import math

import pytest
import torch

from fedfew.interface.algorithm import ClientResult
from fedfew.privacy import (
    ClientSpec,
    clip_to,
    l2_norm,
    privatize,
)
from fedfew.privacy.clipping import DELTA, PROTOTYPES, REFERENCE, WITHIN


def test_the_upload_and_prototypes_are_clipped_together_without_counts() -> None:
    payload = {"model": {"w": torch.zeros(3)}}
    upload = {"model": {"w": torch.tensor([3.0, 0.0, 0.0])},
              "prototypes": {"classes": torch.tensor([1, 4]), "prototypes": torch.full((2, 2), 2.0),
                             "counts": torch.tensor([5.0, 1.0])}}
    out = privatize(ClientResult(upload=upload, state=None, num_samples=6), payload,
                    ClientSpec("frl-prototypes", 1.0), 0, "0/r0", 1)
    sent = out.upload
    assert set(sent) == {DELTA, PROTOTYPES} and set(sent[PROTOTYPES]) == {"classes", "prototypes"}
    norm = math.sqrt(l2_norm(sent[DELTA]) ** 2 + l2_norm({"p": sent[PROTOTYPES]["prototypes"]}) ** 2)
    assert norm <= 1.0 and norm == pytest.approx(1.0, abs=1e-5) and out.num_samples == 0
    scale = 1.0 / math.sqrt(9 + 16)  # one joint clip: every coordinate scaled alike
    assert sent[DELTA]["w"][0] == pytest.approx(3 * scale, rel=1e-5)
    assert sent[PROTOTYPES]["prototypes"][0, 0] == pytest.approx(2 * scale, rel=1e-5)
    # the meta-update's update is measured from phi^t (REFERENCE), not from the theta^R it downloaded
    meta = privatize(ClientResult(upload={"model": {"w": torch.tensor([0.5, 0.0, 0.0])}}, state=None),
                     {"model": {"w": torch.ones(3)}, REFERENCE: {"w": torch.zeros(3)}},
                     ClientSpec("frl-prototypes", 1.0), 0, "0/meta", 1)
    assert torch.equal(meta.upload[DELTA]["w"], torch.tensor([0.5, 0.0, 0.0])) and PROTOTYPES not in meta.upload


def test_prototype_uploads_are_padded_to_every_preparation_class() -> None:
    """A client's upload must not say which classes it holds (nor may bytes_up count their rows). Padded
    with zero rows to every class, the upload says nothing of them, and the clip and the server's sums
    are those of the unpadded upload."""
    payload = {"model": {"w": torch.zeros(3)}}
    upload = {"model": {"w": torch.tensor([3.0, 0.0, 0.0])},
              "prototypes": {"classes": torch.tensor([1, 4]), "prototypes": torch.full((2, 2), 2.0)}}
    result = ClientResult(upload=upload, state=None, num_samples=6)
    plain = privatize(result, payload, ClientSpec("frl-prototypes", 1.0), 0, "0/r0", 1).upload
    every = (0, 1, 2, 4, 7)
    spec = ClientSpec.from_json(ClientSpec("frl-prototypes", 1.0, classes=every).to_json())  # through JSON
    padded = privatize(result, payload, spec, 0, "0/r0", 1).upload
    assert padded[PROTOTYPES]["classes"].tolist() == list(every)
    rows = padded[PROTOTYPES]["prototypes"]
    assert torch.equal(rows[[1, 3]], plain[PROTOTYPES]["prototypes"]) and not rows[[0, 2, 4]].any()
    assert torch.equal(padded[DELTA]["w"], plain[DELTA]["w"])  # zero rows leave the joint clip alone
    other = {"model": upload["model"], "prototypes": {"classes": torch.tensor([0]), "prototypes": torch.ones(1, 2)}}
    second = privatize(ClientResult(upload=other, state=None), payload, spec, 0, "0/r0", 2).upload
    assert second[PROTOTYPES]["prototypes"].shape == rows.shape  # the same size whatever a client holds


# -- the client side: the clip ---------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-3, 0.3, 1.0, 7.0, 1e4])
def test_the_clip_bound_holds_after_the_float32_cast(scale: float) -> None:
    g = torch.Generator().manual_seed(int(scale * 1000))
    sent = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g),
            "steps": torch.tensor(3), "frozen": torch.randn(5, generator=g)}
    upload = {"w": sent["w"] + scale * torch.randn(64, 32, generator=g), "b": sent["b"] + scale * torch.randn(32, generator=g),
              "steps": torch.tensor(9), "frozen": sent["frozen"] + 1.0}
    result = ClientResult(upload={"model": upload, "extra": torch.ones(3)}, state={"private": 1},
                          metrics={"loss": 0.7}, num_samples=50, num_episodes=4)
    clip = 1.0
    out = privatize(result, {"model": sent}, ClientSpec("model-delta", clip, adaptive=True), 0, "3", 2, ["frozen"])
    delta = out.upload[DELTA]
    assert set(out.upload) == {DELTA, WITHIN}  # nothing else of the upload leaves the client
    assert set(delta) == {"b", "w"}  # floating tensors only, frozen ones left out
    assert all(t.dtype == torch.float32 for t in delta.values())
    assert l2_norm(delta) <= clip  # the bound, on what is actually sent (float32)
    true = {k: upload[k].double() - sent[k].double() for k in ("b", "w")}
    norm = l2_norm(true)
    assert float(out.upload[WITHIN]) == (1.0 if norm <= clip else 0.0)
    if norm < clip * (1 - 1e-5):  # within the clip: the update itself, to float32 rounding
        assert all(torch.allclose(delta[k].double(), true[k], rtol=1e-6, atol=1e-7) for k in delta)
    else:  # clipped: the same direction, norm C
        assert l2_norm(delta) == pytest.approx(clip, rel=1e-5)
        assert torch.allclose(delta["w"].double() / clip, true["w"] / norm, atol=1e-6)
    # no metrics or counts leave the client by default; its private state stays as it was returned
    assert out.metrics == {} and out.num_samples == 0 and out.num_episodes == 0 and out.state == {"private": 1}
    kept = privatize(result, {"model": sent}, ClientSpec("model-delta", clip, metrics=True), 0, "3", 2)
    assert kept.metrics == {"loss": 0.7} and WITHIN not in kept.upload


def test_clip_to_scales_only_what_is_too_long() -> None:
    v = {"a": torch.tensor([3.0, 4.0], dtype=torch.float64)}  # norm 5
    same, norm = clip_to(v, 10.0)
    assert norm == 5.0 and torch.equal(same["a"], v["a"])
    short, _ = clip_to(v, 1.0)
    assert l2_norm(short) <= 1.0 and l2_norm(short) == pytest.approx(1.0, rel=1e-5)


def test_a_client_that_sat_out_sends_nothing() -> None:
    out = privatize(ClientResult.sat_out({"s": 1}, 3), {"model": {}}, ClientSpec("model-delta", 1.0), 0, "0", 1)
    assert out.upload == {} and out.skipped and out.num_samples == 0


def test_local_noise_has_standard_deviation_z_times_c_on_each_update() -> None:
    sent = {"w": torch.zeros(200_000)}
    result = ClientResult(upload={"model": {"w": torch.zeros(200_000)}})
    spec = ClientSpec("model-delta", clip=0.5, local_noise=0.8 * 0.5)
    out = privatize(result, {"model": sent}, spec, 0, "4", 3)
    assert float(out.upload[DELTA]["w"].double().std()) == pytest.approx(0.4, rel=0.01)
    other = privatize(result, {"model": sent}, spec, 0, "4", 2)  # each client its own draw
    assert not torch.equal(other.upload[DELTA]["w"], out.upload[DELTA]["w"])


def test_local_noise_is_not_reproducible_from_the_config_seed() -> None:
    """The server holds the config seed: by default a client's noise must not be derivable from it
    (it once was torch_generator(seed, "dp-local-noise", round, client), so the server could
    subtract it). Research mode keeps the seeded draw, on request."""
    sent = {"w": torch.zeros(1000)}
    result = ClientResult(upload={"model": {"w": torch.zeros(1000)}})
    spec = ClientSpec("model-delta", clip=0.5, local_noise=0.4)
    first = privatize(result, {"model": sent}, spec, 0, "4", 3).upload[DELTA]["w"]
    again = privatize(result, {"model": sent}, spec, 0, "4", 3).upload[DELTA]["w"]
    assert not torch.equal(first, again)
    from fedfew.core.seeding import torch_generator
    from fedfew.privacy.clipping import LOCAL_NOISE_KEY

    regenerated = torch.randn(1000, generator=torch_generator(0, LOCAL_NOISE_KEY, "4", 3), dtype=torch.float64) * 0.4
    assert not torch.allclose(first.double(), regenerated, atol=1e-6)  # what the server could compute
    seeded = ClientSpec("model-delta", clip=0.5, local_noise=0.4, seeded_noise=True)
    research = privatize(result, {"model": sent}, seeded, 0, "4", 3).upload[DELTA]["w"]
    assert torch.allclose(research.double(), regenerated, atol=1e-6)
