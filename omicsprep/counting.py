"""From reads to a cell x gene count matrix: UMI deduplication of a BAM/SAM file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.molecules import UmiSource, read_bam
from omicsprep.umi import Method, collapse_reads, count_molecules


def count_umis(
    path: str | Path,
    *,
    method: Method = "directional",
    edit_distance_threshold: int = 1,
    cell_tag: str = "CB",
    umi_tag: str = "UB",
    gene_tag: str = "GX",
    umi_source: UmiSource = "tag",
    min_mapq: int = 0,
    skip_gene_regex: str = "^(__|Unassigned)",
) -> AnnData:
    """Deduplicated UMI counts of the reads of a BAM/SAM file, cells x genes.

    Parameters
    ----------
    path
        Aligned reads with cell, UMI and gene annotations (any sort order).
    method
        UMI-tools' method: ``unique``, ``percentile``, ``cluster``, ``adjacency`` or
        ``directional``.
    edit_distance_threshold
        Largest Hamming distance between UMIs of one molecule.
    cell_tag, umi_tag, gene_tag
        Tags holding the cell barcode, UMI and gene (e.g. ``CB``/``UB``/``GX`` of Cell
        Ranger and STARsolo, ``XC``/``XM``/``GE`` of Drop-seq).
    umi_source
        ``tag``, or the read name (``read_id``: umi_tools extract; ``umis``).
    min_mapq
        Reads with a lower mapping quality are skipped.
    skip_gene_regex
        Reads whose gene matches are skipped.

    Returns
    -------
    Counts in ``X`` (CSR, float32); ``uns["umi_dedup"]`` holds the method, the reads used
    and the skipped reads by reason.
    """
    table = read_bam(
        path, cell_tag=cell_tag, umi_tag=umi_tag, gene_tag=gene_tag, umi_source=umi_source,
        min_mapq=min_mapq, skip_gene_regex=skip_gene_regex,
    )
    counts = count_molecules(collapse_reads(table.reads), method=method, threshold=edit_distance_threshold)
    matrix = sparse.csr_matrix(
        (counts["count"].to_numpy(np.float32), (counts["cell"].to_numpy(), counts["gene"].to_numpy())),
        shape=(len(table.cells), len(table.genes)),
    )
    adata = AnnData(
        matrix, obs=pd.DataFrame(index=table.cells.astype(str)), var=pd.DataFrame(index=table.genes.astype(str))
    )
    adata.uns["umi_dedup"] = {
        "method": method,
        "edit_distance_threshold": edit_distance_threshold,
        "reads_used": len(table.reads),
        "reads_skipped": {reason: int(n) for reason, n in table.skipped.items()},
    }
    return adata


def long_table(adata: AnnData) -> pd.DataFrame:
    """The non-zero counts as ``gene``, ``cell``, ``count`` rows, as ``umi_tools count`` writes."""
    coo = sparse.coo_matrix(adata.X)
    table = pd.DataFrame(
        {"gene": adata.var_names[coo.col], "cell": adata.obs_names[coo.row], "count": coo.data.astype(np.int64)}
    )
    return table.sort_values(["gene", "cell"], ignore_index=True)
