"""How an FRL episode cuts a client's data and phi's head: the support/query split (step 2 of an episode,
a data view that runs on the clients) and the linear variant's MAML-style head rows."""

from __future__ import annotations

import torch

from fedfew.algorithms.parts.frl_deployment import relabelled
from fedfew.core.seeding import torch_generator
from fedfew.data.dataset import LabelledDataset
from fedfew.engine.tasks import DATA_VIEWS
from fedfew.interface.algorithm import ClientData
from fedfew.interface.state import StateDict, get_state

__all__ = ["frl_split", "merged_head", "on_rows", "split_support_query", "task_label_rows", "with_prepared_head"]


def split_support_query(labels: torch.Tensor, fraction: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class, a random ``fraction`` of the positions for support and the rest for query (a class
    with one sample goes to support only)."""
    support, query = [], []
    for cls in torch.unique(labels):
        positions = torch.nonzero(labels == cls).flatten()
        positions = positions[torch.randperm(len(positions), generator=generator, device=generator.device)]
        n = len(positions)
        cut = n if n < 2 else min(max(int(round(fraction * n)), 1), n - 1)
        support.append(positions[:cut])
        query.append(positions[cut:])
    return torch.cat(support).sort().values, torch.cat(query).sort().values


# -- the linear variant's meta-learned head ---------------------------------------------------------
def task_label_rows(num_classes: int, min_rows: int, generator: torch.Generator) -> torch.Tensor:
    """MAML-style labels for a task of ``num_classes`` classes (in sorted class order): distinct rows
    of the head, drawn at random among the first max(num_classes, min_rows). With num_classes >=
    min_rows this is labels 0..N-1 in a random order; a task with fewer classes than a deployment
    group has (min_rows = tau) spreads them over all tau rows, so that every row a group uses is trained."""
    width = max(num_classes, min_rows)
    return torch.randperm(width, generator=generator, device=generator.device)[:num_classes].cpu()


def with_prepared_head(model: torch.nn.Module, prepared: StateDict) -> StateDict:
    """``model``'s state with every tensor from ``prepared``, the head's cut to ``model``'s rows (the
    first rows of the meta-learned head): the meta-learned initialisation of a narrower task."""
    state = get_state(model)
    for name, tensor in state.items():
        source = prepared[name]
        if name.startswith("head."):
            if source.shape[0] < tensor.shape[0]:
                raise ValueError(f"the prepared head has {source.shape[0]} rows, the task needs {tensor.shape[0]}")
            source = source[: tensor.shape[0]]
        state[name] = source.clone()
    return state


def merged_head(full: StateDict, part: StateDict) -> StateDict:
    """``part`` with each head tensor written into the first rows of ``full``'s (rows a task did not
    use keep their values in ``full``)."""
    merged = dict(part)
    for name, tensor in part.items():
        if name.startswith("head.") and tensor.shape != full[name].shape:
            whole = full[name].clone()
            whole[: tensor.shape[0]] = tensor
            merged[name] = whole
    return merged


# -- the episode's pieces that run on the clients ---------------------------------------------------
@DATA_VIEWS.register("frl-split", help="FRL: a client's support or query half of its data for one episode")
def frl_split(data: ClientData, *, seed: int, round_key: str, episode: str, fraction: float, half: str,
              classes: list[int] | None = None, rows: list[int] | None = None, width: int | None = None) -> ClientData:
    """Step 2 of an episode: each class of the client's data split into support and query with the
    client's generator for the episode; labels stay global class ids, or become indices of
    ``classes`` (the linear variant's head), or, with ``rows``, the head row ``rows[i]`` of
    ``classes[i]`` among ``width`` (the meta-learned head's MAML-style labels). The query half
    carries the support half as ``val``."""
    local = data.train
    s, q = split_support_query(local.labels, fraction, torch_generator(seed, "frl-support-query", episode,
                                                                        data.client_id))
    if classes is None:
        support, query = local.subset(s), local.subset(q)
    else:
        order = torch.as_tensor(classes, dtype=torch.long)
        support, query = relabelled(local, s, order), relabelled(local, q, order)
        if rows is not None:
            support, query = on_rows(support, rows, width), on_rows(query, rows, width)
    if half == "support":
        return ClientData(data.client_id, support)
    if half == "query":
        return ClientData(data.client_id, query, val=support)
    raise ValueError(f"frl-split: half must be 'support' or 'query', not {half!r}")


def on_rows(data: LabelledDataset, rows: list[int], width: int | None) -> LabelledDataset:
    """``data`` (labels 0..c-1) with label i moved to head row ``rows[i]`` of ``width`` rows."""
    width = width if width is not None else max(rows) + 1
    names = [f"(row {r})" for r in range(width)]
    for i, r in enumerate(rows):
        names[r] = data.class_names[i]
    return LabelledDataset(inputs=data.inputs, labels=torch.as_tensor(rows, dtype=torch.long)[data.labels],
                           class_names=names, name=data.name, lengths=data.lengths)
