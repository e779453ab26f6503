# Gene co-expression network per sample: one process for the correlation, the modules and
# the eigengenes (the expression moves to the GPU once), and its two figures.
rule coexpression:
    input:
        h5ad="results/{sample}/processed.h5ad",
    output:
        edges="results/{sample}/coexpression/edges.parquet",
        modules=report(
            "results/{sample}/coexpression/modules.tsv",
            category="Co-expression",
            caption="../report/coexpression_modules.rst",
            labels={"sample": "{sample}", "figure": "modules"},
        ),
        per_cluster="results/{sample}/coexpression/modules_per_cluster.tsv",
        eigengenes="results/{sample}/coexpression/eigengenes.parquet",
        provenance="results/{sample}/coexpression/provenance.json",
        correlation=report(
            "results/{sample}/coexpression/module_correlation.png",
            category="Co-expression",
            caption="../report/coexpression_correlation.rst",
            labels={"sample": "{sample}", "figure": "module correlation"},
        ),
        umap=report(
            "results/{sample}/coexpression/module_scores_umap.png",
            category="Co-expression",
            caption="../report/coexpression_umap.rst",
            labels={"sample": "{sample}", "figure": "module scores"},
        ),
    log:
        "logs/coexpression/{sample}.log",
    benchmark:
        "benchmarks/coexpression/{sample}.tsv"
    conda:
        conda_env_for("coexpression")
    resources:
        gpu=gpus_for("coexpression"),
    params:
        backend=backend_for("coexpression"),
        coexpression=config["coexpression"],
        clusters=markers_cluster_key(),
        seed=config["seed"],
    script:
        "../scripts/coexpression.py"
