# Normalization through markers in one process (the data move to the GPU once), and the UMAP
# figures, drawn in a second process meanwhile. Its parameters are not qc's: changing a
# clustering setting reruns this rule only.
rule cluster:
    input:
        h5ad=rules.qc.output.h5ad,
    output:
        h5ad="results/{sample}/processed.h5ad",
        obs="results/{sample}/obs.parquet",
        markers=report(
            "results/{sample}/markers.tsv",
            category="Markers",
            caption="../report/markers.rst",
            labels={"sample": "{sample}"},
        ),
        umap_clusters=report(
            "results/{sample}/plots/umap_clusters.png",
            category="Embedding",
            caption="../report/umap_clusters.rst",
            labels={"sample": "{sample}", "figure": "clusters"},
        ),
        umap_metrics=report(
            "results/{sample}/plots/umap_qc.png",
            category="Embedding",
            caption="../report/umap_qc.rst",
            labels={"sample": "{sample}", "figure": "QC metrics"},
        ),
    log:
        "logs/cluster/{sample}.log",
    benchmark:
        "benchmarks/cluster/{sample}.tsv"
    conda:
        conda_env_for("cluster")
    container:
        container_for("cluster")
    threads: threads_for("cluster")
    resources:
        gpu=gpus_for("cluster"),
        mem_mb=memory_for("cluster"),
        disk_mb=disk_for("cluster"),
    params:
        backend=backend_for("cluster"),
        steps=cluster_params(),
        seed=config["seed"],
        cluster_keys=cluster_keys(),
        metric_keys=QC_METRIC_COLUMNS,
    script:
        "../scripts/cluster.py"
