"""Work beside a rule's main thread: writes in a background thread, figures in a second process, errors back whole."""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import pytest

from omicsprep import io
from omicsprep.background import background_process, background_writes
from omicsprep.errors import InputError, OutOfMemoryError, OutOfSpaceError
from omicsprep.timings import phase_seconds

forking = pytest.mark.skipif(sys.platform != "linux", reason="the second process is forked on Linux only")


def record_pid(path: Path, *, pause: float = 0.0) -> None:
    time.sleep(pause)
    with path.open("a") as handle:
        handle.write(f"{os.getpid()} {'json' in sys.modules}\n")


def refuse(path: Path) -> None:
    raise InputError("not a count matrix", path=path, sample="s1")


@forking
def test_functions_run_in_order_in_one_other_process_beside_the_block(tmp_path):
    calls = tmp_path / "calls.txt"
    before = phase_seconds().get("write", 0.0)
    started = time.perf_counter()
    with background_process(preload="json") as run_later:
        run_later(record_pid, calls, pause=0.4)
        run_later(record_pid, calls)
        time.sleep(0.4)  # the block's own work, meanwhile
    elapsed = time.perf_counter() - started
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and len(set(lines)) == 1  # in order, one process
    pid, preloaded = lines[0].split()
    assert int(pid) != os.getpid() and preloaded == "True"
    assert elapsed < 0.75  # overlapped, not 0.8 s in a row
    assert phase_seconds()["write"] - before < 0.35  # the block's wait: only what was left


@forking
def test_a_failure_there_raises_here_whole_when_the_block_ends(tmp_path):
    calls = tmp_path / "calls.txt"
    with pytest.raises(InputError) as raised, background_process() as run_later:
        run_later(refuse, tmp_path / "counts.h5")
        run_later(record_pid, calls)  # later functions still run
    assert str(raised.value) == f"sample 's1': file '{tmp_path / 'counts.h5'}': not a count matrix"
    assert calls.exists()


@forking
def test_an_error_of_the_block_comes_first(tmp_path):
    with pytest.raises(RuntimeError, match="the block"), background_process() as run_later:
        run_later(refuse, tmp_path / "counts.h5")
        raise RuntimeError("the block")


def test_the_errors_users_read_survive_pickling(tmp_path):
    errors = [
        InputError("matrix is empty", path=tmp_path / "x.h5", sample="s1"),
        OutOfSpaceError(tmp_path / "out.h5ad", needed_bytes=5 * 10**9, before_writing=True),
        OutOfMemoryError(tmp_path / "out.h5ad", needed_bytes=10**9),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy).split(" free on ")[0] == str(error).split(" free on ")[0]  # free space: measured again
        assert copy.path == error.path


def test_background_writes_overlap_the_block_in_order_and_count_apart():
    """Threads switch often meanwhile: the writer waited for the interpreter's lock at every chunk,
    held for Python's whole 5 ms interval by a busy main thread (a deflated write took 3-4x as long)."""
    import sys

    from omicsprep.background import WRITING_SWITCH_INTERVAL_S

    before = phase_seconds()
    interval = sys.getswitchinterval()
    assert interval > WRITING_SWITCH_INTERVAL_S
    written = []
    started = time.perf_counter()
    with background_writes() as write_later:
        write_later(lambda name: (time.sleep(0.3), written.append(name)), "first")
        write_later(written.append, "second")
        assert sys.getswitchinterval() == pytest.approx(WRITING_SWITCH_INTERVAL_S)
        time.sleep(0.3)  # the block's own work, meanwhile
    assert sys.getswitchinterval() == interval
    assert written == ["first", "second"]
    assert time.perf_counter() - started < 0.5  # overlapped, not 0.6 s in a row
    after = phase_seconds()
    assert after["background_write"] - before.get("background_write", 0.0) >= 0.3
    assert after["write"] - before.get("write", 0.0) < 0.2  # the block's wait, only what was left


def test_a_failed_background_write_raises_when_the_block_ends(tmp_path):
    target = tmp_path / "out.tsv"

    def fail() -> None:
        with io.atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise OSError(28, "No space left on device")

    with pytest.raises(OutOfSpaceError), background_writes() as write_later:
        write_later(fail)
    assert list(tmp_path.iterdir()) == []


@forking
@pytest.mark.parametrize("ending", ["os._exit(0)", "os.kill(os.getpid(), signal.SIGKILL)"])
def test_a_kept_figure_process_ends_with_the_process_that_forked_it(ending, tmp_path):
    """A pool worker ends by os._exit (or is killed) without shutting its figure process down:
    that process must not outlive it, waiting for work that never comes."""
    import signal
    import subprocess

    pid_file = tmp_path / "figure.pid"
    script = (
        "import os, signal, sys\n"
        "from omicsprep import background\n"
        "def record(path):\n"
        "    open(path, 'w').write(str(os.getpid()))\n"
        "background.keep_figure_process()\n"
        "with background.background_process() as run_later:\n"
        f"    run_later(record, {str(pid_file)!r})\n"
        f"{ending}\n"
    )
    ended = subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
    assert ended.returncode in (0, -signal.SIGKILL)
    figure_pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{figure_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{figure_pid}").exists() or "Z" in Path(f"/proc/{figure_pid}/stat").read_text().split()[2]
