"""The study's MultiQC report: omicsprep's summary as custom content, with the logs MultiQC reads itself."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omicsprep.logs import restore_root_logging, root_logging


def write_multiqc_report(
    sections: Mapping[str, dict],
    *,
    star_logs: Mapping[str, str | Path],
    report: str | Path,
    data: str | Path,
    title: str = "omicsprep",
) -> None:
    """Run MultiQC on the study's custom content and STAR logs; write its report and data folder.

    Both appear only when MultiQC succeeded (it works in a temporary folder beside them).

    Parameters
    ----------
    sections
        Custom content name to content (:func:`omicsprep.summary.multiqc_sections`).
    star_logs
        Sample to its STAR ``Log.final.out`` (MultiQC's STAR module reads them).
    report
        The HTML report.
    data
        MultiQC's data folder (its tables as TSV, the parsed logs among them).
    title
        The report's title.
    """
    from multiqc import run
    from multiqc.core.update_config import ClConfig

    report, data = Path(report), Path(data)
    report.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{report.stem}.", dir=report.parent) as work:
        found = Path(work) / "in"
        found.mkdir()
        for name, content in sections.items():
            (found / f"{name}_mqc.json").write_text(json.dumps(content))
        for sample, log in star_logs.items():
            # MultiQC names a STAR sample by its file name, less "Log.final.out".
            shutil.copyfile(log, found / f"{sample}.Log.final.out")
        written = Path(work) / "out"
        config = ClConfig(
            output_dir=str(written),
            filename=report.name,
            title=title,
            force=True,
            no_version_check=True,  # offline: no request to MultiQC's server
            no_ai=True,
            data_format="tsv",
            quiet=True,
            cl_config=["show_analysis_paths: false"],  # the temporary folder means nothing to a reader
        )
        result = _run_keeping_logging(run, str(found), cfg=config, interactive=False)
        if result.sys_exit_code != 0:
            raise RuntimeError(f"{report}: MultiQC failed: {result.message}")
        shutil.rmtree(data, ignore_errors=True)
        (written / f"{report.stem}_data").replace(data)
        (written / report.name).replace(report)


def _run_keeping_logging(run: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``run(*args, **kwargs)`` with the root logger's handlers and level given back after it.

    MultiQC replaces them with its own (WARNING and up, to standard error): the rule's log
    would lose every later line, its ``phases`` line among them.
    """
    saved = root_logging()
    try:
        return run(*args, **kwargs)
    finally:
        restore_root_logging(*saved)
