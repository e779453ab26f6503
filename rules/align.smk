# Samples given as FASTQ: STARsolo aligns them to the reference (its index built once), and
# its BAM, tagged with corrected cell barcodes, UMIs and genes, goes to rule count_umis.
rule star_index:
    input:
        fasta=config["reference"]["fasta"] or [],
        gtf=config["reference"]["gtf"] or [],
    output:
        index=directory("results/reference/star_index"),
    log:
        "logs/star_index/reference.log",
    benchmark:
        "benchmarks/star_index/reference.tsv"
    conda:
        "../envs/star.yaml"
    container:
        config["containers"]["cpu"]
    script:
        "../scripts/star_index.py"


rule align:
    input:
        unpack(fastq_inputs),
    output:
        bam="results/{sample}/star/Aligned.sortedByCoord.out.bam",
        log_final="results/{sample}/star/Log.final.out",
        features="results/{sample}/star/Solo.out/Gene/raw/features.tsv",
        summary=report(
            "results/{sample}/star/Solo.out/Gene/Summary.csv",
            caption="../report/star_summary.rst",
            category="Alignment",
            subcategory="{sample}",
        ),
        barcodes=report(
            "results/{sample}/star/Solo.out/Barcodes.stats",
            caption="../report/star_barcodes.rst",
            category="Alignment",
            subcategory="{sample}",
        ),
    log:
        "logs/align/{sample}.log",
    benchmark:
        "benchmarks/align/{sample}.tsv"
    conda:
        "../envs/star.yaml"
    container:
        config["containers"]["cpu"]
    params:
        chemistry=sample_chemistry,
        align=config["align"],
    script:
        "../scripts/align.py"
