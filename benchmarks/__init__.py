"""omicsprep's benchmarks: one harness, a suite per module, run as ``python -m benchmarks SUITE``.

A suite is a module of this package with ``add_arguments(parser)`` and ``run(args)``; its
docstring's first line is its summary in ``python -m benchmarks --list``. What the suites share
(the benchmark settings, the workflow's run, the machine, RESULTS.md) is in :mod:`benchmarks.common`,
the data generators in :mod:`omicsprep.testing`. Results go to benchmarks/RESULTS.md.
"""
