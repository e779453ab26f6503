"""The options of each stage, as typed values: what each stage's ``pipeline`` module's steps take.

Field names are the workflow's configuration keys (``config/schemas/config.schema.yaml``),
nested where the configuration nests, and the defaults are the schema's (a test keeps them
equal). :func:`from_config` builds options from a configuration section; the workflow's
scripts call it on the sections their rules pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args, get_origin, get_type_hints

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Options = TypeVar("Options", bound="DataclassInstance")

# The values options take are defined here, not in the modules that use them, so that this
# module imports nothing but the standard library: the workflow reads it while Snakemake
# parses the rules, in every Snakemake process.
HvgFlavor = Literal["seurat_v3", "seurat", "cell_ranger"]
MarkerMethod = Literal["wilcoxon", "t-test", "logreg"]
Algorithm = Literal["leiden", "louvain"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
Correlation = Literal["pearson", "spearman"]
Pooling = Literal["none", "knn", "kmeans"]
Method = Literal["unique", "percentile", "cluster", "adjacency", "directional"]
METHODS: tuple[str, ...] = get_args(Method)
UmiSource = Literal["tag", "read_id", "umis"]


def cluster_key(algorithm: Algorithm, resolution: float) -> str:
    """Name of the ``obs`` column holding clusters at one resolution, e.g. ``leiden_1.0``."""
    return f"{algorithm}_{float(resolution)}"


def parse_cluster_key(key: str) -> tuple[Algorithm, float] | None:
    """The algorithm and resolution of a :func:`cluster_key` column name; ``None`` for other names."""
    for algorithm in ALGORITHMS:
        if key.startswith(f"{algorithm}_"):
            try:
                resolution = float(key.removeprefix(f"{algorithm}_"))
            except ValueError:
                return None
            return (algorithm, resolution) if cluster_key(algorithm, resolution) == key else None
    return None


def from_config(options_class: type[Options], section: Mapping[str, Any]) -> Options:
    """``options_class`` from a configuration section; absent keys keep their defaults.

    Sub-sections become the nested options, and lists become tuples where the field is one.

    Parameters
    ----------
    options_class
        An options dataclass of this module.
    section
        Its configuration section (the workflow's, validated by the schema).

    Raises
    ------
    ValueError
        A key that is not a field of ``options_class``.
    """
    names = [option.name for option in fields(options_class)]
    unknown = sorted(set(section) - set(names))
    if unknown:
        raise ValueError(f"{options_class.__name__}: unknown keys {unknown} (known: {', '.join(names)})")
    types = get_type_hints(options_class)
    values = {}
    for key, value in section.items():
        if is_dataclass(types[key]):
            values[key] = from_config(types[key], value)
        elif get_origin(types[key]) is tuple:
            values[key] = tuple(value)
        else:
            values[key] = value
    return options_class(**values)


def from_sections(options_class: type[Options], config: Mapping[str, Any]) -> Options:
    """``options_class`` whose every field is a whole section of the workflow's configuration.

    As :class:`ClusteringOptions` and :class:`EmbeddingOptions` gather sections ``normalize``
    through ``markers`` (:func:`from_config` on each).
    """
    return from_config(options_class, {option.name: config[option.name] for option in fields(options_class)})


@dataclass(frozen=True)
class FilterOptions:
    """Cell filter (:func:`omicsprep.rna.qc.qc_pass_mask`): fixed limits, and MAD outliers with ``mad``."""

    method: Literal["thresholds", "mad"] = "mad"
    min_genes: int | None = 200
    max_genes: int | None = None
    min_counts: int | None = None
    max_counts: int | None = None
    max_pct_mt: float | None = 20
    n_mads: float = 5
    n_mads_mt: float = 3


@dataclass(frozen=True)
class QcOptions:
    """QC metrics and filters (configuration section ``qc``).

    ``gene_groups`` maps a group name to a regular expression on gene names
    (``pct_counts_<group>`` is computed for each); genes detected in fewer than
    ``min_cells_per_gene`` cells are dropped; fewer than ``min_cells_left`` cells left fails
    the sample.
    """

    gene_groups: Mapping[str, str] = field(
        default_factory=lambda: {"mt": "(?i)^mt-", "ribo": "(?i)^rp[sl]", "hb": r"(?i)^hb[abdegmqz]\d?(-|$)"}
    )
    filter: FilterOptions = field(default_factory=FilterOptions)
    min_cells_per_gene: int = 3
    min_cells_left: int = 30


@dataclass(frozen=True)
class DoubletOptions:
    """Doublet scoring with Scrublet (section ``doublets``).

    At most ``max_cells_per_run`` cells are scored together; ``remove`` drops the predicted
    doublets, else they are only scored.
    """

    enabled: bool = True
    expected_rate: float = 0.06
    remove: bool = True
    max_cells_per_run: int = 20000


@dataclass(frozen=True)
class NormalizeOptions:
    """Counts per cell after normalization (section ``normalize``); ``None``: the median."""

    target_sum: float | None = 10000


@dataclass(frozen=True)
class HvgOptions:
    """Highly variable genes (section ``hvg``)."""

    flavor: HvgFlavor = "seurat_v3"
    n_top_genes: int = 2000


@dataclass(frozen=True)
class PcaOptions:
    """Principal components (section ``pca``)."""

    n_comps: int = 50


@dataclass(frozen=True)
class NeighborsOptions:
    """Neighbour graph (section ``neighbors``) on the first ``n_pcs`` components."""

    n_neighbors: int = 15
    n_pcs: int = 30
    metric: str = "euclidean"


@dataclass(frozen=True)
class UmapOptions:
    """UMAP (section ``umap``)."""

    min_dist: float = 0.5


@dataclass(frozen=True)
class LeidenOptions:
    """Leiden clusterings, one per resolution (section ``leiden``)."""

    resolutions: tuple[float, ...] = (1.0,)


@dataclass(frozen=True)
class LouvainOptions:
    """Louvain clusterings, one per resolution (section ``louvain``); none when empty."""

    resolutions: tuple[float, ...] = (1.0,)


@dataclass(frozen=True)
class MarkersOptions:
    """Marker genes of the clusters of one algorithm and resolution (section ``markers``)."""

    algorithm: Algorithm = "leiden"
    resolution: float = 1.0
    method: MarkerMethod = "wilcoxon"
    n_genes: int = 25


@dataclass(frozen=True)
class ClusteringOptions:
    """Normalization through markers: one field per configuration section, each named for it."""

    normalize: NormalizeOptions = field(default_factory=NormalizeOptions)
    hvg: HvgOptions = field(default_factory=HvgOptions)
    pca: PcaOptions = field(default_factory=PcaOptions)
    neighbors: NeighborsOptions = field(default_factory=NeighborsOptions)
    umap: UmapOptions = field(default_factory=UmapOptions)
    leiden: LeidenOptions = field(default_factory=LeidenOptions)
    louvain: LouvainOptions = field(default_factory=LouvainOptions)
    markers: MarkersOptions = field(default_factory=MarkersOptions)


@dataclass(frozen=True)
class EmbeddingOptions:
    """Neighbours, UMAP and Leiden of an embedding (the protein, atac and multiome steps).

    One field per configuration section, each named for it.
    """

    neighbors: NeighborsOptions = field(default_factory=NeighborsOptions)
    umap: UmapOptions = field(default_factory=UmapOptions)
    leiden: LeidenOptions = field(default_factory=LeidenOptions)


@dataclass(frozen=True)
class MetacellOptions:
    """Pooling of cells before correlation: ``knn`` neighbourhoods, ``kmeans`` groups, or ``none``."""

    method: Pooling = "knn"
    n_metacells: int = 500


@dataclass(frozen=True)
class PerClusterOptions:
    """Also a network per cluster of at least ``min_cells`` cells."""

    enabled: bool = False
    min_cells: int = 200


@dataclass(frozen=True)
class CoexpressionOptions:
    """Gene co-expression network (section ``coexpression``).

    ``enabled`` is the workflow's (whether the rule runs). The network is built over the
    ``n_genes`` most variable genes, each keeping its ``top_k`` partners correlating at
    ``min_correlation`` or more, weighted by ``correlation ** power``; modules are
    ``algorithm`` communities at ``resolution``, smaller than ``min_module_size`` genes
    unassigned. Samples of fewer than ``min_cells`` cells are refused; genes expressed in
    fewer than ``min_expressing_cells`` cells are left out.
    """

    enabled: bool = True
    n_genes: int = 2000
    correlation: Correlation = "pearson"
    metacells: MetacellOptions = field(default_factory=MetacellOptions)
    top_k: int = 50
    min_correlation: float = 0.1
    power: float = 1
    algorithm: Algorithm = "leiden"
    resolution: float = 1.0
    min_module_size: int = 10
    min_cells: int = 50
    min_expressing_cells: int = 20
    per_cluster: PerClusterOptions = field(default_factory=PerClusterOptions)


@dataclass(frozen=True)
class DsbOptions:
    """Settings of dsb (section ``protein.dsb``).

    Its pseudocount, whether each cell's technical component is removed, and the antibody
    totals (log10) of the empty droplets taken as background from a sample's raw droplets.
    """

    pseudocount: float = 10
    denoise: bool = True
    background_log10_library: tuple[float, float] = (1.5, 3.0)


@dataclass(frozen=True)
class ProteinOptions:
    """Antibody tags (section ``protein``).

    ``normalization``: ``auto`` is dsb when empty droplets are given, else CLR;
    ``isotype_pattern`` names the isotype controls; ``n_comps`` PCs of the normalized tags.
    """

    normalization: Literal["auto", "clr", "dsb"] = "auto"
    isotype_pattern: str = "(?i)isotype|^(mouse|rat|hamster|armenian)[ _-]?ig"
    dsb: DsbOptions = field(default_factory=DsbOptions)
    n_comps: int = 20


@dataclass(frozen=True)
class LsiOptions:
    """LSI components; those correlating more than ``max_depth_correlation`` with log depth are dropped."""

    n_comps: int = 30
    max_depth_correlation: float = 0.9


@dataclass(frozen=True)
class AtacOptions:
    """Chromatin accessibility (section ``chromatin``).

    Counting (the workflow's script): ``tile_width`` when there are no peaks, ``genes``
    (TSS) and ``chrom_sizes`` files, ``chunk_rows`` fragments at a time (``None``: by
    backend). Features seen in fewer than ``min_cells_per_feature`` cells are left out
    before TF-IDF and ``lsi``.
    """

    tile_width: int = 5000
    genes: str | None = None
    chrom_sizes: str | None = None
    chunk_rows: int | None = None
    min_cells_per_feature: int = 5
    lsi: LsiOptions = field(default_factory=LsiOptions)


@dataclass(frozen=True)
class WnnOptions:
    """Weighted nearest neighbours (:func:`omicsprep.multiome.wnn.weighted_nearest_neighbors`)."""

    n_neighbors: int = 20
    n_bandwidth_neighbors: int = 20
    n_candidates: int = 200


@dataclass(frozen=True)
class MultiomeOptions:
    """Modalities joined (section ``multiome``); each must share ``min_overlap`` of its cells."""

    min_overlap: float = 0.5
    wnn: WnnOptions = field(default_factory=WnnOptions)


@dataclass(frozen=True)
class HarmonyOptions:
    """Harmony's diversity penalty and iterations."""

    theta: float = 2.0
    max_iter: int = 10


@dataclass(frozen=True)
class ScviOptions:
    """scVI's network and training.

    ``max_epochs`` ``None``: scvi-tools' choice by cell count; ``batch_size`` ``None``: 128, on
    the GPU 1024 from 100,000 cells on; ``learning_rate`` ``None``: scaled from scvi-tools' by the batch
    size (:func:`omicsprep.rna.latent.training_steps`).
    """

    n_latent: int = 30
    n_hidden: int = 128
    n_layers: int = 2
    gene_likelihood: Literal["nb", "zinb", "poisson"] = "nb"
    max_epochs: int | None = None
    early_stopping: bool = True
    batch_size: int | None = None
    learning_rate: float | None = None


@dataclass(frozen=True)
class ScanviOptions:
    """scANVI's training from the scVI model (``max_epochs`` ``None``: scvi-tools' choice)."""

    max_epochs: int | None = None
    early_stopping: bool = True


IntegrationMethod = Literal["pca", "harmony", "scvi", "scanvi"]


@dataclass(frozen=True)
class IntegrationOptions:
    """Which embeddings the merge computes, which one it clusters, and the known labels.

    Each method writes ``obsm["X_<method>"]``; ``use`` is the one neighbours, UMAP and Leiden
    run on; ``label_key`` names the ``obs`` column of known cell types (scANVI's labels, the
    truth of the scIB metrics), empty for none.
    """

    methods: tuple[IntegrationMethod, ...] = ("pca", "harmony")
    use: IntegrationMethod = "harmony"
    label_key: str = ""


@dataclass(frozen=True)
class MergeOptions:
    """Samples merged and integrated (section ``merge``).

    ``enabled`` and ``allow_partial`` are the workflow's. The integration methods correct
    for ``batch_key`` (``sample``, or the sample sheet's ``batch``); ``dask`` spreads the GPU
    steps before them over Dask workers.
    """

    enabled: bool = False
    batch_key: Literal["sample", "batch"] = "sample"
    allow_partial: bool = False
    dask: bool = False
    integration: IntegrationOptions = field(default_factory=IntegrationOptions)
    harmony: HarmonyOptions = field(default_factory=HarmonyOptions)
    scvi: ScviOptions = field(default_factory=ScviOptions)
    scanvi: ScanviOptions = field(default_factory=ScanviOptions)

    def __post_init__(self) -> None:
        methods = self.integration.methods
        if self.integration.use not in methods:
            raise ValueError(f"merge.integration.use {self.integration.use!r} is not among the methods {list(methods)}")
        if "scanvi" in methods and ("scvi" not in methods or not self.integration.label_key):
            raise ValueError("merge.integration: scanvi starts from scvi's model and needs label_key")


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
