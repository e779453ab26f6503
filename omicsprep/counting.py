"""From reads to a cell x gene count matrix, in memory bounded by a chunk size.

Usable reads are streamed from a BAM/SAM file or a molecule table and spilled to Parquet
partitions by cell (about ``chunk_rows`` reads each); each partition is deduplicated on its
own, so every cell's molecules are counted together and peak memory follows the chunk size,
not the input size.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend
from omicsprep.errors import InputError
from omicsprep.molecules import BamOptions, TableOptions, encode_reads, estimated_reads, usable_reads
from omicsprep.umi import Method, dedup_reads


def count_umis(
    path: str | Path,
    *,
    fmt: str,
    method: Method = "directional",
    edit_distance_threshold: int = 1,
    skip_gene_regex: str = "^(__|Unassigned)",
    bam: BamOptions | None = None,
    table: TableOptions | None = None,
    chunk_rows: int = 5_000_000,
    spill_dir: str | Path | None = None,
    backend: Backend = "cpu",
) -> AnnData:
    """Deduplicated UMI counts, cells x genes, of a BAM/SAM file or a molecule table.

    Parameters
    ----------
    path
        Aligned reads (``fmt`` ``bam`` or ``sam``, any sort order), or a molecule table
        (``molecules``: Parquet, CSV or TSV, gzipped or not; a row per read, or per UMI
        with a read-count column).
    fmt
        ``bam``, ``sam`` or ``molecules``.
    method
        UMI-tools' method: ``unique``, ``percentile``, ``cluster``, ``adjacency`` or
        ``directional``.
    edit_distance_threshold
        Largest Hamming distance between UMIs of one molecule.
    skip_gene_regex
        Reads whose gene matches are skipped (and counted).
    bam, table
        Where cell, UMI and gene are found; defaults when ``None``.
    chunk_rows
        Reads held in memory at a time, and per partition.
    spill_dir
        Where partitions are spilled (a temporary folder inside it); the system's
        temporary folder when ``None``.
    backend
        Where molecules are deduplicated: ``cpu`` (Numba, parallel) or ``gpu`` (cuDF and
        CUDA, one transfer per partition); reading and encoding run on the CPU either way.

    Returns
    -------
    Counts in ``X`` (CSR, float32); ``uns["umi_dedup"]`` holds the method, the reads used,
    the partitions and the skipped reads by reason.

    Raises
    ------
    InputError
        Missing, truncated or unreadable input; no usable read; UMIs of mixed lengths.
    """
    path = Path(path)
    bam, table = bam or BamOptions(), table or TableOptions()
    skipped: Counter = Counter()
    n_partitions = max(1, int(np.ceil(estimated_reads(path, fmt=fmt, table=table) / chunk_rows)))
    batches = usable_reads(path, fmt=fmt, bam=bam, table=table, skip_gene_regex=skip_gene_regex,
                           chunk_rows=chunk_rows, skipped=skipped)
    pieces, n_reads = [], 0
    with tempfile.TemporaryDirectory(dir=spill_dir, prefix="omicsprep-umi-") as tmp:
        for reads in _cell_partitions(batches, n_partitions=n_partitions, spill_dir=Path(tmp)):
            encoded = encode_reads(reads, skipped=skipped, path=path)
            n_reads += int(encoded.reads["reads"].sum()) if "reads" in encoded.reads else len(encoded.reads)
            counts = dedup_reads(encoded.reads, method=method, threshold=edit_distance_threshold, backend=backend)
            pieces.append(pd.DataFrame({"cell": encoded.cells[counts["cell"]], "gene": encoded.genes[counts["gene"]],
                                        "count": counts["count"].to_numpy()}))
    if n_reads == 0:
        reasons = {reason: n for reason, n in skipped.items() if n}
        raise InputError(f"no usable read (skipped: {reasons or 'none'})", path=path)
    summary = {"backend": backend, "method": method, "edit_distance_threshold": edit_distance_threshold,
               "reads_used": n_reads, "partitions": len(pieces)}
    return _to_anndata(pd.concat(pieces, ignore_index=True), summary=summary, skipped=skipped)


def _cell_partitions(batches: Iterator[pa.Table], *, n_partitions: int, spill_dir: Path) -> Iterator[pa.Table]:
    """Regroup batches of reads so that each cell's reads come in one table.

    One partition is held in memory; more are spilled to Parquet files by cell and read
    back one at a time.
    """
    import pyarrow.parquet as pq

    if n_partitions == 1:
        tables = list(batches)
        if tables:
            yield pa.concat_tables(tables)
        return
    writers: dict[int, pq.ParquetWriter] = {}
    for reads in batches:
        partition = _partition_of(reads.column("cell").combine_chunks(), n_partitions)
        for part in np.unique(partition):
            rows = reads.filter(pa.array(partition == part))
            if part not in writers:
                writers[part] = pq.ParquetWriter(spill_dir / f"part-{part}.parquet", rows.schema)
            writers[part].write_table(rows)
    for writer in writers.values():
        writer.close()
    for part in sorted(writers):
        yield pq.read_table(spill_dir / f"part-{part}.parquet")


def _partition_of(cells: pa.Array, n_partitions: int) -> np.ndarray:
    """A stable partition per cell, so each cell's molecules are deduplicated together."""
    hashed = pd.util.hash_array(np.asarray(cells.to_numpy(zero_copy_only=False), dtype=object))
    return (hashed % np.uint64(n_partitions)).astype(np.int64)


def _to_anndata(long: pd.DataFrame, *, summary: dict[str, Any], skipped: Counter) -> AnnData:
    """Cells x genes counts from (cell, gene, count) rows, with the run's summary."""
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


def count_umis_with_settings(path: str | Path, *, fmt: str, settings: dict[str, Any], backend: Backend) -> AnnData:
    """:func:`count_umis` with the workflow's ``umi`` config section (``bam`` and
    ``table`` sub-sections as dicts)."""
    options = dict(settings)
    bam, table = BamOptions(**options.pop("bam", {})), TableOptions(**options.pop("table", {}))
    return count_umis(path, fmt=fmt, bam=bam, table=table, backend=backend, **options)


def long_table(adata: AnnData) -> pd.DataFrame:
    """The non-zero counts as ``gene``, ``cell``, ``count`` rows, as ``umi_tools count`` writes."""
    coo = sparse.coo_matrix(adata.X)
    table = pd.DataFrame(
        {"gene": adata.var_names[coo.col], "cell": adata.obs_names[coo.row], "count": coo.data.astype(np.int64)}
    )
    return table.sort_values(["gene", "cell"], ignore_index=True)
