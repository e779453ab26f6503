"""Rule multiome as one chain: the modalities' shared cells, WNN, joint UMAP and Leiden."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING

import pandas as pd
from anndata import AnnData

from omicsprep.backend import Backend, to_host
from omicsprep.multiome import wnn
from omicsprep.options import (
    EmbeddingOptions,
    MultiomeOptions,
)
from omicsprep.provenance import StepTimer, record_provenance
from omicsprep.rna.embedding import umap_and_leiden

if TYPE_CHECKING:
    from mudata import MuData

log = logging.getLogger(__name__)


EMBEDDINGS = {"rna": "X_pca", "protein": "X_pca", "atac": "X_lsi"}


def run_multiome(
    modalities: Mapping[str, AnnData],
    *,
    options: MultiomeOptions,
    embedding_options: EmbeddingOptions,
    seed: int,
    backend: Backend,
) -> MuData:
    """Modalities joined by barcode, with a joint graph, UMAP and clusters.

    Weighted nearest neighbours, a joint UMAP and joint Leiden clusters.

    Parameters
    ----------
    modalities
        Two or more of ``rna`` (with ``obsm["X_pca"]``), ``protein`` (``X_pca``) and
        ``atac`` (``X_lsi``), each already processed by its own rule.
    options
        ``min_overlap`` and ``wnn`` (``n_neighbors``, ``n_bandwidth_neighbors``,
        ``n_candidates``).
    embedding_options
        ``neighbors.n_pcs`` (the RNA PCs used), ``umap`` and ``leiden``.
    seed
        Seed for UMAP and Leiden.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    The MuData: per-modality results in its modalities; the joint graph, ``X_umap``,
    ``obs["wnn_leiden_<resolution>"]`` and ``obs["<modality>:mod_weight"]`` at the top.

    Raises
    ------
    InputError
        The modalities share too few cells (``min_overlap``).
    """
    timer = StepTimer(backend=backend)
    mdata, _ = wnn.join_modalities(dict(modalities), min_overlap=options.min_overlap)
    with timer.step("wnn"):
        wnn.weighted_nearest_neighbors(
            mdata,
            representations={name: EMBEDDINGS[name] for name in mdata.mod},
            n_dims={"rna": embedding_options.neighbors.n_pcs},
            n_neighbors=options.wnn.n_neighbors,
            n_bandwidth_neighbors=options.wnn.n_bandwidth_neighbors,
            n_candidates=options.wnn.n_candidates,
            backend=backend,
        )
    joint = AnnData(
        obs=pd.DataFrame(index=mdata.obs_names),
        obsm={"X_wnn_input": mdata.obsm["X_wnn_input"]},
        obsp={key: mdata.obsp[key] for key in ("connectivities", "distances")},
        uns={"neighbors": mdata.uns["neighbors"]},
    )
    umap_and_leiden(
        joint, umap=embedding_options.umap, leiden=embedding_options.leiden, seed=seed, backend=backend, timer=timer
    )
    to_host(joint)
    mdata.obsm["X_umap"] = joint.obsm["X_umap"]
    for key in joint.obs:
        mdata.obs[f"wnn_{key}"] = joint.obs[key].array  # categories kept: plotted as clusters
    params = {**asdict(options), "seed": seed}
    record_provenance(mdata, rule="multiome", backend=backend, params=params, timings=timer.seconds)
    return mdata
