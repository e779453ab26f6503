"""Errors that users are meant to read."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """Bad input: names the sample (when known), the file and the problem.

    Parameters
    ----------
    problem
        What is wrong, in one sentence.
    path
        The offending file or folder.
    sample
        The sample it belongs to, when known.
    """

    def __init__(self, problem: str, *, path: str | Path | None = None, sample: str | None = None) -> None:
        self.problem = problem
        self.path = None if path is None else str(path)
        self.sample = sample
        super().__init__(self._message())

    def __reduce__(self) -> tuple:
        # Rebuilt from what it was made of when raised in a rule's second process (pickled back).
        return partial(type(self), path=self.path, sample=self.sample), (self.problem,)

    def _message(self) -> str:
        where = []
        if self.sample is not None:
            where.append(f"sample {self.sample!r}")
        if self.path is not None:
            where.append(f"file {self.path!r}")
        return ": ".join([*where, self.problem])

    def for_sample(self, sample: str) -> InputError:
        """Return the same error with the sample named."""
        return InputError(self.problem, path=self.path, sample=sample)


class TooFewCellsError(InputError):
    """Too few cells left after a QC step; ``metrics`` is every input cell's QC metrics and fail reason.

    Parameters
    ----------
    problem
        Which filters removed how many cells, in one sentence.
    metrics
        The table the user looks at to loosen the settings (not kept when pickled).
    """

    def __init__(self, problem: str, *, metrics: Any = None, **where: Any) -> None:
        self.metrics = metrics
        super().__init__(problem, **where)


@contextlib.contextmanager
def naming_file(path: str | Path | None) -> Iterator[None]:
    """Name ``path`` in input errors raised within that name no file yet.

    For problems found while a file's contents are used (a model's genes, a UMI column), away
    from where it was read.
    """
    try:
        yield
    except InputError as exc:
        if path is None or exc.path is not None:
            raise
        raise InputError(exc.problem, path=path, sample=exc.sample) from exc


def existing_file(path: str | Path) -> Path:
    """``path`` as a Path.

    Raises
    ------
    InputError
        No file there.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("does not exist", path=path)
    return path


class OutOfSpaceError(OSError):
    """An output does not fit: the file system filled while it was written, or has too little room to start.

    Parameters
    ----------
    path
        The output being written.
    needed_bytes
        About how large the output is (at least what was written before the disk filled).
    before_writing
        Whether the output was refused before writing, for lack of room.
    """

    def __init__(self, path: str | Path, *, needed_bytes: int, before_writing: bool = False) -> None:
        self.path = Path(path)
        folder = next((parent for parent in [self.path.parent, *self.path.parents] if parent.exists()), Path())
        self.free_bytes = shutil.disk_usage(folder).free
        self.mount = mount_point(folder)
        self.needed_bytes = needed_bytes
        self.before_writing = before_writing
        super().__init__(
            errno.ENOSPC,
            f"{self.path}: {'not enough' if before_writing else 'no'} space left on the device: "
            f"about {_size(needed_bytes)} needed, "
            f"{_size(self.free_bytes)} free on {self.mount}",
        )

    def __str__(self) -> str:
        return self.strerror or ""  # always set by __init__; OSError types it optional

    def __reduce__(self) -> tuple:
        # Rebuilt (pickled back from a rule's second process) with the free space of that moment.
        return partial(type(self), needed_bytes=self.needed_bytes, before_writing=self.before_writing), (self.path,)


class OutOfMemoryError(MemoryError):
    """Memory ran out while an output was written.

    Parameters
    ----------
    path
        The output being written.
    needed_bytes
        About how large the output is.
    """

    def __init__(self, path: str | Path, *, needed_bytes: int | None) -> None:
        self.path = Path(path)
        self.needed_bytes = needed_bytes
        size = f" (about {_size(needed_bytes)} to write)" if needed_bytes else ""
        super().__init__(f"{self.path}: out of memory while writing{size}")

    def __reduce__(self) -> tuple:
        # Rebuilt from what it was made of when raised in a rule's second process (pickled back).
        return partial(type(self), needed_bytes=self.needed_bytes), (self.path,)


def mount_point(path: Path) -> str:
    """The mount point holding ``path``, with its file system type where /proc/mounts tells it."""
    path = path.resolve()
    while not os.path.ismount(path):
        path = path.parent
    kinds = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2:
                kinds[fields[1]] = fields[2]
    return f"{path} ({kinds[str(path)]})" if str(path) in kinds else str(path)


def _size(n_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes / 1e3:.1f} kB"


class BackendUnavailableError(RuntimeError):
    """The GPU backend was asked for explicitly but cannot be used here."""
