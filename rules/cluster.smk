# One fused rule: on the GPU every process pays for importing RAPIDS and compiling
# kernels, so normalization through markers share one process and one device transfer.
rule cluster:
    input:
        h5ad=rules.qc.output.h5ad,
    output:
        h5ad="results/{sample}/processed.h5ad",
        obs="results/{sample}/obs.parquet",
        markers=markers_output(),
    log:
        "logs/cluster/{sample}.log",
    benchmark:
        "benchmarks/cluster/{sample}.tsv"
    conda:
        conda_env_for("cluster")
    resources:
        gpu=gpus_for("cluster"),
        mem_mb=memory_for("cluster"),
        disk_mb=disk_for("cluster"),
    params:
        backend=backend_for("cluster"),
        steps=cluster_params(),
        seed=config["seed"],
    script:
        "../scripts/cluster.py"


# qc, cluster and their figures in one process (config fuse_qc_cluster): the same outputs as
# the four rules, with three process starts, one import of the GPU libraries and the reads of
# qc.h5ad and processed.h5ad fewer.
rule qc_cluster:
    input:
        counts=counts_input,
    output:
        **qc_figure_outputs(),
        **embedding_figure_outputs(),
        h5ad=rules.qc.output.h5ad,
        metrics=rules.qc.output.metrics,
        processed=rules.cluster.output.h5ad,
        obs=rules.cluster.output.obs,
        markers=markers_output(),  # rules.cluster.output would drop the report flag
    log:
        "logs/qc_cluster/{sample}.log",
    benchmark:
        "benchmarks/qc_cluster/{sample}.tsv"
    conda:
        conda_env_for("qc_cluster")
    resources:
        gpu=gpus_for("qc_cluster"),
        mem_mb=memory_for("qc_cluster"),
        disk_mb=disk_for("qc_cluster"),
    params:
        backend=backend_for("qc_cluster"),
        format=counts_format,
        ambient_corrected=ambient_corrected,
        metadata=sample_metadata,
        duplicate_barcodes=config["duplicate_barcodes"],
        qc=config["qc"],
        doublets=config["doublets"],
        steps=cluster_params(),
        seed=config["seed"],
        cluster_keys=cluster_keys(),
        metric_keys=QC_METRIC_COLUMNS,
    script:
        "../scripts/qc.py"


if config["fuse_qc_cluster"]:

    ruleorder: qc_cluster > qc
    ruleorder: qc_cluster > cluster
    ruleorder: qc_cluster > plot_qc
    ruleorder: qc_cluster > plot_umap

else:

    ruleorder: qc > qc_cluster
    ruleorder: cluster > qc_cluster
    ruleorder: plot_qc > qc_cluster
    ruleorder: plot_umap > qc_cluster
