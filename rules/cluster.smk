# One fused rule: on the GPU every process pays for importing RAPIDS and compiling
# kernels, so normalization through markers share one process and one device transfer.
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
    log:
        "logs/cluster/{sample}.log",
    benchmark:
        "benchmarks/cluster/{sample}.tsv"
    conda:
        conda_env_for("cluster")
    resources:
        gpu=gpus_for("cluster"),
    params:
        backend=backend_for("cluster"),
        steps=cluster_params(),
        seed=config["seed"],
    script:
        "../scripts/cluster.py"
