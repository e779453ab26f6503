"""Reading STARsolo's outputs: the raw count matrix and its summaries.

omicsprep's :func:`~omicsprep.io.counts.read_counts` cannot read STARsolo's ``raw`` folder:
STARsolo writes ``features.tsv`` (three columns, as Cell Ranger 3) uncompressed, and
scanpy's reader then looks for ``matrix.mtx.gz``. :func:`read_solo_matrix` reads it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import io as scipy_io
from scipy import sparse

from omicsprep.errors import InputError, existing_file
from omicsprep.timings import timed_phase


@timed_phase("read")
def read_solo_summary(path: str | Path) -> pd.Series:
    """``Solo.out/<feature>/Summary.csv``: statistic -> value (fractions as floats).

    Values STAR writes as words (``NoMulti`` when multi-gene reads were not counted) are
    NaN.
    """
    path = existing_file(path)
    table = pd.read_csv(path, header=None, names=["statistic", "value"], index_col=0)
    return pd.to_numeric(table["value"], errors="coerce").rename(path.parent.name)


@timed_phase("read")
def read_barcode_stats(path: str | Path) -> pd.Series:
    """``Solo.out/Barcodes.stats``: reads per barcode outcome (``yesWLmatchExact``, ``noNoWLmatch`` ...)."""
    path = existing_file(path)
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    malformed = [row for row in rows if len(row) != 2 or not row[1].isdigit()]
    if malformed:
        raise InputError(f"not a STARsolo Barcodes.stats file (line {' '.join(malformed[0])!r})", path=path)
    return pd.Series({name: int(count) for name, count in rows}, name="reads", dtype=np.int64)


@timed_phase("read")
def read_solo_matrix(folder: str | Path) -> AnnData:
    """A STARsolo matrix folder (``Solo.out/Gene/raw``, ``Solo.out/GeneFull/raw`` ...) as cells x genes.

    Returns
    -------
    Counts in ``X`` (CSR, float32, like :func:`omicsprep.reads.counting.count_umis`);
    ``var_names`` are gene symbols made unique (as :func:`~omicsprep.io.counts.read_counts`
    names genes), ``var["gene_ids"]`` the GTF's gene_id, ``var["feature_types"]``.

    Raises
    ------
    InputError
        A missing file, or a matrix whose shape disagrees with its barcode and feature lists.
    """
    folder = Path(folder)
    matrix_path, barcodes_path = (existing_file(folder / name) for name in ("matrix.mtx", "barcodes.tsv"))
    features = read_solo_features(folder / "features.tsv")
    barcodes = pd.read_csv(barcodes_path, sep="\t", header=None, dtype=str)[0]
    counts = sparse.csr_matrix(scipy_io.mmread(matrix_path).T, dtype=np.float32)
    if counts.shape != (len(barcodes), len(features)):
        raise InputError(
            f"matrix is {counts.shape[1]} features x {counts.shape[0]} barcodes, but features.tsv lists "
            f"{len(features)} and barcodes.tsv {len(barcodes)}",
            path=matrix_path,
        )
    var = pd.DataFrame(
        {"gene_ids": features.index.to_numpy(), "feature_types": features["feature_types"].to_numpy()},
        index=pd.Index(features["name"].to_numpy()),
    )
    adata = AnnData(counts, obs=pd.DataFrame(index=pd.Index(barcodes.to_numpy())), var=var)
    adata.var_names_make_unique()
    return adata


@timed_phase("read")
def read_solo_features(path: str | Path) -> pd.DataFrame:
    """A STARsolo ``features.tsv``: ``name`` and ``feature_types`` by gene ID.

    The gene ID is the GTF's gene_id, which STAR's ``GX`` tags carry; a missing name or type
    is the ID or ``Gene Expression``.
    """
    features = pd.read_csv(existing_file(path), sep="\t", header=None, dtype=str)
    return pd.DataFrame(
        {
            "name": (features[1] if features.shape[1] > 1 else features[0]).to_numpy(),
            "feature_types": features[2].to_numpy() if features.shape[1] > 2 else "Gene Expression",
        },
        index=pd.Index(features[0].to_numpy(), name="gene_ids"),
    )
