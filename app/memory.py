"""Memory of a long-running server process: glibc malloc settings and the process's RSS.

A server that allocates and frees large activation tensors from many threads grows
under glibc's defaults even when what it keeps is bounded: every thread may get its own
malloc arena, and the mmap threshold *rises* each time a large block is freed (up to
32 MiB), so later large tensors land in the heap, where freed space is rarely given back.
``tune_malloc`` fixes the threshold (blocks of at least ``mmap_threshold`` bytes are
mapped and unmapped, so freeing a tensor returns its memory) and caps the arenas.
Measured with ``bench/load.py``; see BENCHMARKS.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from pathlib import Path

log = logging.getLogger(__name__)

# mallopt parameters, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def tune_malloc(mmap_threshold: int = 16 << 10, arena_max: int = 2) -> bool:
    """Apply the settings to this process; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        log.info("malloc settings left as they are: %s is not glibc", name)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = all(mallopt(param, value) == 1 for param, value in (
        (M_MMAP_THRESHOLD, mmap_threshold),
        (M_TRIM_THRESHOLD, 2 * mmap_threshold),
        (M_ARENA_MAX, arena_max),
    ))
    log.info("malloc: mmap threshold %d B, trim threshold %d B, at most %d arenas%s",
             mmap_threshold, 2 * mmap_threshold, arena_max, "" if ok else " (not all accepted)")
    return ok


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident set size of a process (this one by default; Linux), or None where /proc is not there."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
