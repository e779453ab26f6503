# Samples given as reads (BAM/SAM or a molecule table, or FASTQ aligned by rule align): UMI
# deduplication into the raw droplets' count matrix, whose cells rule call_cells calls.
rule count_umis:
    input:
        unpack(reads_inputs),
    output:
        h5ad="results/{sample}/umi_counts.h5ad",
        table="results/{sample}/umi_counts.tsv",
    log:
        "logs/count_umis/{sample}.log",
    benchmark:
        "benchmarks/count_umis/{sample}.tsv"
    conda:
        conda_env_for("count_umis")
    container:
        container_for("count_umis")
    resources:
        gpu=gpus_for("count_umis"),
        mem_mb=memory_for("count_umis"),
        disk_mb=disk_for("count_umis"),
    params:
        backend=backend_for("count_umis"),
        umi=umi_settings,
        format=reads_format,
    script:
        "../scripts/count_umis.py"
