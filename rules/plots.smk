rule plot_qc:
    input:
        metrics=produced_by_either(rules.qc.output.metrics),
    output:
        histograms=report(
            "results/{sample}/plots/qc_histograms.png",
            category="Quality control",
            caption="../report/qc_histograms.rst",
            labels={"sample": "{sample}", "figure": "histograms"},
        ),
        scatter=report(
            "results/{sample}/plots/qc_scatter.png",
            category="Quality control",
            caption="../report/qc_scatter.rst",
            labels={"sample": "{sample}", "figure": "UMIs vs genes"},
        ),
    log:
        "logs/plot_qc/{sample}.log",
    conda:
        "../envs/cpu.yaml"
    script:
        "../scripts/plot_qc.py"


rule plot_umap:
    input:
        h5ad=produced_by_either(rules.cluster.output.h5ad),
    output:
        clusters=report(
            "results/{sample}/plots/umap_clusters.png",
            category="Embedding",
            caption="../report/umap_clusters.rst",
            labels={"sample": "{sample}", "figure": "clusters"},
        ),
        metrics=report(
            "results/{sample}/plots/umap_qc.png",
            category="Embedding",
            caption="../report/umap_qc.rst",
            labels={"sample": "{sample}", "figure": "QC metrics"},
        ),
    log:
        "logs/plot_umap/{sample}.log",
    conda:
        "../envs/cpu.yaml"
    params:
        clusters=cluster_keys(),
        metrics=QC_METRIC_COLUMNS,
    script:
        "../scripts/plot_umap.py"
