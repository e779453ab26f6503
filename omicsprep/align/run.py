"""Running STAR: a genome index, and STARsolo on a sample's FASTQs.

Inputs are checked before STAR starts (hours of alignment should not end in a confusing
failure), STAR works in a partial folder beside the outputs, and only a finished run is moved
into place: a failed or cancelled run leaves no partial BAM or index behind.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from omicsprep.align import checks, star
from omicsprep.align.chemistry import Chemistry, chemistry
from omicsprep.errors import InputError
from omicsprep.options import AlignOptions, CustomChemistryOptions

log = logging.getLogger(__name__)

STAR_MISSING = (
    "STAR is not installed: run with --sdm conda (envs/star.yaml), or install STAR 2.7.10b "
    "(Debian/Ubuntu: apt-get install rna-star; bioconda: star=2.7.10b)"
)


def build_index(*, fasta: Path, gtf: Path, index_dir: Path, threads: int) -> None:
    """Build STAR's genome index of ``fasta`` with the genes of ``gtf`` into ``index_dir``.

    Raises
    ------
    InputError
        STAR missing; GTF chromosomes absent from the FASTA; STAR refusing the reference.
    """
    genome_length = checks.check_reference(fasta, gtf)
    fasta, gtf = Path(fasta).resolve(), Path(gtf).resolve()  # STAR runs in the partial folder
    partial = _partial_folder(index_dir)
    try:
        plain_fasta, plain_gtf = (_decompressed(path, partial / "input") for path in (fasta, gtf))
        command = star.genome_generate_command(
            fasta=plain_fasta, gtf=plain_gtf, index_dir=partial, threads=threads, genome_length=genome_length
        )
        _run_star(command, star_log=partial / "Log.out", cwd=partial, path=fasta)
        shutil.rmtree(partial / "input", ignore_errors=True)
        _move_into_place(partial, index_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def align_sample(
    *,
    index_dir: Path,
    fastq_1: Sequence[Path],
    fastq_2: Sequence[Path],
    chemistry: Chemistry,
    whitelist: Path | None,
    out_dir: Path,
    threads: int,
    options: AlignOptions,
) -> None:
    """Align a sample's read pairs with STARsolo into ``out_dir``.

    Writes STAR's coordinate-sorted BAM (``Aligned.sortedByCoord.out.bam``, with cell, UMI and
    gene tags), ``Log.final.out`` and STARsolo's ``Solo.out`` (``Gene`` and ``GeneFull`` raw
    matrices, ``Summary.csv``, ``Barcodes.stats``). Every FASTQ is read through once beside
    STAR, so that a truncated file or a cDNA file with fewer reads (which STAR reads without
    complaint) fails the run.

    Raises
    ------
    InputError
        STAR missing; read pairs whose names or read counts differ; read 1 shorter than
        barcode and UMI; a whitelist that matches under ``options.min_whitelist_match`` of the
        barcodes; a truncated gzip; STAR refusing the input.
    """
    # Absolute paths: STAR runs in the partial folder.
    fastq_1, fastq_2 = [Path(path).resolve() for path in fastq_1], [Path(path).resolve() for path in fastq_2]
    index_dir, whitelist = Path(index_dir).resolve(), whitelist and Path(whitelist).resolve()
    checks.check_fastq_pairs(fastq_1, fastq_2, chemistry=chemistry)
    if whitelist is not None:
        checks.check_whitelist(fastq_1, whitelist, chemistry=chemistry, min_rate=options.min_whitelist_match)
    partial = _partial_folder(out_dir)
    try:
        command = star.solo_command(
            index_dir=index_dir,
            fastq_1=fastq_1,
            fastq_2=fastq_2,
            chemistry=chemistry,
            whitelist=None if whitelist is None else _decompressed(whitelist, partial / "input"),
            out_prefix=f"{partial}/",
            threads=threads,
            umi_dedup=options.umi_dedup,
            gene_feature=options.gene_feature,
            tmp_dir=partial / "_STARtmp",
        )
        # STAR stops silently at the end of a shorter cDNA file, or of a gzip cut between
        # records: every file is read through beside it, on a core of its own.
        with ThreadPoolExecutor(max_workers=1) as pool:
            read_counts = pool.submit(checks.check_read_counts, fastq_1, fastq_2, threads=2)
            _run_star(command, star_log=partial / "Log.out", cwd=partial, path=fastq_2[0])
            log.info("reads per lane: %s", read_counts.result())
        shutil.rmtree(partial / "input", ignore_errors=True)
        _move_into_place(partial, out_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def sample_chemistry(name: str, *, custom: CustomChemistryOptions) -> Chemistry:
    """The read layout of a sample's chemistry.

    ``custom`` (section ``align.custom``) is chemistry ``custom``'s: several barcode segments
    when ``cb_position`` lists them, else one.
    """
    layout = asdict(custom)
    complex_keys = ("cb_position", "umi_position")
    simple_keys = ("cb_start", "cb_length", "umi_start", "umi_length")
    drop = simple_keys if custom.cb_position else complex_keys
    return chemistry(name, custom={key: value for key, value in layout.items() if key not in drop})


def _run_star(command: list[str], *, star_log: Path, cwd: Path, path: Path) -> None:
    """Run STAR, its output in the rule's log; a failure as one sentence from STAR's log."""
    if shutil.which(command[0]) is None:
        raise InputError(STAR_MISSING)
    log.info("running %s", " ".join(command))
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    log.info("STAR's output:\n%s%s", result.stdout, result.stderr)
    if result.returncode == 0:
        return
    star_text = star_log.read_text(errors="replace") if star_log.is_file() else ""
    problem = checks.star_failure(star_text + result.stdout + result.stderr)
    if problem:
        raise InputError(problem, path=path)
    raise RuntimeError(f"STAR failed (exit {result.returncode}); its log:\n{star_text[-3000:]}{result.stderr[-2000:]}")


def _partial_folder(folder: Path) -> Path:
    """An empty folder beside ``folder`` for a run's outputs until it finishes."""
    partial = Path(folder).resolve().with_name(Path(folder).name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def _move_into_place(partial: Path, folder: Path) -> None:
    """Move a finished run's files into ``folder``, STAR's temporary folder left out.

    Each file is renamed, so none appears half-written.
    """
    shutil.rmtree(partial / "_STARtmp", ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(partial, folder, dirs_exist_ok=True, copy_function=os.replace)


def _decompressed(path: Path, folder: Path) -> Path:
    """``path`` itself when plain, else its decompressed copy in ``folder``.

    STAR reads plain FASTA and GTF only.
    """
    if not checks.is_gzip(path):
        return path
    folder.mkdir(exist_ok=True)
    plain = folder / path.name.removesuffix(".gz")
    with gzip.open(path, "rb") as source, plain.open("wb") as target:
        shutil.copyfileobj(source, target, length=1 << 22)
    return plain
