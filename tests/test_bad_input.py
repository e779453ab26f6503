"""Hostile input and conditions: each problem is named on one line, and nothing partial is left.

Nor anything temporary, after a killed write or on a full disk.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anndata as ad
import pandas as pd
import pytest
import yaml
from conftest import DROPLETS_H5, PBMC_H5, REPO
from test_workflow import snakemake, write_sheet

from omicsprep import io
from omicsprep.errors import InputError

# The first four barcodes of the chr21 PBMCs, sorted.
REPEATED = ["AAACCCAAGGAGAGTA-1", "AAACGCTTCAGCCCAG-1", "AAAGAACAGACGACTG-1", "AAAGAACCAATGGCAG-1"]


@pytest.fixture(scope="module")
def repeated_barcodes(tmp_path_factory) -> Path:
    """The chr21 PBMCs with four barcodes given to a second cell each."""
    counts = io.read_counts(PBMC_H5)
    names = counts.obs_names.to_list()
    assert sorted(names[:4]) == REPEATED
    for offset, barcode in enumerate(REPEATED):
        names[-1 - offset] = barcode
    counts.obs_names = names
    path = tmp_path_factory.mktemp("repeated") / "counts.h5ad"
    counts.write_h5ad(path)
    return path


def test_repeated_barcodes_are_refused_with_their_count_and_first_ones(repeated_barcodes):
    with pytest.raises(InputError) as caught:
        io.read_counts(repeated_barcodes)
    message = str(caught.value)
    assert message.startswith(f"file '{repeated_barcodes}': 4 barcode(s) name more than one cell")
    assert all(barcode in message for barcode in sorted(REPEATED)[:3])
    assert "duplicate_barcodes: rename" in message


def test_repeated_barcodes_are_renamed_and_logged_when_asked(repeated_barcodes, caplog):
    with caplog.at_level(logging.WARNING, logger="omicsprep"):
        counts = io.read_counts(repeated_barcodes, duplicate_barcodes="rename")
    assert counts.obs_names.is_unique
    assert {f"{barcode}-1" for barcode in REPEATED} <= set(counts.obs_names)
    assert "4 repeated barcode(s) renamed" in caplog.text


@pytest.fixture(scope="module")
def spreadsheet_run(tmp_path_factory, repeated_barcodes):
    """One workflow run (qc only) over a sheet as a spreadsheet exports it, with repeated barcodes.

    The sheet is a CSV file as Excel's "CSV UTF-8" writes one: a byte-order mark, CRLF line
    ends, a quoted value holding a comma and separator-only trailing rows; it has a metadata
    column, and one sample's barcodes repeat.
    """
    workdir = tmp_path_factory.mktemp("spreadsheet")
    sheet = workdir / "samples.csv"
    rows = ["sample,input,condition", f'pbmc,{PBMC_H5},"stimulated, 6 h"', f"repeats,{repeated_barcodes},control"]
    sheet.write_bytes(b"\xef\xbb\xbf" + "\r\n".join([*rows, ",,", ",,", ""]).encode())
    targets = ["results/pbmc/qc.h5ad", "results/repeats/qc.h5ad"]
    result = snakemake(
        *targets, "--cores", "2", "--keep-going", "--config", f"samples={sheet}", "backend=cpu", workdir=workdir
    )
    return workdir, result


def test_a_spreadsheet_export_is_read_and_its_metadata_copied_into_obs(spreadsheet_run):
    workdir, _ = spreadsheet_run
    obs = ad.read_h5ad(workdir / "results" / "pbmc" / "qc.h5ad").obs
    assert (obs["condition"] == "stimulated, 6 h").all()
    assert (obs["sample"] == "pbmc").all()


def test_repeated_barcodes_stop_their_sample_with_one_line(spreadsheet_run, repeated_barcodes):
    workdir, result = spreadsheet_run
    assert result.returncode != 0
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "omicsprep error" in line]
    assert errors == [
        (
            f"omicsprep error: sample 'repeats': file '{repeated_barcodes}': 4 barcode(s) name more than "
            f"one cell ('{sorted(REPEATED)[0]}', '{sorted(REPEATED)[1]}', '{sorted(REPEATED)[2]}', ...); "
            "set duplicate_barcodes: rename in the config to rename the repeats"
        )
    ]
    assert not any((workdir / "results" / "repeats").rglob("*"))


def test_a_sample_that_qc_empties_names_the_filter_and_keeps_its_cell_metrics_beside_the_log(tmp_path):
    sheet = write_sheet(tmp_path / "s.tsv", [f"pbmc\t{PBMC_H5}"])
    result = snakemake(
        "results/pbmc/qc.h5ad",
        "--cores",
        "1",
        "--config",
        f"samples={sheet}",
        "backend=cpu",
        "qc={filter: {min_genes: 100000}}",
        workdir=tmp_path,
    )
    assert result.returncode != 0
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "omicsprep error" in line]
    table = tmp_path / "logs" / "qc" / "pbmc.cell_metrics.parquet"
    assert len(errors) == 1
    assert errors[0].startswith(
        "omicsprep error: sample 'pbmc': only 0 cells left after cell filtering (at least 30 needed): "
        "min_genes 100000 removed 1,107 of 1,107 cells; median per input cell: 19 genes, 29 UMIs"
    )
    assert errors[0].endswith(f"(each cell's metrics and fail reason: {table.relative_to(tmp_path)})")
    metrics = pd.read_parquet(table)
    assert len(metrics) == 1107 and (metrics["fail_reason"] == "min_genes").all()
    assert not any((tmp_path / "results" / "pbmc").rglob("*.*"))  # no partial output


def dry_run_error(tmp_path: Path, *config: str) -> str:
    """The one-line error of a dry run with ``config``; fails the test if it succeeds."""
    result = snakemake("-n", "--config", *config, workdir=tmp_path)
    assert result.returncode != 0, result.stdout[-2000:]
    return result.stdout + result.stderr


@pytest.mark.parametrize(
    ("header", "row", "message"),
    [
        ("sample\tinput\tfragment", f"a\t{PBMC_H5}\tx", "unknown column 'fragment': did you mean 'fragments'?"),
        ("Sample\tinput", f"a\t{PBMC_H5}", "unknown column 'Sample': did you mean 'sample'?"),
        # The near misses furthest from their column (difflib's ratio 0.80 to 0.89).
        ("sample\tinput\tbatches", f"a\t{PBMC_H5}\tb1", "unknown column 'batches': did you mean 'batch'?"),
        ("sample\tinput\tpeak", f"a\t{PBMC_H5}\tx", "unknown column 'peak': did you mean 'peaks'?"),
        ("sample\tinput\tchemestry", f"a\t{PBMC_H5}\t10xv3", "unknown column 'chemestry': did you mean 'chemistry'?"),
        ("sample\tinput\tadt_empties", f"a\t{PBMC_H5}\tx", "unknown column 'adt_empties': did you mean 'adt_empty'?"),
        (
            "sample\tinput\tformat",
            f"a\t{PBMC_H5}\th5",
            (
                "line 3 (sample 'a'): column 'format': 'h5' is not one of ['', '10x_h5', '10x_mtx', 'h5ad', 'zarr', "
                "'bam', 'sam', 'molecules']"
            ),
        ),
        ("sample\tinput", f"a b\t{PBMC_H5}", "line 3 (sample 'a b'): column 'sample': 'a b' does not match"),
        ("sample\tinput", f"a\t{PBMC_H5}\textra", "line 3 has 3 fields, the header 2"),
        ("sample\tinput\tdonor name", f"a\t{PBMC_H5}\td1", "column name 'donor name': metadata columns are named"),
    ],
)
def test_sheet_problems_name_the_line_sample_and_column(tmp_path, header, row, message):
    sheet = write_sheet(tmp_path / "s.tsv", ["# a comment line", row], header=header)
    stderr = dry_run_error(tmp_path, f"samples={sheet}")
    assert f"sample sheet '{sheet}': {message}" in stderr
    # no schema dump
    assert "row 0" not in stderr
    assert "properties" not in stderr


def test_a_comma_separated_sheet_not_named_csv_is_read_as_one(tmp_path):
    sheet = write_sheet(
        tmp_path / "s.txt", ["# a comment, with a comma", f"a,{PBMC_H5},x"], header="sample,input,fragment"
    )
    stderr = dry_run_error(tmp_path, f"samples={sheet}")
    assert f"sample sheet '{sheet}': unknown column 'fragment': did you mean 'fragments'?" in stderr


def test_usual_metadata_columns_are_not_taken_for_near_misses(tmp_path):
    # treatment is as close to fragments (0.67) as a near miss may not be.
    metadata = ["donor", "condition", "tissue", "treatment", "replicate", "patient", "age", "sex", "time", "group"]
    sheet = write_sheet(
        tmp_path / "s.tsv",
        [f"a\t{PBMC_H5}\t" + "\t".join("x" * len(metadata))],
        header="\t".join(["sample", "input", *metadata]),
    )
    result = snakemake("-n", "--config", f"samples={sheet}", workdir=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_nested_command_line_values_are_read_as_yaml(tmp_path):
    sheet = write_sheet(tmp_path / "s.tsv", [f"pbmc\t{PBMC_H5}"])
    result = snakemake(
        "-n",
        "--config",
        f"samples={sheet}",
        "markers={resolution: 0.5}",
        "qc={filter: {min_genes: 50, max_pct_mt: 12.5}}",
        "doublets={enabled: false}",
        workdir=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    stderr = dry_run_error(tmp_path, f"samples={sheet}", "markers={resolution: high}")
    assert "config: markers.resolution: 'high' is not of type 'number'" in stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("seed=-5", "config: seed: -5 is less than the minimum of 0"),
        ("seed=4294967296", "config: seed: 4294967296 is greater than the maximum of 4294967295"),
        ("cells={seed: -1}", "config: cells.seed: -1 is less than the minimum of 0"),
        ("merge={enabled: true}", "config: merge.enabled needs two RNA samples or more; the sheet has 1 (pbmc)"),
        (
            "pca={n_comps: 20}",
            "config: neighbors.n_pcs 30 is more than pca.n_comps 20: the neighbour graph can use only the components",
        ),
    ],
)
def test_settings_the_steps_cannot_take_are_refused_before_any_job(tmp_path, setting, message):
    sheet = write_sheet(tmp_path / "s.tsv", [f"pbmc\t{PBMC_H5}"])
    assert message in dry_run_error(tmp_path, f"samples={sheet}", setting)


def test_the_shipped_config_is_for_real_samples_and_the_demo_has_its_own():
    shipped = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    schema = yaml.safe_load((REPO / "config" / "schemas" / "config.schema.yaml").read_text())
    assert (
        shipped["qc"]["filter"]["min_genes"]
        == schema["properties"]["qc"]["properties"]["filter"]["properties"]["min_genes"]["default"]
        == 200
    )
    assert shipped["atac"]["genes"] is None
    assert shipped["samples"] == "config/samples.tsv"
    assert not [value for value in leaves(shipped) if "resources/demo" in str(value)]
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n"], cwd=REPO, capture_output=True, text=True)
    assert "sample sheet 'config/samples.tsv' lists no samples: add one row per sample" in result.stdout
    demo = yaml.safe_load((REPO / "resources" / "demo" / "config.yaml").read_text())
    assert demo["qc"]["filter"]["min_genes"] == 10
    assert (REPO / demo["samples"]).is_file()
    assert (REPO / demo["atac"]["genes"]).is_file()


def leaves(mapping: dict) -> list:
    """Every value of a nested mapping."""
    return [value for item in mapping.values() for value in (leaves(item) if isinstance(item, dict) else [item])]


# A writer that stops inside an output's temporary file: it has written some bytes, tells
# the test it is there, and waits to be killed.
STALLED_WRITER = """
import sys, time
from omicsprep import io
with io.atomic_path(sys.argv[1]) as tmp:
    tmp.write_bytes(b"partial")
    print(tmp, flush=True)
    time.sleep(60)
"""


def stalled_writer(output: Path) -> tuple[subprocess.Popen, Path]:
    writer = subprocess.Popen([sys.executable, "-c", STALLED_WRITER, str(output)], stdout=subprocess.PIPE, text=True)
    temporary = Path(writer.stdout.readline().strip())
    assert temporary.is_file()
    assert temporary.parent == output.parent
    return writer, temporary


def test_a_write_killed_by_sigkill_leaves_nothing_after_the_rerun(tmp_path, pbmc):
    output = tmp_path / "results" / "pbmc" / "qc.h5ad"
    writer, temporary = stalled_writer(output)
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    # SIGKILL runs no clean-up
    assert temporary.is_file()
    assert not output.exists()
    io.write_h5ad(pbmc, output)  # the rule's next run
    assert sorted(output.parent.iterdir()) == [output]


SCRIPT_WRITING = """
import sys, time
from omicsprep import io
from omicsprep.jobs import run_script

def main():
    with io.atomic_path(sys.argv[1]) as tmp:
        tmp.write_bytes(b"partial")
        print(tmp, flush=True)
        time.sleep(60)

run_script(main, log_path=sys.argv[2], sample="pbmc")
"""


def test_a_cancelled_rule_removes_its_temporary_file(tmp_path):
    output = tmp_path / "qc.h5ad"
    script = subprocess.Popen(
        [sys.executable, "-c", SCRIPT_WRITING, str(output), str(tmp_path / "qc.log")], stdout=subprocess.PIPE, text=True
    )
    temporary = Path(script.stdout.readline().strip())
    assert temporary.is_file()
    script.send_signal(signal.SIGTERM)  # what Snakemake and SLURM send to a cancelled job
    assert script.wait(timeout=30) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == [tmp_path / "qc.log"]


@pytest.fixture
def small_disk(tmp_path):
    """``tmp_path/results`` on a 400 kB tmpfs: room for the chr21 PBMCs' QC table, not their h5ad."""
    results = tmp_path / "results"
    results.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(results)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield tmp_path
    subprocess.run(["umount", str(results)], check=True)


def test_a_full_disk_is_one_line_and_the_traceback_goes_to_the_log(small_disk):
    sheet = write_sheet(small_disk / "s.tsv", [f"pbmc\t{PBMC_H5}"])
    result = snakemake(
        "results/pbmc/qc.h5ad",
        "--cores",
        "2",
        "--config",
        f"samples={sheet}",
        "backend=cpu",
        "h5ad_compression=null",  # compressed, it fits
        workdir=small_disk,
    )
    assert result.returncode != 0
    console = result.stdout + result.stderr
    errors = [line for line in console.splitlines() if "space" in line.lower()]
    assert len(errors) == 1, console[-5000:]
    # The h5ad does not fit: refused before writing when its estimate already exceeds the free
    # space, else when the disk fills (here HDF5's overhead makes the small file outgrow it).
    assert re.match(
        r"omicsprep error: sample 'pbmc': results/pbmc/qc\.h5ad: (not enough|no) space left on the device: about ",
        errors[0],
    ), errors[0]
    assert f"free on {small_disk / 'results'} (tmpfs)" in errors[0]
    assert "Traceback" not in console
    assert "HDF5" not in console
    log = (small_disk / "logs" / "qc" / "pbmc.log").read_text()
    assert "Traceback" in log
    assert "qc.h5ad: " in log and " space left on the device: about " in log
    assert not any((small_disk / "results").rglob("*.*"))  # no temporary or partial output


WRITE_BIG = """
import sys
import numpy as np
from anndata import AnnData
from omicsprep import io
cells, compression = int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None
values = np.random.default_rng(0).random((cells, 200), dtype=np.float32)  # gzip cannot shrink it much
io.write_h5ad(AnnData(values), sys.argv[1], compression=compression)
"""


@pytest.mark.parametrize(
    ("cells", "compression", "problem"),
    [
        # 800 kB of values and 72 kB of cell and gene names, on a 400 kB tmpfs: refused before writing
        (1000, None, "not enough space left on the device: about 871.8 kB needed"),
        # gzip: expected at a fifth of that, it does not fit either (4,000 cells)
        (4000, "gzip", "not enough space left on the device: about 691.0 kB needed"),
        # expected to fit, but random values hardly compress: the write fails, nothing is left
        (1000, "gzip", "no space left on the device: about "),
    ],
)
def test_out_of_space_names_what_is_needed_and_free(small_disk, cells, compression, problem):
    output = small_disk / "results" / "big.h5ad"
    command = [sys.executable, "-c", WRITE_BIG, str(output), str(cells), *([compression] if compression else [])]
    result = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    assert "OutOfSpaceError: " in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert f"big.h5ad: {problem}" in line and " kB free on " in line, line
    assert list((small_disk / "results").iterdir()) == []


RUN_OUT_OF_MEMORY = """
import sys
import h5py
import numpy as np
from anndata import AnnData
from omicsprep import io
from omicsprep.jobs import run_script

def no_memory(*args, **kwargs):
    raise MemoryError  # as h5py or NumPy raise it when an allocation fails

h5py.Group.create_dataset = no_memory

def main():
    io.write_h5ad(AnnData(np.ones((1000, 200), dtype=np.float32)), sys.argv[1])

run_script(main, log_path=sys.argv[2], sample="pbmc")
"""


def test_running_out_of_memory_while_writing_is_one_line(tmp_path):
    output, log = tmp_path / "results" / "qc.h5ad", tmp_path / "qc.log"
    result = subprocess.run(
        [sys.executable, "-c", RUN_OUT_OF_MEMORY, str(output), str(log)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"omicsprep error: sample 'pbmc': {output}: out of memory while writing (about 871.8 kB to write)"
    ]
    assert "MemoryError" in log.read_text()  # the traceback, in the log
    assert list(output.parent.iterdir()) == []  # the temporary file is gone


def test_the_readmes_example_sheet_is_read_as_it_says(tmp_path):
    """README.md's example rows (a filtered matrix, raw droplets, FASTQ), their files made: each is its kind."""
    from omicsprep.configuration import read_yaml
    from omicsprep.sheet import load_sample_sheet

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("\n    sample\tinput") + 1 :].split("\n\n")[0]
    (tmp_path / "s.tsv").write_text("\n".join(line.removeprefix("    ") for line in block.splitlines()) + "\n")
    (tmp_path / "data" / "s1").mkdir(parents=True)
    (tmp_path / "data" / "s2").mkdir()
    shutil.copy(PBMC_H5, tmp_path / "data" / "s1" / "filtered_feature_bc_matrix.h5")
    shutil.copy(DROPLETS_H5, tmp_path / "data" / "s2" / "raw_feature_bc_matrix.h5")
    for read in ("R1", "R2"):
        (tmp_path / "data" / f"s3_{read}.fastq.gz").write_bytes(gzip.compress(b"@r\nACGT\n+\nIIII\n"))
    schema = read_yaml((REPO / "config" / "schemas" / "samples.schema.yaml").read_text())
    with contextlib.chdir(tmp_path):  # the rows' paths are relative, as users write them
        samples = load_sample_sheet("s.tsv", schema=schema)
    kinds = samples[["format", "raw_format", "chemistry", "donor"]].to_dict("index")
    assert kinds == {
        "filtered": {"format": "10x_h5", "raw_format": "", "chemistry": "", "donor": "D1"},
        "droplets": {"format": "", "raw_format": "10x_h5", "chemistry": "", "donor": "D2"},
        "reads": {"format": "", "raw_format": "", "chemistry": "10xv3", "donor": "D3"},
    }


def test_the_sheet_and_the_config_are_checked_by_the_package_as_the_workflow_checks_them(tmp_path):
    """omicsprep.sheet and omicsprep.configuration, called as rules/common.smk calls them."""
    from omicsprep.configuration import check_settings_together, checked_config, read_yaml
    from omicsprep.sheet import load_sample_sheet

    schema = read_yaml((REPO / "config" / "schemas" / "samples.schema.yaml").read_text())
    sheet = tmp_path / "samples.csv"
    sheet.write_text(f'sample,input,donor\npbmc,{PBMC_H5},"D1, left"\n')
    samples = load_sample_sheet(sheet, schema=schema)
    assert list(samples.index) == ["pbmc"] and samples.loc["pbmc", "donor"] == "D1, left"
    assert samples.loc["pbmc", "format"] == "10x_h5" and samples.loc["pbmc", "adt"] == ""
    sheet.write_text(f"sample,raw\ndroplets,{DROPLETS_H5}\n")  # no input column: raw droplets need none
    droplets = load_sample_sheet(sheet, schema=schema).loc["droplets"]
    assert (droplets["input"], droplets["format"], droplets["raw_format"]) == ("", "", "10x_h5")
    sheet.write_text(f"sample,input\npbmc,{PBMC_H5}\nb c,{PBMC_H5}\n")
    with pytest.raises(InputError, match=rf"^sample sheet '{sheet}': line 3 \(sample 'b c'\): column 'sample'"):
        load_sample_sheet(sheet, schema=schema)
    config_schema = read_yaml((REPO / "config" / "schemas" / "config.schema.yaml").read_text())
    config = checked_config({"seed": "7", "pca": "{n_comps: 20}"}, config_schema)  # as --config passes them
    assert (config["seed"], config["pca"]["n_comps"], config["neighbors"]["n_pcs"]) == (7, 20, 30)
    with pytest.raises(InputError, match=r"^config: neighbors.n_pcs 30 is more than pca.n_comps 20"):
        check_settings_together(config, rna_samples=["pbmc", "other"])
    with pytest.raises(InputError, match=r"^config: seed: -1 is less than the minimum of 0"):
        checked_config({"seed": -1}, config_schema)
