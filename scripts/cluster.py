"""Rule cluster: normalize, HVG, PCA, neighbours, UMAP, Leiden/Louvain and markers."""

import omicsprep.handoff  # noqa: F401 - first: a warm worker runs this script, if started (omicsprep workers)

# isort: split
from omicsprep import io
from omicsprep.backend import prepare_gpu, resolve_backend
from omicsprep.workflow import cluster, run_script, write_clustering

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    backend = resolve_backend(snakemake.params.backend)
    # Overlapping reading the input; cuGraph (clustering) the first steps too.
    prepare_gpu(backend, modules=("rapids_singlecell", "cuml", "pylibcugraph"))
    adata = io.read_h5ad(snakemake.input.h5ad)
    markers = cluster(adata, snakemake=snakemake, backend=backend)
    write_clustering(adata, markers, snakemake=snakemake, h5ad=snakemake.output.h5ad)


run_script(main, log_path=snakemake.log[0], sample=snakemake.wildcards.sample, threads=snakemake.threads)
