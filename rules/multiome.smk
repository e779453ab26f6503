# Samples with two or more modalities: joined by cell barcode into one MuData with weighted
# nearest neighbours, a joint UMAP and joint clusters; per-modality results stay in their
# modality.
rule multiome:
    input:
        unpack(multiome_inputs),
    output:
        h5mu="results/{sample}/multiome.h5mu",
        umap=report(
            "results/{sample}/plots/umap_joint.png",
            category="Multi-omics",
            caption="../report/umap_joint.rst",
            labels={"sample": "{sample}", "figure": "joint UMAP"},
        ),
    log:
        "logs/multiome/{sample}.log",
    benchmark:
        "benchmarks/multiome/{sample}.tsv"
    conda:
        conda_env_for("multiome")
    container:
        container_for("multiome")
    resources:
        gpu=gpus_for("multiome"),
        mem_mb=memory_for("multiome"),
        disk_mb=disk_for("multiome"),
    params:
        backend=backend_for("multiome"),
        multiome=config["multiome"],
        clustering=modality_clustering_params(),
        seed=config["seed"],
    script:
        "../scripts/multiome.py"
