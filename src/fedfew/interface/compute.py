"""Where and in what precision the numbers are computed: ``runtime.device`` and ``runtime.precision``.

Algorithms never name a device or a dtype; the engine wraps every client update and every
evaluation in :meth:`Compute.scope`, which sets the default device for new tensors and, for
``bf16``, autocasts matrix products and convolutions to bfloat16 (parameters, optimiser states and
losses stay float32). On CUDA, ``fp32`` turns off the TensorFloat-32 shortcuts PyTorch takes by
default for cuDNN convolutions (10-bit mantissas: relative loss differences of a few 1e-3 after two
rounds of MAML, measured on an H100, docs/performance.md), so that a GPU run is the CPU's to float32
rounding; ``tf32`` asks for them. Sampling always draws on the CPU from the seeded generators, so a
run draws the same episodes and batches on any device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from fedfew.core.errors import UsageError
from fedfew.interface.precision import Precision, choose_precision


class DeviceError(UsageError):
    """The device asked for is not available here (a usage error: exit 2)."""


def resolve_device(name: str) -> torch.device:
    """"cpu", "cuda" (an error if no GPU is visible) or "auto" (cuda when available)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError("runtime.device=cuda: no CUDA GPU is visible to torch here (use cpu or auto)")
    return torch.device(name)


@contextlib.contextmanager
def tf32_allowed(allowed: bool) -> Iterator[None]:
    """cuDNN's and cuBLAS's TensorFloat-32 switches set for the block and restored after it (they are
    process-wide; PyTorch's defaults are on for convolutions, off for matrix products)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@dataclass(frozen=True)
class Compute:
    device: torch.device = torch.device("cpu")
    precision: str = "fp32"  # what runs: fp32, tf32 or bf16 (``auto`` resolved)
    #: What was asked and why this precision runs (:func:`fedfew.interface.precision.choose_precision`).
    chosen: Precision | None = field(default=None, compare=False)

    @classmethod
    def from_runtime(cls, device: str, precision: str) -> Compute:
        resolved = resolve_device(device)
        if precision == "tf32" and resolved.type != "cuda":
            raise DeviceError(f"runtime.precision=tf32 is a CUDA mode; runtime.device={device} runs on "
                              f"{resolved.type} (use fp32, bf16 or auto)")
        chosen = choose_precision(precision, resolved.type)
        return cls(resolved, chosen.ran, chosen)

    @property
    def is_default(self) -> bool:
        return self.device.type == "cpu" and self.precision == "fp32"

    @contextlib.contextmanager
    def device_scope(self) -> Iterator[None]:
        """New tensors on the device (the server side: broadcast, aggregation, nested rounds)."""
        if self.device.type == "cpu":
            yield
            return
        with torch.device(self.device), self.cuda_precision():
            yield

    def cuda_precision(self) -> contextlib.AbstractContextManager[None]:
        return tf32_allowed(self.precision == "tf32") if self.device.type == "cuda" else contextlib.nullcontext()

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """The device, and bf16 autocast when asked (client updates and evaluation)."""
        if self.is_default:
            yield
            return
        with contextlib.ExitStack() as stack:
            if self.device.type != "cpu":
                stack.enter_context(torch.device(self.device))
                stack.enter_context(self.cuda_precision())
            if self.precision == "bf16":
                stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
            yield


CPU_FP32 = Compute()


#: ``runtime.compile`` of the batched path ("off", "default", "reduce-overhead"), set for one round's
#: clients by :class:`~fedfew.engine.batched.BatchedEngine` and read by the batched episodic update
#: (:mod:`fedfew.algorithms.parts.batched_episodic`): an engine setting beside the device's, so the
#: algorithm itself never sees the runtime and the engine imports nothing of the algorithms.
COMPILE_MODE: ContextVar[str] = ContextVar("fedfew_batched_compile", default="off")


@contextlib.contextmanager
def compile_mode(mode: str) -> Iterator[None]:
    """The batched clients' stacked loss compiled with ``torch.compile(mode=...)`` inside the block
    ("off": eager, as without it)."""
    token = COMPILE_MODE.set(mode)
    try:
        yield
    finally:
        COMPILE_MODE.reset(token)
