# QC metrics, cell and gene filters, doublets; and the QC figures of every input cell, drawn
# in a second process meanwhile.
rule qc:
    input:
        counts=counts_input,
    output:
        h5ad="results/{sample}/qc.h5ad",
        metrics="results/{sample}/qc/cell_metrics.parquet",
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
        "logs/qc/{sample}.log",
    benchmark:
        "benchmarks/qc/{sample}.tsv"
    conda:
        conda_env_for("qc")
    container:
        container_for("qc")
    threads: threads_for("qc")
    resources:
        gpu=gpus_for("qc"),
        mem_mb=memory_for("qc"),
        disk_mb=disk_for("qc"),
    params:
        backend=backend_for("qc"),
        format=counts_format,
        ambient_corrected=ambient_corrected,
        metadata=sample_metadata,
        duplicate_barcodes=config["duplicate_barcodes"],
        qc=config["qc"],
        doublets=config["doublets"],
        seed=config["seed"],
    script:
        "../scripts/qc.py"
