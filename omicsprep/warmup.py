"""Compiling a machine's kernels once, before its first run (``omicsprep warm-kernels``).

Kernels compile on first use and are cached on disk: CuPy's (rapids-singlecell's and
omicsprep's element-wise and raw kernels; ``CUPY_CACHE_DIR``, by default
``~/.cupy/kernel_cache``), Numba's (``NUMBA_CACHE_DIR``, by default beside each module) and
the CUDA driver's (``CUDA_CACHE_PATH``, by default ``~/.nv/ComputeCache``). A fresh machine's
first GPU run otherwise spends about 35 s compiling in qc and cluster, several times their
computing on a sample of 5,000 cells. Running the two steps once on a small generated sample,
as a setup step, compiles what later runs load (after :mod:`omicsprep.kernels` compiled the
kernels it knows of in parallel processes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from scipy import sparse

if TYPE_CHECKING:
    from anndata import AnnData

    from omicsprep.backend import Backend

# Names matching the default QC gene groups (mitochondrial, ribosomal, haemoglobin), so that
# every metric is computed as on a real sample.
GROUP_GENES = ("MT-CO1", "MT-ND1", "MT-ATP6", "RPS3", "RPL7", "HBB")


def generated_counts(*, n_cells: int, n_genes: int, n_types: int = 6, seed: int = 0) -> AnnData:
    """A small sample of ``n_types`` cell types, as :func:`omicsprep.io.read_counts` returns counts.

    Each type expresses 20 marker genes 10 times above the others' level; library sizes
    vary 4-fold. Float32 counts in a CSR matrix with 32-bit indices, like a read matrix.

    Parameters
    ----------
    n_cells, n_genes
        Its size (``n_genes`` at least ``6 + 20 * n_types``).
    n_types
        Cell types.
    seed
        Seed of the random counts.
    """
    import anndata as ad

    rng = np.random.default_rng(seed)
    base = rng.lognormal(mean=-2.0, sigma=1.5, size=n_genes)
    types = rng.integers(n_types, size=n_cells)
    means = np.tile(base, (n_types, 1))
    for kind in range(n_types):
        markers = len(GROUP_GENES) + kind * 20 + np.arange(20)
        means[kind, markers] = 10 * base[markers] + 0.5
    size = rng.uniform(0.5, 2.0, size=n_cells)[:, None]
    counts = sparse.csr_matrix(rng.poisson(means[types] * size).astype(np.float32))
    counts.indices = counts.indices.astype(np.int32)
    counts.indptr = counts.indptr.astype(np.int32)
    genes = [*GROUP_GENES, *(f"GENE{index}" for index in range(len(GROUP_GENES), n_genes))]
    return ad.AnnData(
        counts,
        obs=pd.DataFrame(index=[f"CELL{index}-1" for index in range(n_cells)]),
        var=pd.DataFrame(index=genes),
    )


def warm_kernels(config: dict[str, Any], *, backend: Backend, n_cells: int = 4000, n_genes: int = 3000) -> None:
    """Run qc and cluster in one process on a generated sample, the cells kept on the device; the results are dropped.

    Parameters
    ----------
    config
        The workflow's configuration, validated (with its defaults): the steps' settings,
        whose kernels are compiled.
    backend
        ``"cpu"`` (Numba's kernels) or ``"gpu"``.
    n_cells, n_genes
        The generated sample's size.
    """
    from omicsprep.options import ClusteringOptions, DoubletOptions, QcOptions, from_config, from_sections
    from omicsprep.rna.pipeline import run_clustering, run_qc

    adata = generated_counts(n_cells=n_cells, n_genes=n_genes, seed=config["seed"])
    adata, _ = run_qc(
        adata,
        options=from_config(QcOptions, config["qc"]),
        doublet_options=from_config(DoubletOptions, config["doublets"]),
        seed=config["seed"],
        backend=backend,
        keep_on_device=True,
    )
    run_clustering(adata, options=from_sections(ClusteringOptions, config), seed=config["seed"], backend=backend)
