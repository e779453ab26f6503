"""From reads to a cell x gene count matrix, in memory bounded by a chunk size.

Usable reads are streamed from a BAM/SAM file or a molecule table and spilled to
partitions by cell (about ``chunk_rows`` reads each); each partition is deduplicated on its
own, so every cell's molecules are counted together and peak memory follows the chunk size,
not the input size. A BAM file's reads travel as integer codes (16 bytes a read, spilled
as raw arrays); SAM and table reads as Arrow tables of names (spilled as Arrow files).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numba
import numpy as np
import pandas as pd
import pyarrow as pa
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import Backend
from omicsprep.errors import InputError
from omicsprep.jit_cache import track_sources
from omicsprep.options import UmiOptions
from omicsprep.reads.bam import BamRecords
from omicsprep.reads.molecules import ReadTable, encode_reads, estimated_reads, usable_bam_codes, usable_reads
from omicsprep.reads.umi import dedup_reads, numba_threads

track_sources()  # before the functions below are compiled and cached (cache=True)


def count_umis(
    path: str | Path,
    *,
    fmt: str,
    options: UmiOptions | None = None,
    spill_dir: str | Path | None = None,
    backend: Backend = "cpu",
    threads: int | None = None,
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
    options
        UMI-tools' method (``unique``, ``percentile``, ``cluster``, ``adjacency`` or
        ``directional``) and ``edit_distance_threshold`` (largest Hamming distance between
        UMIs of one molecule); ``skip_gene_regex`` (reads whose gene matches are skipped,
        and counted); ``chunk_rows`` (reads held in memory at a time, and per partition);
        ``bam`` and ``table`` (where cell, UMI and gene are found). Defaults when ``None``.
    spill_dir
        Where partitions are spilled (a temporary folder inside it); the system's
        temporary folder when ``None``.
    backend
        ``cpu``: tables read by pyarrow, reads collapsed into molecules and deduplicated by
        Numba (parallel). ``gpu``: tables parsed by cuDF, reads collapsed by cuDF and
        molecules deduplicated by CUDA kernels (one transfer per partition). BAM decoding
        (:mod:`omicsprep.reads.bam`), SAM decoding (oxbow) and partitioning by cell run on
        the CPU either way.
    threads
        Threads that read a BAM file (inflate and scan) and run the CPU's Numba kernels;
        every core this process may use when ``None``.

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
    options = options or UmiOptions()
    skipped: Counter = Counter()
    n_partitions = max(1, int(np.ceil(estimated_reads(path, fmt=fmt) / options.chunk_rows)))
    matrix, n_reads = _CountMatrix(), 0
    with tempfile.TemporaryDirectory(dir=spill_dir, prefix="omicsprep-umi-") as tmp, numba_threads(threads):
        if fmt == "bam":
            records = BamRecords(
                path,
                umi_source=options.bam.umi_source,
                cell_tag=options.bam.cell_tag,
                umi_tag=options.bam.umi_tag,
                gene_tag=options.bam.gene_tag,
                threads=threads,
            )
            chunks = usable_bam_codes(
                records, min_mapq=options.bam.min_mapq, skip_gene_regex=options.skip_gene_regex, skipped=skipped
            )
            partitions = _code_partitions(chunks, n_partitions=n_partitions, spill_dir=Path(tmp))  # reads them all
            cells, genes = pd.Index(records.cells.names()), pd.Index(records.genes.names())
            encoded = (ReadTable(reads=load(), cells=cells, genes=genes) for load in partitions)
        else:
            batches = usable_reads(
                path,
                fmt=fmt,
                bam=options.bam,
                table=options.table,
                skip_gene_regex=options.skip_gene_regex,
                chunk_rows=options.chunk_rows,
                skipped=skipped,
                backend=backend,
            )
            encoded = (
                encode_reads(reads, skipped=skipped, path=path)
                for reads in _cell_partitions(batches, n_partitions=n_partitions, spill_dir=Path(tmp))
            )
        for partition in encoded:
            reads = partition.reads
            n_reads += int(reads["reads"].sum()) if "reads" in reads else len(reads)
            counts = dedup_reads(
                reads, method=options.method, threshold=options.edit_distance_threshold, backend=backend
            )
            matrix.add(counts, cells=partition.cells, genes=partition.genes)
    if n_reads == 0:
        reasons = {reason: n for reason, n in skipped.items() if n}
        raise InputError(f"no usable read (skipped: {reasons or 'none'})", path=path)
    adata = matrix.to_anndata()
    adata.uns["umi_dedup"] = {
        "backend": backend,
        "method": options.method,
        "edit_distance_threshold": options.edit_distance_threshold,
        "reads_used": n_reads,
        "partitions": matrix.partitions,
        "reads_skipped": {reason: int(n) for reason, n in skipped.items()},
    }
    return adata


SPILLED_COLUMNS = ("cell", "gene", "umi")
SPILLED_READ = np.dtype(list(zip(SPILLED_COLUMNS, (np.int32, np.int32, np.uint64), strict=True)))


def _code_partitions(
    chunks: Iterator[pd.DataFrame], *, n_partitions: int, spill_dir: Path
) -> list[Callable[[], pd.DataFrame]]:
    """Read every chunk of coded reads and regroup them by cell: a loader per partition.

    A cell's partition is its code modulo ``n_partitions`` (codes are numbered in order of
    appearance, so partitions take turns). One partition is held in memory; more are
    appended to raw files of :data:`SPILLED_READ` (16 bytes a read), one per partition.
    """
    if n_partitions == 1:
        whole = pd.concat(list(chunks), ignore_index=True)
        return [lambda: whole] if len(whole) else []
    paths = [spill_dir / f"part-{part}.reads" for part in range(n_partitions)]
    files = [path.open("wb") for path in paths]
    try:
        for reads in chunks:
            order, bounds = _partition_order(reads["cell"].to_numpy(), n_partitions)
            rows = np.empty(len(reads), dtype=SPILLED_READ)
            for name in SPILLED_COLUMNS:
                rows[name] = reads[name].to_numpy()[order]
            for part in np.flatnonzero(np.diff(bounds)):
                rows[bounds[part] : bounds[part + 1]].tofile(files[part])
    finally:
        for file in files:
            file.close()
    return [partial(_spilled_reads, path) for path in paths if path.stat().st_size]


@numba.njit(cache=True)
def _partition_order(cells, n_partitions):
    """Reads ordered by partition (``cell % n_partitions``; a counting sort), and each partition's bounds."""
    bounds = np.zeros(n_partitions + 1, np.int64)
    for cell in cells:
        bounds[cell % n_partitions + 1] += 1
    bounds = np.cumsum(bounds)
    fill = bounds[:-1].copy()
    order = np.empty(cells.size, np.int64)
    for i in range(cells.size):
        part = cells[i] % n_partitions
        order[fill[part]] = i
        fill[part] += 1
    return order, bounds


def _spilled_reads(path: Path) -> pd.DataFrame:
    rows = np.fromfile(path, dtype=SPILLED_READ)
    return pd.DataFrame({name: rows[name] for name in SPILLED_COLUMNS})


def _cell_partitions(batches: Iterator[pa.Table], *, n_partitions: int, spill_dir: Path) -> Iterator[pa.Table]:
    """Regroup batches of reads so that each cell's reads come in one table.

    One partition is held in memory; more are spilled to Arrow files by cell (LZ4: three
    times faster to write and read back than Parquet) and read back one at a time.
    """
    if n_partitions == 1:
        tables = list(batches)
        if tables:
            yield pa.concat_tables(tables)
        return
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    try:
        for reads in batches:
            if reads.num_rows == 0:
                continue
            partition = _partition_of(reads.column("cell").combine_chunks(), n_partitions)
            order = np.argsort(partition, kind="stable")  # one take, not a filter per partition
            reads, partition = reads.take(order), partition[order]
            parts, starts = np.unique(partition, return_index=True)
            for part, start, end in zip(parts, starts, np.append(starts[1:], len(partition)), strict=True):
                rows = reads.slice(start, end - start)
                if part not in writers:
                    writers[part] = pa.ipc.new_file(spill_dir / f"part-{part}.arrow", rows.schema, options=options)
                writers[part].write_table(rows)
    finally:
        for writer in writers.values():
            writer.close()
    for part in sorted(writers):
        with pa.ipc.open_file(spill_dir / f"part-{part}.arrow") as spilled:
            yield spilled.read_all()


def _partition_of(cells: pa.Array, n_partitions: int) -> np.ndarray:
    """A stable partition per cell, so each cell's molecules are deduplicated together.

    Only the distinct barcodes are hashed (as Python strings, pandas' hash); the reads take
    their barcode's partition: eight times faster than hashing every read's barcode.
    """
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(cells)
    hashed = pd.util.hash_array(np.asarray(encoded.dictionary.to_numpy(zero_copy_only=False), dtype=object))
    return (hashed % np.uint64(n_partitions)).astype(np.int64)[encoded.indices.to_numpy()]


class _CountMatrix:
    """Deduplicated counts gathered partition by partition as integer triplets.

    Memory grows by 12 bytes a non-zero count rather than by a row of names.

    Partitions hold disjoint cells, so each one's cells are appended; genes are numbered
    in order of first appearance. Cells and genes come out in the order of the partitions'
    (cell, gene)-sorted counts.
    """

    def __init__(self) -> None:
        self.cells: list[pd.Index] = []
        self.genes = pd.Index([], dtype=object)
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.n_cells = 0
        self.partitions = 0

    def add(self, counts: pd.DataFrame, *, cells: pd.Index, genes: pd.Index) -> None:
        """One partition's counts (``cell``, ``gene`` codes into ``cells``, ``genes``)."""
        cell_order = pd.unique(counts["cell"].to_numpy())
        cell_number = np.empty(len(cells), dtype=np.int64)
        cell_number[cell_order] = self.n_cells + np.arange(len(cell_order))
        gene_order = pd.unique(counts["gene"].to_numpy())
        appearing = genes[gene_order]
        self.genes = self.genes.append(appearing[self.genes.get_indexer(appearing) < 0])
        gene_number = np.empty(len(genes), dtype=np.int64)
        gene_number[gene_order] = self.genes.get_indexer(appearing)
        self.rows.append(cell_number[counts["cell"].to_numpy()].astype(np.int32))
        self.cols.append(gene_number[counts["gene"].to_numpy()].astype(np.int32))
        self.values.append(counts["count"].to_numpy(np.float32))
        self.cells.append(cells[cell_order])
        self.n_cells += len(cell_order)
        self.partitions += 1

    def to_anndata(self) -> AnnData:
        """Cells x genes counts (CSR, float32)."""
        matrix = sparse.csr_matrix(
            (np.concatenate(self.values), (np.concatenate(self.rows), np.concatenate(self.cols))),
            shape=(self.n_cells, len(self.genes)),
        )
        cells = pd.Index(np.concatenate([np.asarray(c, dtype=object) for c in self.cells]), dtype=str)
        return AnnData(matrix, obs=pd.DataFrame(index=cells), var=pd.DataFrame(index=pd.Index(self.genes, dtype=str)))


def long_table(adata: AnnData) -> pd.DataFrame:
    """The non-zero counts as ``gene``, ``cell``, ``count`` rows, as ``umi_tools count`` writes."""
    coo = sparse.coo_matrix(adata.X)
    table = pd.DataFrame(
        {"gene": adata.var_names[coo.col], "cell": adata.obs_names[coo.row], "count": coo.data.astype(np.int64)}
    )
    return table.sort_values(["gene", "cell"], ignore_index=True)


def name_genes(adata: AnnData, *, names: pd.Series) -> None:
    """Name genes counted by ID as a 10x matrix does.

    The names go to ``var_names`` (made unique), the IDs to ``var["gene_ids"]``.

    Parameters
    ----------
    adata
        Counts whose ``var_names`` are gene IDs (STARsolo's ``GX`` tags).
    names
        Gene name by gene ID (STARsolo's ``features.tsv``); an ID it lacks keeps its ID.
    """
    ids = adata.var_names.to_numpy()
    adata.var["gene_ids"] = ids
    adata.var_names = pd.Index(names.reindex(ids).fillna(pd.Series(ids, index=ids)).to_numpy(), dtype=str)
    adata.var_names_make_unique()
