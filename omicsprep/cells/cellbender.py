"""CellBender ``remove-background`` as an ambient RNA method: its command line.

CellBender (Fleming et al. 2023) is run as its own program, in its own environment
(``envs/cellbender.yaml``); :func:`omicsprep.io.cellbender.read_cellbender` reads what it
writes, and :func:`omicsprep.cells.ambient.aligned_counts` aligns that to our cells. It
writes ``ckpt.tar.gz`` (and, with Jupyter on the path, ``tmp.report.ipynb``) into its
working directory, whatever ``--output`` says, and resumes from a checkpoint it finds there:
run each sample in a folder of its own.
"""

from __future__ import annotations

from pathlib import Path

# CellBender's own default (argparser.py, --fpr): the share of true counts it may remove.
DEFAULT_FPR = 0.01
# CellBender's default number of training epochs (argparser.py, --epochs).
DEFAULT_EPOCHS = 150


def remove_background_command(
    raw: str | Path,
    output: str | Path,
    *,
    expected_cells: int | None = None,
    total_droplets: int | None = None,
    epochs: int = DEFAULT_EPOCHS,
    learning_rate: float | None = None,
    fpr: float = DEFAULT_FPR,
    posterior_batch_size: int | None = None,
    projected_ambient_count_threshold: float | None = None,
    cuda: bool = False,
    cpu_threads: int | None = None,
) -> list[str]:
    """The argv of ``cellbender remove-background`` (CellBender 0.4.0) on a raw matrix.

    Parameters
    ----------
    raw
        The raw (unfiltered) matrix, every barcode including the empty droplets, in a
        format CellBender reads (10x HDF5 or MatrixMarket folder, h5ad, loom, ...).
    output
        The corrected matrix to write (``.h5``); CellBender writes its other files
        (``*_filtered.h5``, ``*_cell_barcodes.csv``, ``*_metrics.csv``, ``*_posterior.h5``,
        ``*.pdf``, ``*.log``) beside it, named after it.
    expected_cells
        A rough number of cells (within a factor of 2); CellBender estimates it when ``None``.
    total_droplets
        How many barcodes, by descending UMI count, are analysed (may hold cells); those
        past it are taken as surely empty. CellBender picks it when ``None``; it must be
        smaller than the number of barcodes with counts.
    epochs
        Training epochs (CellBender's default 150; its docs advise at least 150 for a
        converged model).
    learning_rate
        The lower learning rate of the one-cycle schedule; CellBender's 1e-4 when ``None``.
    fpr
        Target false positive rate: the share of true (cell) counts that may be removed
        with the background; 0.01 is CellBender's default.
    posterior_batch_size
        Droplets per batch when sampling the posterior; CellBender's 128 when ``None``
        (larger is faster where the GPU's memory allows).
    projected_ambient_count_threshold
        Only features expected to hold at least this many ambient counts over all cells are
        modelled (the others are left as they are); CellBender's 0.1 when ``None`` (larger
        is faster).
    cuda
        Train on the GPU.
    cpu_threads
        PyTorch threads on the CPU; all logical cores when ``None``.

    Returns
    -------
    The argv, paths made absolute so that it can run in a folder of its own.

    Raises
    ------
    ValueError
        ``output`` does not end in ``.h5``, or a number is out of its range.
    """
    output = Path(output)
    if output.suffix != ".h5":
        raise ValueError(f"CellBender writes an .h5 file; output {output} does not end in .h5")
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    if not 0 <= fpr < 1:
        raise ValueError(f"fpr must be in [0, 1), got {fpr}")
    argv = [
        "cellbender",
        "remove-background",
        "--input",
        str(Path(raw).absolute()),
        "--output",
        str(output.absolute()),
        "--epochs",
        str(epochs),
        "--fpr",
        str(fpr),
    ]
    if expected_cells is not None:
        argv += ["--expected-cells", str(expected_cells)]
    if total_droplets is not None:
        argv += ["--total-droplets-included", str(total_droplets)]
    if learning_rate is not None:
        argv += ["--learning-rate", str(learning_rate)]
    if posterior_batch_size is not None:
        argv += ["--posterior-batch-size", str(posterior_batch_size)]
    if projected_ambient_count_threshold is not None:
        argv += ["--projected-ambient-count-threshold", str(projected_ambient_count_threshold)]
    if cpu_threads is not None:
        argv += ["--cpu-threads", str(cpu_threads)]
    if cuda:
        argv.append("--cuda")
    return argv
