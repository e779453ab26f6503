"""A GPU rule's imports in fresh processes: rapids-singlecell, the pipeline, both as a rule does.

    python -m benchmarks imports [--repeats 3] [--out DIR]

Cases, each ``--repeats`` times in a new process (seconds from the interpreter's start to
rapids-singlecell being usable, and the process's wall time):

- ``plain``: ``import rapids_singlecell``;
- ``pipeline``: ``import omicsprep.rna.pipeline`` (AnnData, scanpy, SciPy, Numba, scikit-learn);
- ``rule``: as a rule running qc and cluster in one process starts: ``prepare_gpu`` (context, rapids-singlecell, cuML,
  pylibcugraph in a thread) while the main thread imports ``omicsprep.rna.pipeline``, then
  waiting for rapids-singlecell.

Then the modules that took longest in a ``rule`` process (``-X importtime``, cumulative).
Prints a table and writes it (``import_bench.tsv``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

READY = "import json, time; print(json.dumps({'ready': time.perf_counter() - START}))"
START = "import time; START = time.perf_counter()\n"
CASES = {
    "plain": "import rapids_singlecell",
    "pipeline": "import omicsprep.rna.pipeline",
    "rule": (
        "from omicsprep.backend import gpu_module, prepare_gpu, resolve_backend\n"
        "prepare_gpu(resolve_backend('gpu'), modules=('rapids_singlecell', 'cuml', 'pylibcugraph'))\n"
        "import omicsprep.rna.pipeline\n"
        "gpu_module('rapids_singlecell')"
    ),
}


def run_case(code: str) -> dict:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", START + code + "\n" + READY], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    wall = time.perf_counter() - start
    return json.loads(result.stdout.strip().splitlines()[-1]) | {"process": wall}


def slowest_imports(code: str, *, top: int) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    rows = []
    for line in result.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) == 3 and fields[1].strip().isdigit():
            rows.append((int(fields[1]), fields[2].rstrip()))
    return [f"{micros / 1e6:6.2f} s {name}" for micros, name in sorted(rows, reverse=True)[:top]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("import_bench"))


def run(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    run_case(CASES["rule"])  # the first process after an install writes the bytecode caches
    rows = []
    for repeat in range(args.repeats):
        for case, code in CASES.items():
            times = run_case(code)
            rows.append({"case": case, "repeat": repeat, "ready_s": times["ready"], "process_s": times["process"]})
    table = (
        pd.DataFrame(rows).groupby("case", sort=False)[["ready_s", "process_s"]].agg(["median", "min", "max"]).round(2)
    )
    print(table.to_string())
    table.to_csv(args.out / "import_bench.tsv", sep="\t")
    print("slowest imports (cumulative) of case rule:", *slowest_imports(CASES["rule"], top=args.top), sep="\n")
