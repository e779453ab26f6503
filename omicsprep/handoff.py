"""Imported first by every rule's script: a warm worker runs the script when this environment's server runs.

See :mod:`omicsprep.workers` (``omicsprep workers start``). Without one the import does
nothing and the script runs in its own process.
"""

from omicsprep.workers import hand_off

hand_off()
