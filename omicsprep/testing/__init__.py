"""Generated data with planted truth, for the tests and the benchmarks.

:mod:`~omicsprep.testing.generate` draws counts, raw droplets, reads and fragments;
:mod:`~omicsprep.testing.generate_fastq` a genome, its annotation and FASTQ reads. Both are
deterministic from a seed and can be run as commands (``python -m omicsprep.testing.generate``).
"""
