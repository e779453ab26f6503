"""The options of counting: reads or molecules to UMI counts, cell calling, ambient RNA and STARsolo."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

Method = Literal["unique", "percentile", "cluster", "adjacency", "directional"]
METHODS: tuple[str, ...] = get_args(Method)
UmiSource = Literal["tag", "read_id", "umis"]


@dataclass(frozen=True)
class BamOptions:
    """Where a BAM/SAM file keeps cell, UMI and gene, and which alignments count.

    ``umi_source`` is ``tag`` or the read name (``read_id``: umi_tools extract; ``umis``).
    Tag names: Cell Ranger/STARsolo ``CB``/``UB``/``GX``, Drop-seq ``XC``/``XM``/``GE``.
    """

    cell_tag: str = "CB"
    umi_tag: str = "UB"
    gene_tag: str = "GX"
    umi_source: UmiSource = "tag"
    min_mapq: int = 0


@dataclass(frozen=True)
class TableOptions:
    """Column names of a molecule table; ``count_column`` holds reads per row, if any."""

    cell_column: str = "cell"
    umi_column: str = "umi"
    gene_column: str = "gene"
    count_column: str | None = None


@dataclass(frozen=True)
class UmiOptions:
    """UMI deduplication of reads (section ``umi``), with UMI-tools' semantics.

    ``method`` and ``edit_distance_threshold`` are UMI-tools'; reads whose gene matches
    ``skip_gene_regex`` are skipped; ``chunk_rows`` reads are held in memory at a time;
    ``bam`` and ``table`` say where cell, UMI and gene are found.
    """

    method: Method = "directional"
    edit_distance_threshold: int = 1
    skip_gene_regex: str = "^(__|Unassigned)"
    chunk_rows: int = 5_000_000
    bam: BamOptions = field(default_factory=BamOptions)
    table: TableOptions = field(default_factory=TableOptions)


@dataclass(frozen=True)
class EmptyDropsCrOptions:
    """Cell Ranger's cell calling (``emptydrops_cr``): the initial ordmag call and the ambient pool.

    Cells above ``max_percentile`` of the ``expected_cells`` largest totals over
    ``max_min_ratio`` are called first; candidates are at most ``candidates_max`` barcodes
    with at least ``umi_min`` UMIs and ``umi_min_frac_median`` of the called cells' median;
    the ambient profile comes from the barcodes ranked ``ambient_rank_min`` to
    ``ambient_rank_max``.
    """

    max_percentile: float = 0.99
    max_min_ratio: float = 10.0
    umi_min: int = 500
    umi_min_frac_median: float = 0.01
    candidates_max: int = 20_000
    ambient_rank_min: int = 45_000
    ambient_rank_max: int = 90_000


@dataclass(frozen=True)
class SoupxOptions:
    """SoupX (``ambient.method: soupx``).

    The soup from droplets with totals in ``soup_range``; ``contamination`` fixed, or
    (``None``) estimated as SoupX's ``autoEstCont`` does, with its settings.
    """

    contamination: float | None = None
    soup_range: tuple[int, int] = (0, 100)
    tfidf_min: float = 1.0
    soup_quantile: float = 0.9
    max_markers: int = 100
    contamination_range: tuple[float, float] = (0.01, 0.8)
    rho_max_fdr: float = 0.2
    prior_rho: float = 0.05
    prior_rho_std_dev: float = 0.10


@dataclass(frozen=True)
class DecontxOptions:
    """DecontX (``ambient.method: decontx``).

    Its Beta prior ``delta`` (estimated when ``estimate_delta``), at most ``max_iter`` EM
    iterations until the contamination changes by less than ``convergence``.
    """

    max_iter: int = 500
    delta: tuple[float, float] = (10.0, 10.0)
    estimate_delta: bool = True
    convergence: float = 0.001
    seed: int = 12345


@dataclass(frozen=True)
class CellbenderOptions:
    """CellBender ``remove-background`` (``ambient.method: cellbender``).

    ``epochs`` of training, its false positive rate ``fpr``, ``learning_rate``,
    ``total_droplets``, ``posterior_batch_size`` and ``projected_ambient_count_threshold``
    (CellBender's own where ``None``). The defaults are a fast setting: a third of
    CellBender's epochs at three times its learning rate, larger posterior batches, and only
    the features expected to hold an ambient count in cells. On one H200 it trained 2.6x
    faster than CellBender's defaults (150 epochs, 1e-4, 128, 0.1) and called and removed
    the same (benchmarks/RESULTS.md).
    """

    epochs: int = 50
    fpr: float = 0.01
    learning_rate: float | None = 3e-4
    total_droplets: int | None = None
    posterior_batch_size: int | None = 1024
    projected_ambient_count_threshold: float | None = 1.0


@dataclass(frozen=True)
class AmbientOptions:
    """Ambient RNA removal from the called cells (section ``cells.ambient``).

    SoupX and DecontX work per cluster: the cells are clustered quickly first (Leiden at
    ``cluster_resolution`` on 30 PCs of 2,000 highly variable genes).
    """

    method: Literal["none", "soupx", "decontx", "cellbender"] = "none"
    cluster_resolution: float = 1.0
    soupx: SoupxOptions = field(default_factory=SoupxOptions)
    decontx: DecontxOptions = field(default_factory=DecontxOptions)
    cellbender: CellbenderOptions = field(default_factory=CellbenderOptions)


@dataclass(frozen=True)
class CellOptions:
    """Cell calling from raw droplets (section ``cells``).

    ``method``: ``emptydrops`` (DropletUtils' emptyDrops), ``emptydrops_cr`` (Cell Ranger's,
    STARsolo's ``EmptyDrops_CR``), ``knee`` (barcodes above the barcode-rank knee) or
    ``none`` (every barcode). Barcodes with at most ``lower`` UMIs make the ambient profile;
    ``niters`` Monte Carlo iterations give p-values; barcodes with ``retain`` or more UMIs are
    cells (``None``: the knee); cells have an FDR at most ``fdr``. ``expected_cells`` feeds
    Cell Ranger's initial call (3,000 when ``None``) and CellBender. ``test_ambient``,
    ``by_rank`` and ``ignore`` are emptyDrops'.
    """

    method: Literal["emptydrops", "emptydrops_cr", "knee", "none"] = "emptydrops"
    lower: int = 100
    niters: int = 10_000
    retain: float | None = None
    fdr: float = 0.001
    expected_cells: int | None = None
    test_ambient: bool = False
    by_rank: int | None = None
    ignore: int | None = None
    seed: int = 0
    emptydrops_cr: EmptyDropsCrOptions = field(default_factory=EmptyDropsCrOptions)
    ambient: AmbientOptions = field(default_factory=AmbientOptions)


@dataclass(frozen=True)
class CustomChemistryOptions:
    """Read 1 layout of chemistry ``custom`` (section ``align.custom``).

    One barcode segment and the UMI by 1-based start and length; or, for several barcode
    segments, STARsolo's ``--soloCBposition`` strings in ``cb_position`` with
    ``umi_position``. ``strand``: the cDNA read's strand relative to the gene.
    """

    cb_start: int = 1
    cb_length: int = 16
    umi_start: int = 17
    umi_length: int = 12
    cb_position: tuple[str, ...] = ()
    umi_position: str | None = None
    strand: Literal["Forward", "Reverse", "Unstranded"] = "Forward"


@dataclass(frozen=True)
class AlignOptions:
    """STARsolo alignment of samples given as FASTQ (section ``align``).

    ``gene_feature``: what UMI counting counts, reads on exons (``Gene``) or on whole genes,
    introns included (``GeneFull``, single nuclei). ``umi_dedup``: STARsolo's collapsing for
    its own matrices. A sample whose barcodes match the whitelist less often than
    ``min_whitelist_match`` is stopped before aligning.
    """

    gene_feature: Literal["Gene", "GeneFull"] = "Gene"
    umi_dedup: Literal["1MM_Directional_UMItools", "1MM_All", "1MM_Directional", "Exact"] = "1MM_Directional_UMItools"
    min_whitelist_match: float = 0.1
    custom: CustomChemistryOptions = field(default_factory=CustomChemistryOptions)
