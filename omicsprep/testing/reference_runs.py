"""Reference tools (R's DropletUtils) run by the tests, their outputs kept by their inputs in a mutation run.

A mutation run (``tests/mutation/mutate.py``) runs a module's tests once per mutant, hundreds of
times, and each run would ask R again for the same outputs (DropletUtils' barcode ranks 20 s,
emptyDrops more). With ``OMICSPREP_REFERENCE_CACHE`` naming a folder, a command's outputs are
kept there under a digest of the command and of its folder's files, and later runs of the same
command on the same files get them back without running it. Unset (the suite, CI), every
command runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

CACHE_VARIABLE = "OMICSPREP_REFERENCE_CACHE"


@cache
def missing_r_package(package: str) -> str | None:
    """Why R's ``package`` cannot be run here (for a test's skip), or ``None`` where it can.

    Parameters
    ----------
    package
        The R package's name (``DropletUtils``, ``SoupX``).

    Returns
    -------
    The reason, naming what installs it; ``None`` where Rscript finds the package.
    """
    if shutil.which("Rscript") is None:
        return "Rscript is not installed (tests/reference/install.sh installs R with DropletUtils)"
    installed = ["Rscript", "-e", f"quit(status = !nzchar(system.file(package = '{package}')))"]
    if subprocess.run(installed, capture_output=True, check=False).returncode:
        return f"the R package {package} is not installed (tests/reference/install.sh installs DropletUtils only)"
    return None


def run_reference(command: list[str], folder: Path, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(command, **kwargs)`` for a command that reads and writes files in ``folder``.

    Parameters
    ----------
    command
        The command; paths in ``folder`` may appear in it.
    folder
        Where its inputs are, and where it writes its outputs (files directly in it).
    **kwargs
        For ``subprocess.run`` (``check``, ``capture_output``, ``text``).

    Returns
    -------
    The completed run, or the one kept for the same command and inputs.
    """
    cache = os.environ.get(CACHE_VARIABLE)
    if not cache:
        return subprocess.run(command, check=kwargs.pop("check", False), **kwargs)
    before = _files(folder)
    kept = Path(cache) / _digest(command, folder, before)
    if (kept / "run.json").is_file():
        record = json.loads((kept / "run.json").read_text())
        for name in record["outputs"]:
            shutil.copy2(kept / "outputs" / name, folder / name)
        completed = subprocess.CompletedProcess(command, record["returncode"], record["stdout"], record["stderr"])
    else:
        completed = subprocess.run(command, check=False, **{k: v for k, v in kwargs.items() if k != "check"})
        outputs = sorted(name for name, digest in _files(folder).items() if before.get(name) != digest)
        staging = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
        (staging / "outputs").mkdir(parents=True, exist_ok=True)
        for name in outputs:
            shutil.copy2(folder / name, staging / "outputs" / name)
        record = {"returncode": completed.returncode, "stdout": completed.stdout, "stderr": completed.stderr}
        (staging / "run.json").write_text(json.dumps({**record, "outputs": outputs}))
        try:
            staging.rename(kept)  # whole or not at all; a worker beside this one may have kept it first
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    if kwargs.get("check") and completed.returncode:
        raise subprocess.CalledProcessError(completed.returncode, command, completed.stdout, completed.stderr)
    return completed


def _files(folder: Path) -> dict[str, str]:
    """Each file directly in ``folder``, by name: its content's digest."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir()) if path.is_file()
    }


def _digest(command: list[str], folder: Path, files: dict[str, str]) -> str:
    """The command (``folder`` left out of its paths, a temporary folder's name) and its inputs, as one digest."""
    words = [word.replace(str(folder), "{folder}") for word in command]
    return hashlib.sha256(json.dumps([words, files]).encode()).hexdigest()
