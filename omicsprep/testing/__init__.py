"""Generated data with planted truth, for the tests and the benchmarks.

:mod:`~omicsprep.testing.generate` draws counts (clusters, doublets, damaged cells; planted
co-expression modules) and writes them as 10x HDF5; :mod:`~omicsprep.testing.genes` names the
genes of all of them; :mod:`~omicsprep.testing.reads` draws aligned reads (and writes BAMs);
:mod:`~omicsprep.testing.droplets` raw droplets with their truth, and reads that count back to
them; :mod:`~omicsprep.testing.fragments` ATAC fragments; :mod:`~omicsprep.testing.generate_fastq`
a genome, its annotation and FASTQ reads; :mod:`~omicsprep.testing.study` a study of batches.
All are deterministic from a seed; ``generate`` and ``generate_fastq`` can be run as commands
(``python -m omicsprep.testing.generate``).
:func:`snakemake_command` runs the checkout's workflow, as the tests and benchmarks do.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # the source tree: the workflow's files are not in the package


def snakemake_command(*args: str) -> list[str]:
    """The command that runs Snakemake, in this Python, on the checkout's Snakefile with ``args``."""
    return [sys.executable, "-m", "snakemake", "-s", str(CHECKOUT / "Snakefile"), *args]
