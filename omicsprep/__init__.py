"""omicsprep: single-cell preprocessing on GPUs (RAPIDS) and CPUs (scanpy), as a Snakemake workflow.

Analysis modules (:mod:`~omicsprep.rna.qc`, :mod:`~omicsprep.rna.preprocessing`,
:mod:`~omicsprep.rna.clustering`) take and modify AnnData and do no file I/O; reading and
atomic writing live in :mod:`~omicsprep.io`; the only module importing GPU libraries is
:mod:`~omicsprep.backend`.
"""

__version__ = "0.1.0"
