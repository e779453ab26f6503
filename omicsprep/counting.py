"""From reads to a cell x gene count matrix: UMI deduplication of a BAM/SAM file."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from anndata import AnnData
from scipy import sparse

from omicsprep.errors import InputError
from omicsprep.molecules import ReadTable, UmiSource, read_bam
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
    summary = {"method": method, "edit_distance_threshold": edit_distance_threshold, "reads_used": len(table.reads)}
    return _to_anndata([_named(counts, table)], summary=summary, skipped=table.skipped)


def _named(counts: pd.DataFrame, table: ReadTable) -> pd.DataFrame:
    """Counts with cell and gene names instead of codes."""
    return pd.DataFrame(
        {"cell": table.cells[counts["cell"]], "gene": table.genes[counts["gene"]], "count": counts["count"].to_numpy()}
    )


def _to_anndata(pieces: list[pd.DataFrame], *, summary: dict[str, Any], skipped: Counter) -> AnnData:
    """Cells x genes counts from named (cell, gene, count) pieces, with the run's summary."""
    long = pd.concat(pieces, ignore_index=True)
    cell_codes, cells = pd.factorize(long["cell"])
    gene_codes, genes = pd.factorize(long["gene"])
    matrix = sparse.csr_matrix(
        (long["count"].to_numpy(np.float32), (cell_codes, gene_codes)), shape=(len(cells), len(genes))
    )
    adata = AnnData(
        matrix, obs=pd.DataFrame(index=pd.Index(cells, dtype=str)), var=pd.DataFrame(index=pd.Index(genes, dtype=str))
    )
    adata.uns["umi_dedup"] = {**summary, "reads_skipped": {reason: int(n) for reason, n in skipped.items()}}
    return adata


def long_table(adata: AnnData) -> pd.DataFrame:
    """The non-zero counts as ``gene``, ``cell``, ``count`` rows, as ``umi_tools count`` writes."""
    coo = sparse.coo_matrix(adata.X)
    table = pd.DataFrame(
        {"gene": adata.var_names[coo.col], "cell": adata.obs_names[coo.row], "count": coo.data.astype(np.int64)}
    )
    return table.sort_values(["gene", "cell"], ignore_index=True)


def _partition_of(cells: pa.Array, n_partitions: int) -> np.ndarray:
    """A stable partition per cell, so each cell's molecules are deduplicated together."""
    hashed = pd.util.hash_array(np.asarray(cells.to_numpy(zero_copy_only=False), dtype=object))
    return (hashed % np.uint64(n_partitions)).astype(np.int64)


def count_umis_from_table(
    path: str | Path,
    *,
    method: Method = "directional",
    edit_distance_threshold: int = 1,
    cell_column: str = "cell",
    umi_column: str = "umi",
    gene_column: str = "gene",
    count_column: str | None = None,
    skip_gene_regex: str = "^(__|Unassigned)",
    chunk_rows: int = 5_000_000,
    spill_dir: str | Path | None = None,
) -> AnnData:
    """Deduplicated UMI counts of a molecule table, in memory bounded by ``chunk_rows``.

    The table is streamed in chunks; usable rows are spilled to Parquet partitions by
    cell (about ``chunk_rows`` rows each), and each partition is deduplicated on its own,
    so peak memory follows the chunk size, not the input size.

    Parameters
    ----------
    path
        Parquet, CSV or TSV (gzipped or not) with one row per read, or per UMI with a
        read-count column.
    method, edit_distance_threshold, skip_gene_regex
        As in :func:`count_umis`.
    cell_column, umi_column, gene_column, count_column
        Column names; ``count_column`` (reads per row) is optional.
    chunk_rows
        Rows read at a time, and rows per partition.
    spill_dir
        Where partitions are spilled (a temporary folder inside it); the system's
        temporary folder when ``None``.

    Returns
    -------
    Counts as in :func:`count_umis`.
    """
    import tempfile

    import pyarrow.parquet as pq

    from omicsprep.molecules import _encode, _usable, molecule_table_batches, molecule_table_rows

    columns = [cell_column, umi_column, gene_column] + ([count_column] if count_column else [])
    path = Path(path)
    skipped: Counter = Counter()
    n_partitions = max(1, int(np.ceil(molecule_table_rows(path, column=cell_column) / chunk_rows)))
    with tempfile.TemporaryDirectory(dir=spill_dir, prefix="omicsprep-umi-") as tmp:
        writers: dict[int, pq.ParquetWriter] = {}
        for batch in molecule_table_batches(path, columns=columns, chunk_rows=chunk_rows):
            cell, umi, gene = (batch.column(c).cast(pa.string()) for c in columns[:3])
            usable = _usable(gene, cell, umi, skipped=skipped, skip_gene_regex=skip_gene_regex)
            kept = pa.table({"cell": cell, "umi": umi, "gene": gene, **(
                {"reads": batch.column(count_column).cast(pa.int64())} if count_column else {})}).filter(usable)
            partition = _partition_of(kept.column("cell").combine_chunks(), n_partitions)
            for part in np.unique(partition):
                rows = kept.filter(pa.array(partition == part))
                if part not in writers:
                    writers[part] = pq.ParquetWriter(Path(tmp) / f"part-{part}.parquet", rows.schema)
                writers[part].write_table(rows)
        for writer in writers.values():
            writer.close()
        if not writers:
            raise InputError(f"no usable row (skipped: {dict(skipped) or 'none'})", path=path)
        pieces = []
        for part_path in sorted(Path(tmp).glob("part-*.parquet")):
            part = pq.read_table(part_path)
            table = _encode({name: part.column(name).combine_chunks() for name in ("cell", "umi", "gene")},
                            skipped=skipped, path=path,
                            reads=part.column("reads").combine_chunks() if count_column else None)
            counts = count_molecules(collapse_reads(table.reads), method=method, threshold=edit_distance_threshold)
            pieces.append(_named(counts, table))
    summary = {"method": method, "edit_distance_threshold": edit_distance_threshold, "partitions": len(pieces)}
    return _to_anndata(pieces, summary=summary, skipped=skipped)


COMMON_SETTINGS = ("method", "edit_distance_threshold", "skip_gene_regex")
BAM_SETTINGS = ("cell_tag", "umi_tag", "gene_tag", "umi_source", "min_mapq")
TABLE_SETTINGS = ("cell_column", "umi_column", "gene_column", "count_column", "chunk_rows")


def count_umis_of(path: str | Path, *, fmt: str, settings: Mapping[str, Any]) -> AnnData:
    """Count a BAM/SAM file (``fmt`` ``bam``/``sam``) or a molecule table (``molecules``).

    ``settings`` holds the keyword arguments of :func:`count_umis` and
    :func:`count_umis_from_table`; each takes the ones it knows.
    """
    if fmt == "molecules":
        keys = COMMON_SETTINGS + TABLE_SETTINGS
        return count_umis_from_table(path, **{k: v for k, v in settings.items() if k in keys})
    keys = COMMON_SETTINGS + BAM_SETTINGS
    return count_umis(path, **{k: v for k, v in settings.items() if k in keys})
