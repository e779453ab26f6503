"""BGZF, the block gzip of BAM files: where each block's deflate data lies, and the end-of-file block.

A BGZF file is a series of gzip members of at most 64 KiB inflated each, whose ``BC`` extra
field gives the block's size; a whole file ends with an empty block (:data:`BGZF_EOF`).
"""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np

from omicsprep.jit_cache import track_sources

track_sources()  # before the functions below are compiled and cached (cache=True)

BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")
MAX_BLOCK_BYTES = 1 << 16  # inflated, of one BGZF block


@numba.njit(cache=True, nogil=True)
def bgzf_blocks(raw):
    """Deflate data start, end and inflated size of every whole BGZF block in ``raw``.

    Returns those, the bytes they span and the offset of a malformed header (-1: none).
    """
    n_max = raw.size // 26 + 1
    starts = np.empty(n_max, np.int64)
    ends = np.empty(n_max, np.int64)
    sizes = np.empty(n_max, np.int64)
    n, at = 0, 0
    while at + 18 <= raw.size:
        if raw[at] != 31 or raw[at + 1] != 139 or raw[at + 2] != 8 or not (raw[at + 3] & 4):
            return starts[:n], ends[:n], sizes[:n], at, at
        extra = raw[at + 10] | (np.int64(raw[at + 11]) << 8)
        block_size, field = -1, at + 12
        while field + 4 <= at + 12 + extra:
            field_length = raw[field + 2] | (np.int64(raw[field + 3]) << 8)
            if raw[field] == 66 and raw[field + 1] == 67 and field_length == 2:
                block_size = (raw[field + 4] | (np.int64(raw[field + 5]) << 8)) + 1
            field += 4 + field_length
        if block_size < 12 + extra + 8:
            return starts[:n], ends[:n], sizes[:n], at, at
        if at + block_size > raw.size:
            break
        end = at + block_size
        starts[n], ends[n] = at + 12 + extra, end - 8
        sizes[n] = (
            raw[end - 4]
            | (np.int64(raw[end - 3]) << 8)
            | (np.int64(raw[end - 2]) << 16)
            | (np.int64(raw[end - 1]) << 24)
        )
        if sizes[n] > 1 << 16:  # more than a block holds
            return starts[:n], ends[:n], sizes[:n], at, at
        n += 1
        at = end
    return starts[:n], ends[:n], sizes[:n], at, -1


def bgzf_eof_present(path: Path) -> bool:
    """Whether ``path`` ends with BGZF's end-of-file block (a BAM without it is truncated)."""
    with path.open("rb") as handle:
        handle.seek(max(path.stat().st_size - len(BGZF_EOF), 0))
        return handle.read() == BGZF_EOF
