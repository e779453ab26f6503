"""omicsprep: single-cell preprocessing on GPUs (RAPIDS) and CPUs (scanpy), as a Snakemake workflow.

Subpackages by stage: :mod:`~omicsprep.reads` (molecules, UMI deduplication, counting),
:mod:`~omicsprep.rna`, :mod:`~omicsprep.atac`, :mod:`~omicsprep.protein`,
:mod:`~omicsprep.network` and :mod:`~omicsprep.multiome`. Analysis functions take and modify
AnnData and do no file I/O; count matrices, fragments and outputs are read and written
atomically by :mod:`~omicsprep.io`, while :mod:`~omicsprep.reads.molecules` streams
BAM/SAM files and molecule tables as they are counted. :mod:`~omicsprep.backend` imports
the RAPIDS libraries, lazily; the CUDA UMI kernel (:mod:`~omicsprep.reads.umi_cuda`)
imports Numba's CUDA module, only on the GPU path.
"""

__version__ = "0.1.0"
