"""Where a run's numbers were computed: the versions of Python, torch, numpy and fedfew, the CPU (its model
and the instruction set torch's kernels use) or the GPU (its name and CUDA version), the threads and the
precision. Two machines, or two torch builds, may round the same code's arithmetic differently; a study
record keeps its run's environment (:mod:`fedfew.study.store`), so ``fedfew study verify`` compares a
re-run with its record like with like, and a report names the environments its cells come from.

torch is imported only when an environment is taken (a run has imported it already), never on import.
"""

from __future__ import annotations

import platform
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedfew.config.validation import ExperimentConfig

#: The fields that tell two environments apart: all but fedfew's own version, which the code version
#: (:class:`fedfew.study.store.CodeVersion`) covers; ``fedfew study verify`` compares code versions.
COMPARED = ("python", "torch", "numpy", "platform", "cpu", "cpu_capability", "device", "gpu", "cuda", "threads",
            "precision")

#: What a record without an environment says (every record stored before fedfew recorded one).
NOT_RECORDED = "environment not recorded"


@cache
def machine() -> dict[str, str | None]:
    """The parts of the environment that are this process's, whatever the run: versions, platform, CPU."""
    from importlib.metadata import PackageNotFoundError, version

    import numpy
    import torch

    try:
        fedfew_version = version("fedfew")
    except PackageNotFoundError:  # a source tree never installed: what fedfew.__version__ says there
        fedfew_version = "0+unknown"
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "fedfew": fedfew_version, "platform": f"{platform.system()} {platform.machine()}",
            "cpu": cpu_model(), "cpu_capability": capability() if capability else None}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name (Linux: /proc/cpuinfo's ``model name``; macOS: sysctl's brand string); None
    where neither says (an ARM Linux board names only part numbers): an unknown CPU is recorded as
    unknown, never guessed from the architecture."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() or None
    return None


def run_environment(config: ExperimentConfig) -> dict[str, str | int | None]:
    """The environment a run of ``config`` computes in here: :func:`machine`, the device it resolves to
    (with the GPU's name and CUDA version on a GPU), and its threads and precision."""
    import torch

    from fedfew.interface.compute import DeviceError, resolve_device

    try:
        device = resolve_device(config.runtime.device).type
    except DeviceError:  # the run itself stops with this error; the environment says what was asked
        device = config.runtime.device
    gpu = cuda = None
    if device == "cuda":
        gpu, cuda = torch.cuda.get_device_name(), torch.version.cuda
    out: dict[str, str | int | None] = {**machine(), "device": device, "gpu": gpu, "cuda": cuda,
                                        "threads": config.runtime.threads, "precision": config.runtime.precision}
    if config.runtime.precision != "fp32":  # which precision ran and why (auto decides by the hardware)
        from fedfew.interface.precision import choose_precision

        chosen = choose_precision(config.runtime.precision, device if device in ("cpu", "cuda") else "cpu")
        out.update({"precision": chosen.ran, "precision_why": chosen.why})
    return out


def same_environment(a: Mapping[str, object] | None, b: Mapping[str, object] | None) -> bool:
    """Both recorded and equal in every :data:`COMPARED` field; an environment not recorded is never the
    same as another (it is unknown, not assumed)."""
    return isinstance(a, Mapping) and isinstance(b, Mapping) and all(a.get(k) == b.get(k) for k in COMPARED)


def describe(environment: object) -> str:
    """One environment in words: the processor first (what most often differs), then versions, threads and
    precision."""
    if not isinstance(environment, Mapping):  # none (an older record), or not one that can be read
        return NOT_RECORDED
    e = environment
    if e.get("device") == "cuda":
        where = f"{e.get('gpu') or 'an unknown GPU'} (CUDA {e.get('cuda') or '?'})"
    else:
        capability = f" ({e['cpu_capability']})" if e.get("cpu_capability") else ""
        where = f"{e.get('cpu') or 'an unknown CPU'}{capability}"
    threads = e.get("threads")
    return (f"{where}, {e.get('platform', '?')}, Python {e.get('python', '?')}, torch {e.get('torch', '?')}, "
            f"numpy {e.get('numpy', '?')}, {threads} thread{'' if threads == 1 else 's'}, {e.get('precision', '?')}")


def describe_environments(records: Iterable[Mapping[str, object]]) -> str:
    """The environments of stored records (one per run), most runs first, as a report's header says them:
    ``Environment: ... (all 6 runs).`` or ``Environments: 4 runs on ...; 2 runs: environment not
    recorded.`` Empty for no records. A record whose sittings ran in different environments, or whose
    earlier sittings were not recorded, counts as not recorded (its ``environment_note`` says why)."""
    counts: Counter[str] = Counter(describe(record.get("environment")) for record in records)
    if not counts:
        return ""
    if len(counts) == 1:
        (only, n), = counts.items()
        all_runs = f"all {n} run{'' if n == 1 else 's'}"
        return f"Environment: not recorded ({all_runs})." if only == NOT_RECORDED else f"Environment: {only} ({all_runs})."
    parts = [f"{n} run{'' if n == 1 else 's'}{':' if text == NOT_RECORDED else ' on'} {text}"
             for text, n in sorted(counts.items(), key=lambda item: (item[0] == NOT_RECORDED, -item[1], item[0]))]
    return f"Environments: {'; '.join(parts)}."
