# Antibody tags (CITE-seq) of samples with an adt column: QC metrics, CLR or dsb, and the
# tags' own PCA, neighbours, UMAP and clusters, in one process.
rule protein:
    input:
        unpack(protein_inputs),
    output:
        h5ad="results/{sample}/protein.h5ad",
    log:
        "logs/protein/{sample}.log",
    benchmark:
        "benchmarks/protein/{sample}.tsv"
    conda:
        conda_env_for("protein")
    container:
        container_for("protein")
    resources:
        gpu=gpus_for("protein"),
        mem_mb=memory_for("protein"),
        disk_mb=disk_for("protein"),
    params:
        backend=backend_for("protein"),
        protein=config["protein"],
        duplicate_barcodes=config["duplicate_barcodes"],
        clustering=modality_clustering_params(),
        seed=config["seed"],
    script:
        "../scripts/protein.py"
