# Samples given as reads (BAM/SAM or a molecule table): UMI deduplication into the count
# matrix that rule qc reads.
rule count_umis:
    input:
        reads=reads_input,
    output:
        h5ad="results/{sample}/umi_counts.h5ad",
        table="results/{sample}/umi_counts.tsv",
    log:
        "logs/count_umis/{sample}.log",
    benchmark:
        "benchmarks/count_umis/{sample}.tsv"
    conda:
        conda_env_for("count_umis")
    resources:
        gpu=gpus_for("count_umis"),
    params:
        backend=backend_for("count_umis"),
        umi=config["umi"],
        format=reads_format,
    script:
        "../scripts/count_umis.py"
