"""STAR command lines: the genome index and STARsolo's alignment and counting.

Pure builders: they return the argument list for :func:`subprocess.run`; nothing is run
or checked here (see :mod:`omicsprep.align.checks`).
"""

from __future__ import annotations

import math
from pathlib import Path

from omicsprep.align.chemistry import Chemistry

SAM_ATTRIBUTES = ("NH", "HI", "nM", "AS", "CR", "UR", "CB", "UB", "GX", "GN", "sS", "sQ", "sM")
GENE_FEATURES = ("Gene", "GeneFull")
UMI_DEDUP = ("1MM_Directional_UMItools", "1MM_All", "1MM_Directional", "1MM_CR", "Exact", "NoDedup")


def sa_index_bases(genome_length: int) -> int:
    """STAR's ``--genomeSAindexNbases`` for a genome: ``min(14, log2(length)/2 - 1)``, rounded down.

    STAR's manual (section 2.2.5, small genomes) gives the formula; 14, STAR's default, suits
    genomes of 1 Gb and more. Rounded down, never above the formula: too large a value makes
    STAR crash or hang on small genomes (nf-core's STAR_GENOMEGENERATE rounds to nearest).
    """
    return max(1, min(14, math.floor(math.log2(max(genome_length, 2)) / 2 - 1)))


def genome_generate_command(
    *,
    fasta: Path,
    gtf: Path,
    index_dir: Path,
    threads: int,
    genome_length: int,
    read_length: int | None = None,
) -> list[str]:
    """``STAR --runMode genomeGenerate`` for a FASTA and its GTF.

    Parameters
    ----------
    fasta, gtf
        The genome and its annotation, uncompressed (STAR reads neither gzipped).
    index_dir
        The index folder (created by the caller); STAR's Log.out is written into it.
    threads
        ``--runThreadN``.
    genome_length
        Total bases of the FASTA (:func:`omicsprep.align.checks.check_reference`), for
        ``--genomeSAindexNbases``.
    read_length
        The cDNA reads' length: ``--sjdbOverhang`` is one less (STAR's manual); STAR's
        default (100) when ``None``.

    Notes
    -----
    STAR's temporary folder is ``<index_dir>/_STARtmp``; STAR refuses to start when it exists,
    and leaves it behind on failure: the caller removes it.
    """
    command = [
        "STAR",
        "--runMode",
        "genomeGenerate",
        "--runThreadN",
        str(threads),
        "--genomeDir",
        str(index_dir),
        "--genomeFastaFiles",
        str(fasta),
        "--sjdbGTFfile",
        str(gtf),
        "--genomeSAindexNbases",
        str(sa_index_bases(genome_length)),
        "--outFileNamePrefix",
        f"{index_dir}/",
        "--outTmpDir",
        str(Path(index_dir) / "_STARtmp"),
    ]
    if read_length is not None:
        command += ["--sjdbOverhang", str(max(1, read_length - 1))]
    return command


def solo_command(
    *,
    index_dir: Path,
    fastq_1: list[Path],
    fastq_2: list[Path],
    chemistry: Chemistry,
    whitelist: Path | list[Path] | None,
    out_prefix: Path | str,
    threads: int,
    umi_dedup: str = "1MM_Directional_UMItools",
    gene_feature: str = "Gene",
    tmp_dir: Path,
    sort_ram_bytes: int | None = None,
) -> list[str]:
    """STARsolo: align the cDNA reads, count UMIs per cell and gene, write a sorted BAM.

    Parameters
    ----------
    index_dir
        The STAR index (:func:`genome_generate_command`).
    fastq_1, fastq_2
        Barcode+UMI reads and cDNA reads, one file per lane, in the same lane order;
        gzipped (``.gz``) or not: with any ``.gz`` among them, STAR reads every file through
        ``gzip -cdf``, which passes plain files through.
    chemistry
        The read layout (:func:`omicsprep.align.chemistry.chemistry`).
    whitelist
        The barcode whitelist, uncompressed (STAR reads it as text); a list of one file per
        segment for a ``CB_UMI_Complex`` layout; ``None`` for no whitelist (Drop-seq).
    out_prefix
        STAR's ``--outFileNamePrefix``, used verbatim: ``<out_prefix>Aligned.sortedByCoord.out.bam``,
        ``<out_prefix>Solo.out/``, ``<out_prefix>Log.out`` ... For files inside a folder pass
        ``f"{folder}/"`` (a :class:`~pathlib.Path` drops the trailing ``/``).
    threads
        ``--runThreadN``.
    umi_dedup
        ``--soloUMIdedup``: ``1MM_Directional_UMItools`` (UMI-tools' directional),
        ``1MM_All``, ``1MM_Directional``, ``1MM_CR``, ``Exact``, ``NoDedup``.
    gene_feature
        ``Gene`` (exonic reads, matching the transcripts; single-cell) or ``GeneFull``
        (exons and introns; single-nucleus): the feature listed first in ``--soloFeatures``,
        which is the one whose genes the BAM's GX/GN tags carry. Both matrices are written
        either way.
    tmp_dir
        ``--outTmpDir``: must not exist (STAR refuses to start); the caller removes it.
    sort_ram_bytes
        ``--limitBAMsortRAM``; STAR's default (the index's size) when ``None``.

    Notes
    -----
    STAR 2.7.10b, found on the synthetic fixture (tests/test_star.py) and in STAR's source:

    - The BAM's GX/GN carry the genes of the *first* of ``--soloFeatures``
      (ParametersSolo.cpp: ``samAttrFeature = featureFirst``), hence ``gene_feature`` first.
      Reads not assigned to exactly one gene of that feature, multi-gene reads included,
      have ``GX:Z:-`` (never a list of genes).
    - ``CB:Z:-`` (and ``UB:Z:-``) marks reads whose barcode matches no whitelist entry and
      reads whose UMI is a homopolymer or holds an N; they keep their GX. ``CR``/``UR`` hold
      the raw barcode and UMI, ``UB`` the UMI after STARsolo's own correction.
    - ``1MM_Directional_UMItools`` is a single greedy pass (SoloFeature_collapseUMIall.cpp):
      UMIs by decreasing reads, each joins the first earlier UMI one mismatch away with at
      least 2n-1 reads. UMI-tools' directional grows clusters breadth-first, also through
      later UMIs, so a chain of single-read UMIs a-b-c (a and c two mismatches apart) is one
      molecule for UMI-tools and :func:`omicsprep.reads.counting.count_umis`, two for STAR:
      2-3 of ~6,000 cell x gene entries on the fixture.
    - ``--soloBarcodeReadLength 0`` lets read 1 be longer than barcode+UMI (10x read 1 is
      often 28+ bases); a *shorter* read 1 is then not reported by STAR at all:
      :func:`omicsprep.align.checks.check_fastq_pairs` catches it.
    """
    if gene_feature not in GENE_FEATURES:
        raise ValueError(f"gene_feature {gene_feature!r}; expected one of {GENE_FEATURES}")
    if umi_dedup not in UMI_DEDUP:
        raise ValueError(f"umi_dedup {umi_dedup!r}; expected one of {UMI_DEDUP}")
    features = [gene_feature, *(f for f in GENE_FEATURES if f != gene_feature)]
    gzipped = [str(path).endswith(".gz") for path in [*fastq_1, *fastq_2]]
    command = [
        "STAR",
        "--runThreadN",
        str(threads),
        "--genomeDir",
        str(index_dir),
        "--readFilesIn",
        ",".join(map(str, fastq_2)),
        ",".join(map(str, fastq_1)),
        *(["--readFilesCommand", "gzip", "-cdf"] if any(gzipped) else []),
        "--outFileNamePrefix",
        str(out_prefix),
        "--outTmpDir",
        str(tmp_dir),
        "--outSAMtype",
        "BAM",
        "SortedByCoordinate",
        "--outSAMattributes",
        *SAM_ATTRIBUTES,
        "--soloType",
        chemistry.solo_type,
        *_barcode_layout(chemistry),
        "--soloBarcodeReadLength",
        "0",
        "--soloCBwhitelist",
        *_whitelists(whitelist),
        "--soloCBmatchWLtype",
        "1MM_multi_Nbase_pseudocounts" if chemistry.solo_type == "CB_UMI_Simple" else "1MM",
        "--soloUMIdedup",
        umi_dedup,
        "--soloFeatures",
        *features,
        "--soloCellFilter",
        "None",
        "--soloStrand",
        chemistry.strand,
    ]
    if sort_ram_bytes is not None:
        command += ["--limitBAMsortRAM", str(sort_ram_bytes)]
    return command


def _barcode_layout(chemistry: Chemistry) -> list[str]:
    if chemistry.solo_type == "CB_UMI_Simple":
        return [
            "--soloCBstart",
            str(chemistry.cb_start),
            "--soloCBlen",
            str(chemistry.cb_length),
            "--soloUMIstart",
            str(chemistry.umi_start),
            "--soloUMIlen",
            str(chemistry.umi_length),
        ]
    return ["--soloCBposition", *chemistry.cb_positions, "--soloUMIposition", chemistry.umi_position]


def _whitelists(whitelist: Path | list[Path] | None) -> list[str]:
    if whitelist is None:
        return ["None"]
    return [str(path) for path in whitelist] if isinstance(whitelist, list) else [str(whitelist)]
