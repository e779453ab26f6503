# Samples with raw droplets (a raw column, or reads counted by count_umis): cells called among
# the barcodes, then ambient RNA removed from them, before qc.
rule call_cells:
    input:
        unpack(call_cells_inputs),
    output:
        h5ad="results/{sample}/cells/matrix.h5ad",
        barcodes="results/{sample}/cells/barcodes.parquet",
        knee=report(
            "results/{sample}/cells/knee.png",
            caption="../report/cells_knee.rst",
            category="Cells",
            subcategory="{sample}",
        ),
        ambient=report(
            "results/{sample}/cells/ambient.png",
            caption="../report/cells_ambient.rst",
            category="Cells",
            subcategory="{sample}",
        ),
    log:
        "logs/call_cells/{sample}.log",
    benchmark:
        "benchmarks/call_cells/{sample}.tsv"
    conda:
        conda_env_for("call_cells")
    resources:
        gpu=gpus_for("call_cells"),
    params:
        backend=backend_for("call_cells"),
        raw_format=raw_format,
        filtered_format=counts_format,
        duplicate_barcodes=config["duplicate_barcodes"],
        cells=config["cells"],
    script:
        "../scripts/call_cells.py"
