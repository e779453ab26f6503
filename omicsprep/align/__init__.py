"""From FASTQ to counts with STARsolo: read layouts, STAR command lines, and input checks.

:mod:`~omicsprep.align.chemistry` says where a chemistry puts the cell barcode and UMI,
:mod:`~omicsprep.align.star` builds STAR's command lines (run by the pipeline as
subprocesses), :mod:`~omicsprep.align.checks` checks FASTQ pairs, gzip integrity, the
reference and the whitelist, and turns STAR's fatal errors into sentences. STARsolo's
outputs are read by :mod:`omicsprep.io.star`.
"""

from omicsprep.align.checks import (
    check_fastq_pairs,
    check_read_counts,
    check_reference,
    check_whitelist,
    fastq_read_count,
    gzip_intact,
    star_failure,
    whitelist_match_rate,
)
from omicsprep.align.chemistry import BUILT_IN, KNOWN, Chemistry, chemistry
from omicsprep.align.star import genome_generate_command, sa_index_bases, solo_command

__all__ = [
    "BUILT_IN",
    "KNOWN",
    "Chemistry",
    "check_fastq_pairs",
    "check_read_counts",
    "check_reference",
    "check_whitelist",
    "chemistry",
    "fastq_read_count",
    "genome_generate_command",
    "gzip_intact",
    "sa_index_bases",
    "solo_command",
    "star_failure",
    "whitelist_match_rate",
]
