# Cell types by CellTypist (annotate.model), per RNA sample (rule merge types the merged
# cells): a table beside the sample's AnnData, and the UMAP coloured by them.
rule annotate:
    input:
        h5ad=annotate_input,
        model=annotate_model(),
    output:
        table="results/{sample}/cell_types.tsv",
        umap=report(
            "results/{sample}/plots/umap_cell_types.png",
            category="Cell types",
            caption="../report/cell_types.rst",
            labels={"sample": "{sample}", "figure": "cell types"},
        ),
    log:
        "logs/annotate/{sample}.log",
    benchmark:
        "benchmarks/annotate/{sample}.tsv"
    conda:
        conda_env_for("annotate")
    container:
        container_for("annotate")
    resources:
        gpu=gpus_for("annotate"),
        mem_mb=memory_for("annotate"),
        disk_mb=disk_for("annotate"),
    params:
        backend=backend_for("annotate"),
        clusters=markers_cluster_key(),
        majority_voting=config["annotate"]["majority_voting"],
    script:
        "../scripts/annotate.py"
