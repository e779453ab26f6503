"""Reads with cell, UMI and gene annotations, from BAM/SAM files, as integer-coded tables."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from omicsprep.errors import InputError
from omicsprep.umi import pack_umis

UmiSource = Literal["tag", "read_id", "umis"]


@dataclass
class ReadTable:
    """Reads as codes: ``reads`` has ``cell``, ``gene`` (int codes) and ``umi`` (packed)."""

    reads: pd.DataFrame
    cells: pd.Index
    genes: pd.Index
    skipped: Counter = field(default_factory=Counter)


def _umi_and_cell(read, *, source: UmiSource, cell_tag: str, umi_tag: str) -> tuple[str | None, str | None]:  # noqa: ANN001
    if source == "tag":
        cell = read.get_tag(cell_tag) if read.has_tag(cell_tag) else None
        umi = read.get_tag(umi_tag) if read.has_tag(umi_tag) else None
        return cell, umi
    if source == "umis":  # umis-style names: ...:CELL_<barcode>:UMI_<umi>:...
        fields = dict(part.split("_", 1) for part in read.query_name.split(":") if "_" in part)
        return fields.get("CELL"), fields.get("UMI")
    parts = read.query_name.split("_")  # umi_tools extract: <read>_<cell>_<umi>
    return (parts[-2] if len(parts) >= 3 else None), (parts[-1] if len(parts) >= 2 else None)


def read_bam(
    path: str | Path,
    *,
    cell_tag: str = "CB",
    umi_tag: str = "UB",
    gene_tag: str = "GX",
    umi_source: UmiSource = "tag",
    min_mapq: int = 0,
    skip_gene_regex: str = "^(__|Unassigned)",
    threads: int = 1,
) -> ReadTable:
    """Read the cell, UMI and gene of every usable read of a BAM/SAM file, in file order.

    Unmapped, secondary and supplementary reads, reads under ``min_mapq``, reads missing
    a cell, UMI or gene, genes matching ``skip_gene_regex``, reads assigned to several
    genes (``A;B`` or ``A,B``) and UMIs with N are skipped and counted in ``skipped``.
    Sorted input is not required.

    Raises
    ------
    InputError
        Unreadable or truncated file, no usable read, UMIs of mixed lengths.
    """
    import pysam

    path = Path(path)
    skip_gene = re.compile(skip_gene_regex) if skip_gene_regex else None
    skipped: Counter = Counter()
    cells, umis, genes = [], [], []
    try:
        with pysam.AlignmentFile(str(path), check_sq=False, threads=threads) as bam:
            for read in bam.fetch(until_eof=True):
                if read.is_unmapped or read.is_secondary or read.is_supplementary:
                    skipped["unmapped, secondary or supplementary"] += 1
                    continue
                if read.mapping_quality < min_mapq:
                    skipped["below min_mapq"] += 1
                    continue
                gene = read.get_tag(gene_tag) if read.has_tag(gene_tag) else None
                cell, umi = _umi_and_cell(read, source=umi_source, cell_tag=cell_tag, umi_tag=umi_tag)
                if gene is None or cell is None or umi is None:
                    skipped["missing cell, UMI or gene"] += 1
                    continue
                if skip_gene is not None and skip_gene.search(gene):
                    skipped["gene matches skip_gene_regex"] += 1
                    continue
                if ";" in gene or "," in gene:
                    skipped["several genes"] += 1
                    continue
                cells.append(cell)
                umis.append(umi)
                genes.append(gene)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot be read as BAM/SAM ({exc})", path=path) from exc
    if not cells:
        raise InputError(f"no usable read (skipped: {dict(skipped) or 'none'})", path=path)
    try:
        packed, valid = pack_umis(np.asarray(umis))
    except InputError as exc:
        raise InputError(exc.problem, path=path) from exc
    skipped["UMI with N"] += int((~valid).sum())
    cell_codes, cell_names = pd.factorize(np.asarray(cells)[valid])
    gene_codes, gene_names = pd.factorize(np.asarray(genes)[valid])
    reads = pd.DataFrame({"cell": cell_codes.astype(np.int32), "gene": gene_codes.astype(np.int32), "umi": packed[valid]})
    return ReadTable(reads=reads, cells=pd.Index(cell_names), genes=pd.Index(gene_names), skipped=skipped)
