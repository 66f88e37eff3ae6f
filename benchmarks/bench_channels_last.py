"""Conv4 training-step time with and without channels_last, on this machine.

    .venv/bin/python benchmarks/bench_channels_last.py [--threads 2] [--size 84] [--batch 80]

Prints milliseconds per forward+backward+SGD step. The result decides fedfew's default
(``model.channels_last: true``); re-run it on your hardware before trusting the default there.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from fedfew.models import build_model


def step_time(channels_last: bool, size: int, batch: int, channels: int, repeats: int) -> float:
    torch.manual_seed(0)
    model = build_model("conv4", (channels, size, size), 5, channels_last=channels_last)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, channels, size, size)
    y = torch.randint(0, 5, (batch,))
    for _ in range(3):  # warm-up
        F.cross_entropy(model(x), y).backward()
    start = time.perf_counter()
    for _ in range(repeats):
        optimiser.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimiser.step()
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[28, 84])
    parser.add_argument("--batch", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, batch {args.batch}")
    for size in args.sizes:
        channels = 1 if size == 28 else 3
        plain = step_time(False, size, args.batch, channels, args.repeats)
        nhwc = step_time(True, size, args.batch, channels, args.repeats)
        print(f"conv4 {channels}x{size}x{size}: contiguous {plain:7.1f} ms, channels_last {nhwc:7.1f} ms, "
              f"speed-up {plain / nhwc:.2f}x")


if __name__ == "__main__":
    main()
