"""The sample sheet: read, checked, and each sample's columns filled in.

Every problem names the sheet, the line or sample and the column, on one line.
"""

from __future__ import annotations

import csv
import difflib
import re
from pathlib import Path
from typing import Any

import pandas as pd
from jsonschema import Draft202012Validator

from omicsprep.errors import InputError
from omicsprep.io import READ_FORMATS, resolve_format

REQUIRED_COLUMNS = ("sample",)
# Each sample needs one of input, raw, fastq_1 or adt (modality_problem), not each column.
OPTIONAL_COLUMNS = (
    "input",
    "format",
    "batch",
    "raw",
    "fastq_1",
    "fastq_2",
    "chemistry",
    "adt",
    "adt_empty",
    "fragments",
    "peaks",
)
KNOWN_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
# Filled in from the others when the sheet is read (not sample metadata).
DERIVED_COLUMNS = ("raw_format",)


def load_sample_sheet(path: str | Path, *, schema: dict) -> pd.DataFrame:
    """Read and check the sample sheet.

    Tab-separated, or comma-separated (nf-core's sheets) where the file ends in ``.csv`` or
    its first line has commas and no tab. Spreadsheet exports are accepted: a UTF-8
    byte-order mark is dropped, and so are blank rows (separators only). Lines starting
    with ``#`` are comments. Columns other than the known ones are sample metadata, copied
    into ``obs``; a near-miss of a known column (``fragment``, ``Input``) is refused.

    Parameters
    ----------
    path
        The sheet.
    schema
        The sheet's JSON schema (``config/schemas/samples.schema.yaml``), checked row by row.

    Returns
    -------
    One row per sample, indexed by its name, with every known column (empty where not given)
    and ``raw_format``.

    Raises
    ------
    InputError
        The first problem, naming the sheet, the line or sample and the column.
    """
    sheet = Path(path)
    where = f"sample sheet {str(sheet)!r}"
    if not sheet.is_file():
        raise InputError(f"{where} does not exist (config key 'samples')")
    with sheet.open(newline="", encoding="utf-8-sig") as handle:
        lines = [
            (number, fields)
            for number, fields in enumerate(csv.reader(handle, delimiter=sheet_delimiter(sheet)), start=1)
            if any(field.strip() for field in fields) and not fields[0].startswith("#")
        ]
    if not lines:
        raise InputError(f"{where} is empty")
    (_, header), rows = lines[0], lines[1:]
    check_columns(header, where)
    if not rows:
        raise InputError(f"{where} lists no samples: add one row per sample")
    for number, fields in rows:
        if any(field.strip() for field in fields[len(header) :]):
            raise InputError(f"{where}: line {number} has {len(fields)} fields, the header {len(header)}")
    # Short rows (trailing empty fields left out) are padded.
    samples = pd.DataFrame(
        [(fields + [""] * len(header))[: len(header)] for _, fields in rows], columns=header, dtype=str
    )
    samples.index = [number for number, _ in rows]
    if "merged" in set(samples["sample"]):
        raise InputError(f"{where}: 'merged' is reserved (results/merged/ holds all samples)")
    repeated = sorted(samples.loc[samples["sample"].duplicated(), "sample"].unique())
    if repeated:
        raise InputError(f"{where}: samples listed more than once: {repeated}")
    validator = Draft202012Validator(schema)
    for number, row in samples.iterrows():
        for error in validator.iter_errors({column: row[column] for column in KNOWN_COLUMNS if column in row}):
            column = error.absolute_path[0] if error.absolute_path else None
            described = f" ({error.schema['description']})" if error.validator == "pattern" else ""
            raise InputError(
                f"{where}: line {number} (sample {row['sample']!r}): column {column!r}: {error.message}{described}"
            )
    for column in OPTIONAL_COLUMNS:
        if column not in samples:
            samples[column] = ""
    for row in samples.itertuples():
        problem = modality_problem(row)
        if problem:
            raise InputError(f"{where}: sample {row.sample!r}: {problem}")
        try:
            if row.input:
                samples.loc[row.Index, "format"] = resolve_format(row.input, fmt=row.format)
            samples.loc[row.Index, "raw_format"] = resolve_format(row.raw) if row.raw else ""
        except InputError as exc:
            raise InputError(f"{where}: {exc.for_sample(row.sample)}") from None
        if row.raw and samples.loc[row.Index, "format"] in READ_FORMATS:
            raise InputError(
                f"{where}: sample {row.sample!r}: input holds reads, whose counts are raw droplets already: "
                "leave column raw empty"
            )
        if samples.loc[row.Index, "raw_format"] in READ_FORMATS:
            raise InputError(
                f"{where}: sample {row.sample!r}: raw file {row.raw!r} holds reads: give reads in column input"
            )
    return samples.set_index("sample", drop=False)


def sheet_delimiter(sheet: Path) -> str:
    """A comma for a ``.csv`` sheet or one whose header has commas and no tab; else a tab."""
    if sheet.suffix.lower() == ".csv":
        return ","
    with sheet.open(encoding="utf-8-sig") as handle:
        header = next((line for line in handle if line.strip() and not line.startswith("#")), "")
    return "," if "," in header and "\t" not in header else "\t"


def check_columns(header: list[str], where: str) -> None:
    """Refuse repeated, missing and near-miss columns."""
    duplicated = sorted({name for name in header if header.count(name) > 1})
    if duplicated:
        raise InputError(f"{where}: duplicate columns {duplicated}")
    for name in header:
        if name in KNOWN_COLUMNS:
            continue
        near = [known for known in KNOWN_COLUMNS if known == name.strip().lower().replace("-", "_")]
        near = near or difflib.get_close_matches(name.lower(), KNOWN_COLUMNS, n=1, cutoff=0.75)
        if near:
            raise InputError(
                f"{where}: unknown column {name!r}: did you mean {near[0]!r}? (known columns: "
                f"{', '.join(KNOWN_COLUMNS)}; others are sample metadata, copied into obs)"
            )
        if not METADATA_NAME.fullmatch(name):
            raise InputError(
                f"{where}: column name {name!r}: metadata columns are named with letters, digits "
                "and '_', starting with a letter"
            )
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    if missing:
        raise InputError(f"{where}: missing columns {missing} (found {header})")


METADATA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def modality_problem(row: Any) -> str | None:
    """What is wrong with a sample's modality columns, or None."""
    if not row.input and not row.raw and not row.fastq_1 and not row.adt:
        return "neither input, raw or fastq_1 (RNA) nor adt (antibody tags) is given"
    if row.fragments and not (row.input or row.raw or row.fastq_1):
        return "column fragments needs column input, raw or fastq_1 (the cells are called on the RNA)"
    problem = fastq_problem(row)
    if problem:
        return problem
    needs = {"adt_empty": "adt", "peaks": "fragments"}
    for column, needed in needs.items():
        if getattr(row, column) and not getattr(row, needed):
            return f"column {column} needs column {needed}"
    for column in ("raw", "adt", "adt_empty", "fragments", "peaks"):
        path = getattr(row, column)
        if path and not Path(path).exists():
            return f"{column} file {path!r} does not exist"
    return None


def fastq_problem(row: Any) -> str | None:
    """What is wrong with a sample's FASTQ columns, or None."""
    given = [column for column in ("fastq_1", "fastq_2", "chemistry") if getattr(row, column)]
    if not given:
        return None
    missing = [column for column in ("fastq_1", "fastq_2", "chemistry") if column not in given]
    if missing:
        return f"column(s) {', '.join(given)} need column(s) {', '.join(missing)} too"
    if row.input or row.raw:
        return "give the RNA as FASTQ (fastq_1, fastq_2) or as input/raw, not both"
    barcode_reads, cdna_reads = lanes(row.fastq_1), lanes(row.fastq_2)
    if len(barcode_reads) != len(cdna_reads):
        return f"fastq_1 lists {len(barcode_reads)} file(s), fastq_2 {len(cdna_reads)}: one pair per lane"
    for path in barcode_reads + cdna_reads:
        if not Path(path).is_file():
            return f"FASTQ file {path!r} does not exist"
    return None


def lanes(paths: str) -> list[str]:
    """The files of a FASTQ column: one path, or several separated by ';' (lanes)."""
    return [path.strip() for path in paths.split(";") if path.strip()]
