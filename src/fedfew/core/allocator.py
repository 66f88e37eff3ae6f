"""Large blocks kept by the process instead of returned to the OS at every free (glibc only).

A Conv4 episode of 60 classes allocates activations of ~70 MB, over glibc's mmap threshold (at most 32
MB with its dynamic adjustment): every such block is mmap-ed, faulted in page by page and unmapped again
at its free, thousands of times a run. On a 2-core AMD EPYC that was a third of a centralised ProtoNet
run's time as system time (13.4 of 29.4 CPU seconds for 30 episodes; 2.5 with the threshold raised).
Raising the threshold keeps such blocks in the heap for reuse; memory is the same or lower at the peak
and no number changes (the allocator never touches values). Worker processes are forked after the call
and inherit it."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: glibc's mallopt parameter number (malloc.h) and the largest value it takes (an int).
M_MMAP_THRESHOLD = -3
THRESHOLD = 2**31 - 1
#: Set to 0 to keep glibc's own behaviour (for a comparison).
ENVIRONMENT = "FEDFEW_KEEP_LARGE_BLOCKS"


def keep_large_blocks() -> bool:
    """Raise glibc's mmap threshold for this process (and the processes it forks after this call); False
    where it does not apply (not glibc, or turned off by ``FEDFEW_KEEP_LARGE_BLOCKS=0``, or the user's own
    ``MALLOC_MMAP_THRESHOLD_``, which wins)."""
    if os.environ.get(ENVIRONMENT, "1") == "0" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, macOS: no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD))
