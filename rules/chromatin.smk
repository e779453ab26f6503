# Chromatin accessibility of samples with a fragments column: fragments streamed in chunks
# into a cells x peaks (or tiles) matrix for the QC'd RNA cells, then TF-IDF, LSI,
# neighbours, UMAP and clusters, in one process.
rule chromatin:
    input:
        unpack(chromatin_inputs),
    output:
        h5ad="results/{sample}/atac.h5ad",
    log:
        "logs/chromatin/{sample}.log",
    benchmark:
        "benchmarks/chromatin/{sample}.tsv"
    conda:
        conda_env_for("chromatin")
    resources:
        gpu=gpus_for("chromatin"),
    params:
        backend=backend_for("chromatin"),
        chromatin=config["chromatin"],
        clustering=modality_clustering_params(),
        seed=config["seed"],
    script:
        "../scripts/chromatin.py"
