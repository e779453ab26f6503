"""Record R SoupX's results on the generated droplets that tests/test_soupx.py checks against.

Run from the repository root, with R and SoupX installed:
``PYTHONPATH=$PWD python tests/data/soupx/make_reference.py`` (writes ``reference.npz`` beside this file).
tests/test_soupx.py imports the input, the checksum and the R driver from here, so that the
recording, its live re-check and the parity tests all see the same data.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import io, sparse

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
REFERENCE = HERE / "reference.npz"
REGENERATE = "PYTHONPATH=$PWD python tests/data/soupx/make_reference.py"

sys.path.insert(0, str(REPO / "benchmarks"))
from omicsprep.testing.droplets import generate_raw_droplets  # noqa: E402

# The generator's markers are so abundant that the soup puts them into most cells of other
# types: their tf-idf stays below SoupX's default 1.0 (R SoupX finds no marker either).
TFIDF_MIN = 0.5
# Corrected counts of every cell would take ~12 MB; every 16th cell keeps the file under 1 MB.
RECORDED_CELL_STRIDE = 16
CORRECTIONS = ("by_cluster", "by_cell", "by_cluster_cell_rho")


@dataclass(frozen=True)
class Droplets:
    raw: sparse.csr_matrix
    cells: sparse.csr_matrix
    is_cell: np.ndarray
    cell_type: np.ndarray
    ambient_fraction: np.ndarray
    markers: list[np.ndarray]

    @property
    def cell_rho(self) -> np.ndarray:
        """A contamination fraction per cell, 5% to 20%."""
        return np.linspace(0.05, 0.2, self.cells.shape[0])

    @property
    def recorded_cells(self) -> np.ndarray:
        return np.arange(0, self.cells.shape[0], RECORDED_CELL_STRIDE)


@dataclass(frozen=True)
class SoupxResult:
    soup: np.ndarray
    rho: float
    rho_half_max: tuple[float, float]
    markers: list[int]
    corrected: dict[str, sparse.csr_matrix]  # CORRECTIONS -> the recorded cells' corrected counts


def generate_droplets() -> Droplets:
    generated = generate_raw_droplets(500, 20_000, 2_000, seed=0)
    is_cell = generated.truth["is_cell"].to_numpy()
    return Droplets(
        raw=generated.counts,
        cells=generated.counts[is_cell],
        is_cell=is_cell,
        cell_type=generated.truth["cell_type"].to_numpy()[is_cell],
        ambient_fraction=generated.truth["ambient_fraction"].to_numpy()[is_cell],
        markers=generated.markers,
    )


def input_checksum(droplets: Droplets) -> str:
    """SHA-256 of everything SoupX is given: raw counts, which droplets are cells, clusters, rho per cell."""
    digest = hashlib.sha256()
    raw = droplets.raw
    digest.update(repr((raw.shape, str(raw.dtype), TFIDF_MIN)).encode())
    for array in (raw.indptr, raw.indices, raw.data, droplets.is_cell, droplets.cell_type, droplets.cell_rho):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _read_entries(path: Path, shape: tuple[int, int]) -> sparse.csr_matrix:
    cell, gene, value = np.loadtxt(path, skiprows=1, unpack=True, ndmin=2)
    return sparse.csr_matrix((value, (cell.astype(int), gene.astype(int))), shape=shape)


def run_soupx(droplets: Droplets) -> tuple[SoupxResult, str]:
    """R SoupX's soup profile, autoEstCont and adjustCounts on ``droplets``, and SoupX's version."""
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        io.mmwrite(work / "raw.mtx", droplets.raw)
        io.mmwrite(work / "cells.mtx", droplets.cells)
        np.savetxt(work / "clusters.txt", droplets.cell_type, fmt="%d")
        np.savetxt(work / "cell_rho.txt", droplets.cell_rho, fmt="%.17g")
        command = ["Rscript", str(HERE / "soupx.R"), str(work), str(TFIDF_MIN)]
        subprocess.run(command, check=True, capture_output=True)
        rho, low, high = np.loadtxt(work / "rho.txt")
        result = SoupxResult(
            soup=np.loadtxt(work / "soup.txt"),
            rho=float(rho),
            rho_half_max=(float(low), float(high)),
            markers=[int(name[1:]) for name in (work / "markers.txt").read_text().split()],
            corrected={
                name: _read_entries(work / f"{name}.txt", droplets.cells.shape)[droplets.recorded_cells]
                for name in CORRECTIONS
            },
        )
        return result, (work / "version.txt").read_text().strip()


def save_reference(result: SoupxResult, *, checksum: str, soupx_version: str, path: Path = REFERENCE) -> None:
    matrices = {
        f"{name}_{part}": getattr(result.corrected[name], part)
        for name in CORRECTIONS
        for part in ("data", "indices", "indptr")
    }
    np.savez_compressed(
        path,
        input_sha256=np.array(checksum),
        soupx_version=np.array(soupx_version),
        soup=result.soup,
        rho=np.array(result.rho),
        rho_half_max=np.array(result.rho_half_max),
        markers=np.array(result.markers),
        **matrices,
    )


def load_reference(path: Path = REFERENCE) -> tuple[SoupxResult, str]:
    """The recorded SoupX result and the checksum of the input it was recorded on."""
    with np.load(path) as saved:
        n_genes = saved["soup"].shape[0]
        corrected = {
            name: sparse.csr_matrix(
                (saved[f"{name}_data"], saved[f"{name}_indices"], saved[f"{name}_indptr"]),
                shape=(saved[f"{name}_indptr"].shape[0] - 1, n_genes),
            )
            for name in CORRECTIONS
        }
        low, high = saved["rho_half_max"]
        result = SoupxResult(
            soup=saved["soup"],
            rho=float(saved["rho"]),
            rho_half_max=(float(low), float(high)),
            markers=saved["markers"].tolist(),
            corrected=corrected,
        )
        return result, str(saved["input_sha256"])


def main() -> None:
    droplets = generate_droplets()
    result, version = run_soupx(droplets)
    save_reference(result, checksum=input_checksum(droplets), soupx_version=version)
    print(f"wrote {REFERENCE} ({REFERENCE.stat().st_size:,} bytes) with SoupX {version}")


if __name__ == "__main__":
    main()
