# Samples given as aligned reads: UMI deduplication into a count matrix for rule qc.
rule count_umis:
    input:
        reads=reads_input,
    output:
        h5ad="results/{sample}/umi_counts.h5ad",
        table="results/{sample}/umi_counts.tsv",
    params:
        umi=config["umi"],
    log:
        "logs/count_umis/{sample}.log",
    benchmark:
        "benchmarks/count_umis/{sample}.tsv"
    conda:
        "../envs/cpu.yaml"
    script:
        "../scripts/count_umis.py"
