"""Which precision a run computes in, and why: ``runtime.precision: auto`` picks bfloat16 only where the
hardware computes it natively, and an explicit ``bf16`` where it does not is warned about once.

On a CPU, bfloat16 is native with AVX-512 BF16 or AMX (Intel Cooper Lake / Sapphire Rapids and later,
AMD Zen 4 and later): elsewhere PyTorch emulates it, and a bf16 run is several times *slower* than
float32 (8x measured: 28.3 s a round of the peers' workload against fp32's 3.4 s on an AVX2-only AMD
EPYC; docs/performance.md). On a GPU it is native where ``torch.cuda.is_bf16_supported()`` says so
(Ampere and later).
"""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass
from pathlib import Path

from fedfew.core.jsontypes import JSONObject

logger = logging.getLogger(__name__)

#: The CPU flags (Linux /proc/cpuinfo) that mean native bfloat16 arithmetic.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: The measured slowdown of emulated bf16 against fp32 on a CPU, in words (docs/performance.md).
EMULATED_SLOWDOWN = "about 8x slower than fp32 (28.3 s against 3.4 s a round, measured on an AVX2-only AMD EPYC)"


@dataclass(frozen=True)
class Precision:
    """The precision a run computes in (``fp32``, ``tf32`` or ``bf16``), what was asked and why."""

    ran: str
    asked: str
    why: str

    def to_json(self) -> JSONObject:
        return {"ran": self.ran, "asked": self.asked, "why": self.why}


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags (Linux: /proc/cpuinfo), or None where they cannot be read."""
    if platform.system() != "Linux":
        return None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return None


def native_bf16(device_type: str, flags: set[str] | None = None, cuda_bf16: bool | None = None) -> tuple[bool, str]:
    """(whether ``device_type`` computes bfloat16 natively, the evidence in words). ``flags`` and
    ``cuda_bf16`` stand for the hardware's answers (read from it when None): a test gives both."""
    if device_type == "cuda":
        if cuda_bf16 is None:
            import torch

            cuda_bf16 = bool(torch.cuda.is_bf16_supported())
        return cuda_bf16, ("the GPU supports bf16 (torch.cuda.is_bf16_supported)" if cuda_bf16
                           else "the GPU does not support bf16 (torch.cuda.is_bf16_supported)")
    if flags is None:
        flags = cpu_flags()
    if flags is None:
        return False, "the CPU's bf16 support cannot be read here (no /proc/cpuinfo)"
    found = [flag for flag in NATIVE_BF16_FLAGS if flag in flags]
    if found:
        return True, f"the CPU has native bf16 ({', '.join(found)})"
    return False, f"the CPU has no native bf16 (neither {' nor '.join(NATIVE_BF16_FLAGS)}): torch would emulate it"


_WARNED: set[str] = set()


def choose_precision(asked: str, device_type: str, flags: set[str] | None = None,
                     cuda_bf16: bool | None = None) -> Precision:
    """The precision a run of ``runtime.precision: asked`` computes in on ``device_type``. ``auto``:
    bf16 where it is native, else fp32. An explicit ``bf16`` runs as asked; on a CPU without native
    bf16 it is warned about once per process (it is the slow path)."""
    if asked == "auto":
        native, evidence = native_bf16(device_type, flags, cuda_bf16)
        return Precision("bf16" if native else "fp32", asked, f"auto: {evidence}")
    if asked == "bf16" and device_type == "cpu":
        native, evidence = native_bf16(device_type, flags, cuda_bf16)
        if not native:
            if evidence not in _WARNED:
                _WARNED.add(evidence)
                logger.warning("runtime.precision=bf16: %s, so bf16 runs %s; use fp32, or auto (bf16 only where it "
                               "is native)", evidence, EMULATED_SLOWDOWN)
            return Precision("bf16", asked, f"asked; {evidence}")
        return Precision("bf16", asked, f"asked; {evidence}")
    return Precision(asked, asked, "asked")
