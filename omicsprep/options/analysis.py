"""The options of the analysis of cells: QC, clustering, networks, protein, ATAC, Multiome and the merge."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

HvgFlavor = Literal["seurat_v3", "seurat", "cell_ranger"]
MarkerMethod = Literal["wilcoxon", "t-test", "logreg"]
Algorithm = Literal["leiden", "louvain"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
Correlation = Literal["pearson", "spearman"]
Pooling = Literal["none", "knn", "kmeans"]


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
    the GPU 4096 from 100,000 cells on; ``learning_rate`` ``None``: scaled from scvi-tools' by the batch
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
