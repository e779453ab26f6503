#!/usr/bin/env bash
# Debian's reference tools for the parity tests, where they are missing and we are root with
# apt: R with DropletUtils (r-bioc-dropletutils, 1.18 on bookworm), STAR (rna-star, 2.7.10b,
# which also runs the FASTQ tests and workflow) and headless Chromium (chromium-headless-shell,
# which opens the reports as a user's browser does). Elsewhere nothing, and those tests skip;
# under CI=true, where they must run, failing to install fails (exit 1).
set -uo pipefail
has_dropletutils() { command -v Rscript >/dev/null && Rscript -e 'library(DropletUtils)' >/dev/null 2>&1; }
has_star() { command -v STAR >/dev/null; }
has_chromium() { command -v chromium-headless-shell >/dev/null; }
has_dropletutils && has_star && has_chromium && exit 0
unavailable() {
  if [ "${CI:-}" = true ]; then
    echo "reference tools not installed ($1), and CI=true requires the parity tests to run" >&2
    exit 1
  fi
  echo "reference tools not installed ($1): the DropletUtils, STAR and browser tests will skip"
  exit 0
}
[ "$(id -u)" = 0 ] || unavailable "needs root"
command -v apt-get >/dev/null || unavailable "needs apt-get"
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  r-base-core r-bioc-dropletutils rna-star chromium-headless-shell >/dev/null; } \
  || unavailable "apt-get install r-bioc-dropletutils rna-star chromium-headless-shell failed"
has_dropletutils || unavailable "library(DropletUtils) still fails"
has_star || unavailable "STAR still missing"
has_chromium || unavailable "chromium-headless-shell still missing"
