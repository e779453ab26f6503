"""Where a traced run's seconds went: a summary of a py-spy chrometrace of every process.

    py-spy record --subprocesses --nonblocking --format chrometrace --output trace.json -- python -m benchmarks e2e ...
    python -m benchmarks trace_summary trace.json.gz [--library-frames 2] [--top 25]

For each process of the run (Snakemake, each rule's script) and each of its threads, the
seconds in which py-spy saw it run Python, then the call paths that took them: the frames
of omicsprep and the rule's script, and the first ``--library-frames`` frames of the
library they called.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

# A thread unseen for longer than this was idle (py-spy samples only running threads).
MAX_GAP_US = 50_000


def frame_name(event: dict) -> str:
    location = event["args"].get("filename", "")
    return f"{event['name']} ({location}:{event['args'].get('line')})"


def intervals(events: list[dict]) -> Iterator[tuple[str, int, float, tuple[str, ...]]]:
    """``(process, thread, seconds, frames)`` for each stretch in which a thread's stack stayed the same."""
    stacks: dict[tuple[int, int], list[str]] = {}
    last_seen: dict[tuple[int, int], int] = {}
    for event in sorted(events, key=lambda e: e["ts"]):
        key = (event["pid"], event["tid"])
        stack = stacks.setdefault(key, [])
        if key in last_seen and stack and event["ts"] > last_seen[key]:
            processes = [frame for frame in stack if frame.startswith("process ")]
            frames = tuple(frame for frame in stack if not frame.startswith("process "))
            if frames:
                gap = min(event["ts"] - last_seen[key], MAX_GAP_US)
                yield processes[-1] if processes else "?", key[1], gap / 1e6, frames
        last_seen[key] = event["ts"]
        if event["ph"] == "B":
            stack.append(frame_name(event))
        elif event["ph"] == "E" and stack:
            stack.pop()


PLUMBING = ("<frozen", "threading.py", "runpy", "concurrent/futures")


def ours(frame: str) -> bool:
    return "/omicsprep/" in frame or "/.snakemake/scripts/" in frame or "/benchmarks/" in frame


def call_path(frames: tuple[str, ...], *, library_frames: int) -> str:
    """Our frames, from the first, then the first ``library_frames`` frames of the library they called."""
    first = next((i for i, frame in enumerate(frames) if ours(frame)), None)
    if first is None:  # Snakemake's own work: its frames, past the interpreter's start-up and threads
        inner = [frame for frame in frames if not any(part in frame for part in PLUMBING)]
        return " > ".join(short(frame) for frame in inner[: library_frames + 2])
    last = max(i for i, frame in enumerate(frames) if ours(frame))
    path = [frame for frame in frames[first : last + 1] if ours(frame)]
    return " > ".join(short(frame) for frame in [*path, *frames[last + 1 : last + 1 + library_frames]])


def short(frame: str) -> str:
    name, _, location = frame.partition(" (")
    return f"{name} ({location.rsplit('/', 1)[-1]}" if location else name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path)
    parser.add_argument("--library-frames", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--min-seconds", type=float, default=0.05, help="threads that ran less are not shown")


def run(args: argparse.Namespace) -> None:
    opener = gzip.open if args.trace.suffix == ".gz" else open
    with opener(args.trace, "rt") as handle:
        events = json.load(handle)
    threads: dict[tuple[str, int], float] = collections.defaultdict(float)
    paths: dict[tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
    for process, thread, seconds, frames in intervals(events):
        threads[process, thread] += seconds
        paths[process, thread][call_path(frames, library_frames=args.library_frames)] += seconds
    for (process, thread), seconds in sorted(threads.items(), key=lambda item: -item[1]):
        if seconds < args.min_seconds:
            continue
        print(f"\n== {seconds:.2f} s  {process[:160]}  thread {thread}")
        for path, path_seconds in paths[process, thread].most_common(args.top):
            print(f"{path_seconds:7.2f}  {path[:600]}")
