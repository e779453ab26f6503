"""Rule protein as one chain: antibody QC, CLR or dsb, PCA, neighbours, UMAP and Leiden."""

from __future__ import annotations

import logging
from dataclasses import asdict

from anndata import AnnData

from omicsprep.backend import Backend, to_device, to_host
from omicsprep.errors import InputError
from omicsprep.options import (
    EmbeddingOptions,
    ProteinOptions,
)
from omicsprep.protein import normalization
from omicsprep.provenance import StepTimer, record_provenance
from omicsprep.rna import preprocessing
from omicsprep.rna.embedding import embed_and_cluster

log = logging.getLogger(__name__)


def run_protein(
    adata: AnnData,
    *,
    empty: AnnData | None,
    options: ProteinOptions,
    embedding_options: EmbeddingOptions,
    seed: int,
    backend: Backend,
) -> None:
    """Antibody tags (CITE-seq): QC metrics, CLR or dsb, PCA, neighbours, UMAP and Leiden.

    Parameters
    ----------
    adata
        Cells x antibodies, raw counts; normalized in place (counts kept in a layer).
    empty
        Empty droplets x antibodies, raw counts (dsb's background), or ``None``.
    options
        ``normalization`` (``auto``: dsb when empty droplets are given, else CLR),
        ``isotype_pattern``, ``dsb`` and ``n_comps``.
    embedding_options
        Neighbours, UMAP and Leiden of the tags' PCs.
    seed
        Seed for PCA, UMAP and Leiden.
    backend
        ``"cpu"`` or ``"gpu"``.

    Raises
    ------
    InputError
        dsb asked for without empty droplets, or its denoising without isotype controls.
    """
    timer = StepTimer(backend=backend)
    isotypes = normalization.isotype_controls(adata, pattern=options.isotype_pattern)
    method = options.normalization
    if method == "auto":
        method = "dsb" if empty is not None else "clr"
    with timer.step("normalize"):
        normalization.protein_qc(adata, isotypes=isotypes)
        if method == "clr":
            normalization.clr(adata, backend=backend)
        elif empty is None:
            raise InputError("protein.normalization is dsb, which needs empty droplets (sample sheet column adt_empty)")
        elif options.dsb.denoise and not isotypes:
            raise InputError(
                f"dsb's denoising asks for isotype controls, and none of the {adata.n_vars} antibodies "
                f"matches protein.isotype_pattern {options.isotype_pattern!r}"
            )
        else:
            normalization.dsb(
                adata,
                empty=empty,
                isotypes=isotypes,
                pseudocount=options.dsb.pseudocount,
                denoise=options.dsb.denoise,
                backend=backend,
            )
    adata.var["isotype_control"] = adata.var_names.isin(isotypes)
    adata.var["highly_variable"] = ~adata.var["isotype_control"]  # the PCA leaves isotypes out
    with timer.step("to_device"):
        to_device(adata, backend=backend)
    with timer.step("pca"):
        preprocessing.pca(adata, n_comps=options.n_comps, seed=seed, backend=backend)
    embed_and_cluster(adata, use_rep="X_pca", options=embedding_options, seed=seed, backend=backend, timer=timer)
    with timer.step("to_host"):
        to_host(adata)
    record_provenance(
        adata,
        rule="protein",
        backend=backend,
        params={**asdict(options), "normalization": method, "seed": seed},
        timings=timer.seconds,
    )
