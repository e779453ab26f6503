#!/usr/bin/env bash
# Debian's SLURM and munge for tests/test_slurm.py, where they are missing and we are root
# with apt (CI is); elsewhere nothing, and that test is skipped.
set -uo pipefail
command -v slurmctld >/dev/null && exit 0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || { echo "slurm-wlm not installed: tests/test_slurm.py will skip"; exit 0; }
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null \
  || echo "could not install slurm-wlm: tests/test_slurm.py will skip"
