"""Read layouts of droplet chemistries: where the cell barcode and the UMI sit on read 1.

The built-ins follow STARsolo's documentation (github.com/alexdobin/STAR, docs/STARsolo.md:
10x V2 is CB16 UMI10, V3 needs ``--soloUMIlen 12``), nf-core/scrnaseq's STARsolo protocol
table (assets/protocols.json: 10XV2 ``--soloUMIlen 10``, 10XV3 and 10XV4 ``--soloUMIlen 12``,
all ``CB_UMI_Simple`` with 10x's whitelists; dropseq ``CB_UMI_Simple`` without one) and
cellgeni/STARsolo (lib/platform_dropseq.sh: CB12 UMI8, ``--soloCBwhitelist None``;
lib/platform_10x.sh: 5' libraries counted from read 2 alone need ``--soloStrand Reverse``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from omicsprep.errors import InputError

SoloType = Literal["CB_UMI_Simple", "CB_UMI_Complex"]
Strand = Literal["Forward", "Reverse", "Unstranded"]


@dataclass(frozen=True)
class Chemistry:
    """Where read 1 holds the cell barcode and the UMI, and how STARsolo counts the library.

    Positions are 1-based, as STAR's ``--soloCBstart``/``--soloUMIstart``.

    Attributes
    ----------
    name
        The chemistry's name in the sample sheet.
    solo_type
        ``CB_UMI_Simple`` (one barcode segment, ``cb_start``/``cb_length``) or
        ``CB_UMI_Complex`` (several segments: ``cb_positions``/``umi_position``, STAR's
        ``startAnchor_startDistance_endAnchor_endDistance`` strings, 0-based).
    cb_start, cb_length, umi_start, umi_length
        The barcode's and the UMI's first base (1-based) and length. For a complex layout,
        ``cb_length`` is the segments' total and ``cb_start``/``umi_start`` are 0.
    strand
        STAR's ``--soloStrand``: ``Forward`` when the cDNA read has the RNA's sense (3'
        chemistries), ``Reverse`` when antisense (10x 5' read 2).
    whitelist_expected
        Whether barcodes come from a known list (10x) or are found from the data (Drop-seq).
    cb_positions, umi_position
        STAR's position strings of a complex layout; empty for a simple one. Lengths and
        :attr:`barcode_read_length` count only the segments anchored at the read's start
        (anchor 0): those anchored at its end or at an adapter have no fixed position.
    """

    name: str
    solo_type: SoloType
    cb_start: int
    cb_length: int
    umi_start: int
    umi_length: int
    strand: Strand = "Forward"
    whitelist_expected: bool = True
    cb_positions: tuple[str, ...] = ()
    umi_position: str = ""

    @property
    def barcode_read_length(self) -> int:
        """The shortest read 1 that holds the whole barcode and UMI."""
        if self.solo_type == "CB_UMI_Simple":
            return max(self.cb_start + self.cb_length, self.umi_start + self.umi_length) - 1
        ends = [_position_end(position) for position in (*self.cb_positions, self.umi_position)]
        return max(ends) + 1

    def cell_barcode(self, read: str) -> str:
        """The cell barcode of a simple layout's read 1 (segments joined for a complex one)."""
        if self.solo_type == "CB_UMI_Simple":
            return read[self.cb_start - 1 : self.cb_start - 1 + self.cb_length]
        return "".join(read[_position_start(p) : _position_end(p) + 1] for p in self.cb_positions)


BUILT_IN: dict[str, Chemistry] = {
    "10xv2": Chemistry("10xv2", "CB_UMI_Simple", cb_start=1, cb_length=16, umi_start=17, umi_length=10),
    "10xv3": Chemistry("10xv3", "CB_UMI_Simple", cb_start=1, cb_length=16, umi_start=17, umi_length=12),
    # GEM-X 3' v4: the v3 layout, a new whitelist (nf-core's 10XV4 uses --soloUMIlen 12).
    "10xv4": Chemistry("10xv4", "CB_UMI_Simple", cb_start=1, cb_length=16, umi_start=17, umi_length=12),
    # 5' v2 counted from read 2 alone (R1 = CB16 UMI10 + TSO): read 2 is antisense.
    "10x5p": Chemistry(
        "10x5p", "CB_UMI_Simple", cb_start=1, cb_length=16, umi_start=17, umi_length=10, strand="Reverse"
    ),
    "dropseq": Chemistry(
        "dropseq", "CB_UMI_Simple", cb_start=1, cb_length=12, umi_start=13, umi_length=8, whitelist_expected=False
    ),
}
CUSTOM = "custom"
KNOWN = (*BUILT_IN, CUSTOM)

# STAR's anchors that count from the read's start: 0 (read start); 1-3 need the read end or
# an adapter, whose position a read-length check cannot know.
_POSITION = re.compile(r"^0_(\d+)_0_(\d+)$")
_ANY_POSITION = re.compile(r"^[0-3]_-?\d+_[0-3]_-?\d+$")


def chemistry(name: str, *, custom: dict | None = None) -> Chemistry:
    """The read layout of a chemistry named in the sample sheet.

    Parameters
    ----------
    name
        One of ``10xv2``, ``10xv3``, ``10xv4``, ``10x5p``, ``dropseq`` or ``custom``.
    custom
        For ``custom``: either ``cb_start``, ``cb_length``, ``umi_start``, ``umi_length``
        (1-based; a single barcode segment, STARsolo's ``CB_UMI_Simple``) or
        ``cb_position`` (a list of STAR ``--soloCBposition`` strings, one per segment,
        e.g. ``["0_0_0_7", "0_26_0_33"]``) and ``umi_position`` (STAR's
        ``--soloUMIposition`` string) for ``CB_UMI_Complex``; optionally ``strand``
        (``Forward``, ``Reverse``, ``Unstranded``) and ``whitelist`` (bool, default true).

    Raises
    ------
    InputError
        An unknown name, or a custom layout that is incomplete or malformed.
    """
    if name in BUILT_IN:
        return BUILT_IN[name]
    if name != CUSTOM:
        raise InputError(f"unknown chemistry {name!r}; known: {', '.join(KNOWN)}")
    if not custom:
        raise InputError("chemistry 'custom' needs its barcode and UMI positions in the config")
    return _custom(custom)


def _custom(spec: dict) -> Chemistry:
    strand = spec.get("strand", "Forward")
    if strand not in ("Forward", "Reverse", "Unstranded"):
        raise InputError(f"custom chemistry: strand {strand!r}; expected Forward, Reverse or Unstranded")
    whitelist = bool(spec.get("whitelist", True))
    if "cb_position" in spec:
        positions = spec["cb_position"]
        positions = (positions,) if isinstance(positions, str) else tuple(positions)
        umi = spec.get("umi_position", "")
        malformed = [p for p in (*positions, umi) if not _ANY_POSITION.match(str(p))]
        if malformed or not positions:
            raise InputError(
                f"custom chemistry: positions {malformed or positions} are not STAR's "
                "startAnchor_startDistance_endAnchor_endDistance strings"
            )
        cb_length = sum(_position_end(p) - _position_start(p) + 1 for p in positions if _POSITION.match(p))
        umi_length = _position_end(umi) - _position_start(umi) + 1 if _POSITION.match(umi) else 0
        return Chemistry(
            CUSTOM,
            "CB_UMI_Complex",
            cb_start=0,
            cb_length=cb_length,
            umi_start=0,
            umi_length=umi_length,
            strand=strand,
            whitelist_expected=whitelist,
            cb_positions=positions,
            umi_position=umi,
        )
    missing = [key for key in ("cb_start", "cb_length", "umi_start", "umi_length") if key not in spec]
    if missing:
        raise InputError(f"custom chemistry: missing {', '.join(missing)} (or cb_position and umi_position)")
    values = {key: int(spec[key]) for key in ("cb_start", "cb_length", "umi_start", "umi_length")}
    if min(values.values()) < 1:
        raise InputError(f"custom chemistry: positions and lengths start at 1 ({values})")
    return Chemistry(
        CUSTOM,
        "CB_UMI_Simple",
        cb_start=values["cb_start"],
        cb_length=values["cb_length"],
        umi_start=values["umi_start"],
        umi_length=values["umi_length"],
        strand=strand,
        whitelist_expected=whitelist,
    )


def _position_start(position: str) -> int:
    """First base (0-based) of a read-start-anchored STAR position; 0 for other anchors."""
    match = _POSITION.match(position)
    return int(match.group(1)) if match else 0


def _position_end(position: str) -> int:
    """Last base (0-based) of a read-start-anchored STAR position; 0 for other anchors."""
    match = _POSITION.match(position)
    return int(match.group(2)) if match else 0
