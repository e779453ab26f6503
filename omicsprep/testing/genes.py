"""Gene names shared by the generators, deterministic from the number of genes.

13 mitochondrial genes (``MT-``), then 80 ribosomal genes (``RPL``/``RPS``), then 4 hemoglobin
genes, then ``GENE00000``...: the counts of :mod:`~omicsprep.testing.generate` and the raw
droplets of :mod:`~omicsprep.testing.droplets` are drawn with these genes in these places.
"""

from __future__ import annotations

N_MITO = 13
N_RIBO = 80
HEMOGLOBIN = ("HBB", "HBA1", "HBA2", "HBD")


def gene_names(n_genes: int) -> list[str]:
    """Mitochondrial, ribosomal and hemoglobin genes first, then ``GENE00000``..."""
    mito = [f"MT-G{i}" for i in range(N_MITO)]
    ribo = [f"RP{'L' if i % 2 else 'S'}{i}" for i in range(N_RIBO)]
    rest = [f"GENE{i:05d}" for i in range(n_genes - N_MITO - N_RIBO - len(HEMOGLOBIN))]
    return [*mito, *ribo, *HEMOGLOBIN, *rest]
