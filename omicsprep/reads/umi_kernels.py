"""UMI-tools' counting methods as one Numba source, compiled for the CPU and for CUDA.

:func:`build` takes a decorator (``numba.njit`` or ``numba.cuda.jit(device=True)``) and
returns ``count_group`` compiled with it, so both backends run the same code and count
identically. Nothing here allocates: a group of molecules (one cell and gene) spans
``lo:hi`` of the molecule arrays and works in the same slice of caller-provided scratch
arrays, which is what a CUDA thread needs and also keeps the CPU kernel free of
per-group allocations.

Within a group, molecules are sorted by read count (descending), ties by UMI sequence, as
UMI-tools 1.1 ranks them; ``umis`` are 2-bit packed, so a Hamming distance is a popcount.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

UNIQUE, PERCENTILE, CLUSTER, ADJACENCY, DIRECTIONAL = range(5)  # indexes of umi.METHODS
_EVEN_BITS = np.uint64(0x5555555555555555)


def build(jit: Callable) -> Callable:
    """The kernel ``count_group``, compiled with ``jit``.

    ``count_group(umis, counts, lo, hi, method, threshold, component, stack, mark, covered) -> molecules``.
    Scratch arrays (length of ``umis``): ``component``, ``stack`` and ``mark`` int32,
    ``covered`` uint8.
    """

    @jit
    def popcount(x):
        n = 0
        while x:
            x &= x - np.uint64(1)
            n += 1
        return n

    @jit
    def hamming(a, b):
        diff = a ^ b
        return popcount((diff | (diff >> np.uint64(1))) & _EVEN_BITS)

    @jit
    def components(umis, counts, lo, n, threshold, directional, component, stack, mark):
        """Component of every UMI, from searches started in count order (UMI-tools').

        A search may pass through UMIs found by earlier ones (UMI-tools' does), but only
        unfound UMIs start a component and a UMI keeps its first component. ``mark[j] ==
        start + 1`` says that the search from ``start`` has reached ``j``.
        """
        for i in range(n):
            component[lo + i] = -1
            mark[lo + i] = 0
        n_components = 0
        for start in range(n):
            if component[lo + start] >= 0:
                continue
            component[lo + start] = n_components
            mark[lo + start] = start + 1
            stack[lo] = start
            top = 1
            while top:
                top -= 1
                node = stack[lo + top]
                for other in range(n):
                    if mark[lo + other] == start + 1:
                        continue
                    if hamming(umis[lo + node], umis[lo + other]) > threshold:
                        continue
                    if directional and counts[lo + node] < 2 * counts[lo + other] - 1:
                        continue
                    mark[lo + other] = start + 1
                    if component[lo + other] < 0:
                        component[lo + other] = n_components
                    stack[lo + top] = other
                    top += 1
            n_components += 1
        return n_components

    @jit
    def min_account(umis, lo, members, m_lo, m_hi, threshold, covered):
        """Fewest top UMIs of one component whose neighbourhoods cover it (adjacency).

        ``members[m_lo:m_hi]`` are the component's UMIs (group-local), in count order.
        """
        size = m_hi - m_lo
        for k in range(m_lo, m_hi):
            covered[lo + k] = 0
        n_covered = 0
        for i in range(m_lo, m_hi):
            for j in range(m_lo, m_hi):
                if covered[lo + j]:
                    continue
                if i == j or hamming(umis[lo + members[lo + i]], umis[lo + members[lo + j]]) <= threshold:
                    covered[lo + j] = 1
                    n_covered += 1
            if n_covered == size:
                return i - m_lo + 1
        return size

    @jit
    def adjacency_count(umis, lo, n, n_components, threshold, component, members, ends, covered):
        """Sum of :func:`min_account` over components, members bucketed by component."""
        # Counting sort of the UMIs by component (stable: count order kept in each).
        for c in range(n_components):
            ends[lo + c] = 0
        for i in range(n):
            ends[lo + component[lo + i]] += 1
        total = 0
        for c in range(n_components):
            total += ends[lo + c]
            ends[lo + c] = total - ends[lo + c]  # start of component c, for now
        for i in range(n):
            c = component[lo + i]
            members[lo + ends[lo + c]] = i
            ends[lo + c] += 1  # ends up as the end of component c
        molecules = 0
        for c in range(n_components):
            m_lo = 0 if c == 0 else ends[lo + c - 1]
            molecules += min_account(umis, lo, members, m_lo, ends[lo + c], threshold, covered)
        return molecules

    @jit
    def count_group(umis, counts, lo, hi, method, threshold, component, stack, mark, covered):
        n = hi - lo
        if method == UNIQUE or n == 1:
            return n
        if method == PERCENTILE:  # UMIs above 1% of the median count (counts sorted)
            half = n // 2
            median = counts[lo + half] if n % 2 else (counts[lo + half - 1] + counts[lo + half]) / 2.0
            kept = 0
            while kept < n and counts[lo + kept] > median / 100.0:
                kept += 1
            return kept
        n_components = components(umis, counts, lo, n, threshold, method == DIRECTIONAL, component, stack, mark)
        if method != ADJACENCY:  # cluster, directional: a molecule per component
            return n_components
        # The searches are over: stack and mark are free to hold members and bounds.
        return adjacency_count(umis, lo, n, n_components, threshold, component, stack, mark, covered)

    return count_group
