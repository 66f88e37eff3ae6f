"""What a MAML meta-step costs on this machine: first- against second-order, and for second order the
losses of the meta-batch summed before one backward (fedfew's ``algorithms/parts/episodic.py``) against
one backward per task (the same gradient, accumulated).

    .venv/bin/python benchmarks/bench_maml_order.py [--shots 1 5] [--pairs 3] [--threads 1]

fedfew's Conv4-64 at 28x28 (the calibration study's network) and ``fewshot.learners.MAML`` (inner step
0.4, one inner step) on random 5-way tasks with K queries a class, 32 tasks a meta-step. The modes are
alternated in one process, ``--pairs`` times; prints the median seconds a meta-step with min-max, each
mode's peak resident memory above what the network and tasks take (a fresh child process per mode,
Linux's VmHWM), and the largest difference between the summed and per-task gradients.
docs/calibration.md ("Cost, measured") quotes a run of it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from pathlib import Path

import torch

from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.learners import MAML
from fedfew.models import build_model

MODES = ("first-order", "second-order summed", "second-order per task")


def tasks(shot: int, count: int, seed: int) -> list[Episode]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(5).repeat_interleave(shot)
    out = []
    for _ in range(count):
        support, query = (torch.randn(5 * shot, 1, 28, 28, generator=generator)
                          .contiguous(memory_format=torch.channels_last) for _ in range(2))
        out.append(Episode(support, labels, query, labels.clone(), torch.arange(5),
                           torch.arange(5 * shot), torch.arange(5 * shot)))
    return out


def meta_gradient(model: torch.nn.Module, episodes: list[Episode], mode: str) -> list[torch.Tensor]:
    learner = MAML(inner_lr=0.4, inner_steps=1, test_inner_steps=3, first_order=mode == "first-order")
    for p in model.parameters():
        p.grad = None
    if mode == "second-order per task":
        for episode in episodes:
            (learner.loss(model, episode)[0] / len(episodes)).backward()
    else:
        total = torch.zeros(())
        for episode in episodes:
            total = total + learner.loss(model, episode)[0] / len(episodes)
        total.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def model_for(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # the same initial network for every mode
    model = build_model("conv4", (1, 28, 28), 5, hidden=64)
    return model.train()


def _status_kb(field: str) -> int:
    """A field of /proc/self/status in kB (Linux): VmHWM, the peak resident memory of this process's
    own address space (unlike ``ru_maxrss``, which a spawned child inherits from its parent)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_memory(shot: int, mode: str, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    model, episodes = model_for(0), tasks(shot, 32, 1)
    before = _status_kb("VmHWM")
    meta_gradient(model, episodes, mode)
    out.put((_status_kb("VmHWM") - before) / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shots", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    context = mp.get_context("spawn")
    for shot in args.shots:
        model, episodes = model_for(0), tasks(shot, 32, 1)
        meta_gradient(model, episodes, "second-order summed")  # warm-up
        seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(args.pairs):
            for mode in MODES:
                start = time.perf_counter()
                meta_gradient(model, episodes, mode)
                seconds[mode].append(time.perf_counter() - start)
        summed = meta_gradient(model, episodes, "second-order summed")
        per_task = meta_gradient(model, episodes, "second-order per task")
        difference = max(float((a - b).abs().max()) for a, b in zip(summed, per_task))
        for mode in MODES:
            queue: mp.Queue = context.Queue()
            child = context.Process(target=peak_memory, args=(shot, mode, queue))
            child.start()
            memory = queue.get()
            child.join()
            times = seconds[mode]
            print(f"5-way {shot}-shot, {mode}: {statistics.median(times):.2f} s a meta-step "
                  f"[{min(times):.2f}, {max(times):.2f}] over {len(times)}, peak memory +{memory:.0f} MB")
        print(f"5-way {shot}-shot: largest |summed - per-task| gradient difference {difference:.1e}")


if __name__ == "__main__":
    main()
