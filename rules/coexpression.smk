# Gene co-expression network per sample: one process for the correlation, the modules and
# the eigengenes (the expression moves to the GPU once), and its two figures.
rule coexpression:
    input:
        h5ad=rules.cluster.output.h5ad,
    output:
        edges=coexpression_file("edges"),
        modules=report(
            coexpression_file("modules"),
            category="Co-expression",
            caption="../report/coexpression_modules.rst",
            labels={"sample": "{sample}", "figure": "modules"},
        ),
        per_cluster=coexpression_file("per_cluster"),
        eigengenes=coexpression_file("eigengenes"),
        provenance=coexpression_file("provenance"),
        correlation=report(
            coexpression_file("correlation"),
            category="Co-expression",
            caption="../report/coexpression_correlation.rst",
            labels={"sample": "{sample}", "figure": "module correlation"},
        ),
        umap=report(
            coexpression_file("umap"),
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
    container:
        container_for("coexpression")
    resources:
        gpu=gpus_for("coexpression"),
        mem_mb=memory_for("coexpression"),
        disk_mb=disk_for("coexpression"),
    params:
        backend=backend_for("coexpression"),
        coexpression=config["coexpression"],
        clusters=markers_cluster_key(),
        seed=config["seed"],
    script:
        "../scripts/coexpression.py"
