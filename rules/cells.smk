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
    container:
        container_for("call_cells")
    resources:
        gpu=gpus_for("call_cells"),
        mem_mb=memory_for("call_cells"),
        disk_mb=disk_for("call_cells"),
    params:
        backend=backend_for("call_cells"),
        raw_format=raw_format,
        filtered_format=counts_format,
        duplicate_barcodes=config["duplicate_barcodes"],
        cells=config["cells"],
    script:
        "../scripts/call_cells.py"


# cells.ambient.method cellbender: CellBender's remove-background on the raw droplets, in its
# own environment and a run folder of its own (it writes a checkpoint into the working folder
# and resumes from any it finds there), whose corrected matrix rule call_cells reads.
rule cellbender:
    input:
        raw=raw_input,
    output:
        h5="results/{sample}/cells/cellbender.h5",
    log:
        "logs/cellbender/{sample}.log",
    benchmark:
        "benchmarks/cellbender/{sample}.tsv"
    conda:
        "../envs/cellbender.yaml"
    resources:
        gpu=gpus_for("cellbender"),
        mem_mb=memory_for("cellbender"),
        disk_mb=disk_for("cellbender"),
    params:
        command=cellbender_command,
        run_dir=cellbender_run_dir,
        backend=backend_for("cellbender"),
    shell:
        """
        command -v cellbender >/dev/null || {{ echo "omicsprep error: sample '{wildcards.sample}': cells.ambient.method cellbender needs CellBender: run with --sdm conda (envs/cellbender.yaml) or install cellbender" | tee {log} >&2; exit 1; }}
        rm -rf {params.run_dir} && mkdir -p {params.run_dir} && trap 'rm -rf {params.run_dir}' EXIT
        cuda=""
        if [ {params.backend} = gpu ] || {{ [ {params.backend} = auto ] && python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; }}; then cuda=--cuda; fi
        (cd {params.run_dir} && {params.command} $cuda) >{log} 2>&1
        mv {params.run_dir}/cellbender.h5 {output.h5}
        """
