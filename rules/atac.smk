# Chromatin accessibility of samples with a fragments column: fragments streamed in chunks
# into a cells x peaks (or tiles) matrix for the QC'd RNA cells, then TF-IDF, LSI,
# neighbours, UMAP and clusters, in one process.
rule atac:
    input:
        unpack(atac_inputs),
    output:
        h5ad="results/{sample}/atac.h5ad",
    log:
        "logs/atac/{sample}.log",
    benchmark:
        "benchmarks/atac/{sample}.tsv"
    conda:
        conda_env_for("atac")
    container:
        container_for("atac")
    resources:
        gpu=gpus_for("atac"),
        mem_mb=memory_for("atac"),
        disk_mb=disk_for("atac"),
    params:
        backend=backend_for("atac"),
        atac=config["atac"],
        clustering=modality_clustering_params(),
        seed=config["seed"],
    script:
        "../scripts/atac.py"
