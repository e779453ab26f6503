"""Errors that users are meant to read."""

from __future__ import annotations

from pathlib import Path


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


class BackendUnavailableError(RuntimeError):
    """The GPU backend was asked for explicitly but cannot be used here."""
