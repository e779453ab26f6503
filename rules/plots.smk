rule plot_qc:
    input:
        metrics=produced_by_either(rules.qc.output.metrics),
    output:
        **qc_figure_outputs(),
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
        **embedding_figure_outputs(),
    log:
        "logs/plot_umap/{sample}.log",
    conda:
        "../envs/cpu.yaml"
    params:
        cluster_keys=cluster_keys(),
        metric_keys=QC_METRIC_COLUMNS,
    script:
        "../scripts/plot_umap.py"
