"""glibc's allocator, told to keep what the passes free (Linux with glibc; elsewhere nothing).

By default glibc serves an allocation over a dynamic threshold (128 KiB at first) with its own
mmap and returns freed heap tops to the kernel past M_TRIM_THRESHOLD. A training step frees and
reallocates the same activation- and gradient-sized buffers every step, so the pages went back
and were faulted in again: 2,300-5,300 minor faults a step on the default model at 16 rows, and
3-11% more CPU a step than with freed memory kept (this box, one thread, 60 steps each way). A
worker's memory peaks at its first steps anyway, so it keeps it: everything comes from the heap
and nothing is trimmed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("p2ptrain.worker")

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# only larger blocks get their own mmap; glibc builds that cap the threshold at 32 MiB (half
# their heap's largest size) refuse more, and get that
MMAP_THRESHOLDS_BYTES = (1 << 30, 32 << 20)
TRIM_THRESHOLD_BYTES = 1 << 31


def keep_freed_memory() -> bool:
    """Serve blocks up to 1 GiB (or 32 MiB) from the heap and never trim it; False where the
    C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its own allocator stays
        return False
    done = any(mallopt(M_MMAP_THRESHOLD, size) == 1 for size in MMAP_THRESHOLDS_BYTES)
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and done
    if not done:
        log.info("the C library refused mallopt: its allocator's defaults stay")
    return done
