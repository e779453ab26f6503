# All RNA samples as one (merge.enabled): concatenated, batch-aware HVGs, PCA, the
# integration methods (Harmony, scVI, scANVI), neighbours, UMAP and Leiden on the one used,
# with integration metrics (scIB's where labels are known), the merged clusters' markers and,
# with annotate.model, CellTypist's cell types of the merged cells.
rule merge:
    input:
        unpack(merge_inputs),
        sample_cell_types=merge_cell_types,
        model=annotate_model(),
    output:
        h5ad="results/merged/merged.h5ad",
        metrics=report(
            "results/merged/integration.tsv",
            category="Integration",
            caption="../report/integration.rst",
            labels={"sample": "merged", "table": "integration metrics"},
        ),
        markers=report(
            "results/merged/markers.tsv",
            category="Markers",
            caption="../report/markers_merged.rst",
            labels={"sample": "merged"},
        ),
        umap=report(
            "results/merged/plots/umap_merged.png",
            category="Integration",
            caption="../report/umap_merged.rst",
            labels={"sample": "merged", "figure": "UMAP"},
        ),
        methods=report(
            "results/merged/plots/umap_methods.png",
            category="Integration",
            caption="../report/umap_methods.rst",
            labels={"sample": "merged", "figure": "UMAP per method"},
        ),
        models=directory("results/merged/models"),
        scib=merge_scib_figure(),
        cell_types=merge_cell_types_table(),
        cell_types_umap=merge_cell_types_figure(),
    log:
        "logs/merge/merged.log",
    benchmark:
        "benchmarks/merge/merged.tsv"
    conda:
        conda_env_for("merge")
    container:
        container_for("merge")
    resources:
        gpu=gpus_for("merge"),
        mem_mb=memory_for("merge"),
        disk_mb=disk_for("merge"),
    params:
        backend=backend_for("merge"),
        merge=config["merge"],
        clustering=cluster_params(),
        labels=markers_cluster_key(),
        majority_voting=config["annotate"]["majority_voting"],
        seed=config["seed"],
    script:
        "../scripts/merge.py"
