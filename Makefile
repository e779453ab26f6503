# make run     set up .venv (pinned CPU environment) and run the workflow on the bundled demo data
# make lint    set up .venv and check style, docstrings, types and the workflow (ruff, mypy, snakefmt, snakemake --lint)
# make format  rewrite the code as make lint wants it (ruff format, ruff's safe fixes, snakefmt)
# make test    set up .venv and run the test suite (GPU tests skip without a GPU)
# make image   build the CPU container image (envs/containers/build.sh; root, debootstrap, buildah): docs/containers.md
# make test-image  build it and run the demo in it against the host's run (not in CI: 5-8 minutes)
# make mutate  mutation testing of the science modules, MODULE=rna|atlas|scib|cells|reads|protein|atac|multiome|network
#              (default: all, hours on two cores; not in CI): docs/mutation.md
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= all
TEST_PROCESSES ?= 2

.PHONY: setup run report lint format test image test-image mutate clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements/cpu.txt -e ".[test,lint]"
	# UMI-tools, the reference of the UMI tests, builds only without isolation (no wheel; its setup.py needs
	# pkg_resources, gone from setuptools 81), so it is not in the test extra: there, pip install -e .[test] fails.
	$(BIN)/python -m pip install -q "setuptools<81" cython wheel
	$(BIN)/python -m pip install -q --no-build-isolation umi_tools==1.1.6
	touch $@

run: setup
	$(BIN)/snakemake --cores $(CORES) --configfile resources/demo/config.yaml
	$(BIN)/snakemake --configfile resources/demo/config.yaml --report results/report.html

# Every check runs, so one report lists all that fails; the recipe fails if any did. snakefmt
# formats shell: blocks with the venv's shfmt (shfmt-py), so the venv's bin goes on PATH.
lint: setup
	@failed=0; \
	$(BIN)/ruff check . || failed=1; \
	$(BIN)/ruff format --check . || failed=1; \
	$(BIN)/mypy || failed=1; \
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakefmt --check Snakefile rules || failed=1; \
	$(BIN)/snakemake --lint --configfile resources/demo/config.yaml || failed=1; \
	exit $$failed

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakefmt Snakefile rules

# Two pytest processes (TEST_PROCESSES=auto: one per core), each taking whole test files, so that a
# file's module fixtures are built once, in the order tests/conftest.py gives them (the longest files
# first, so that each process starts on one of test_workflow.py and test_atlas.py): 834 s on 2 cores,
# 2026-12-05; in xdist's own order, by test count, 1,634 s and 923 s in two runs that day.
test: setup
	bash tests/slurm/install.sh
	bash tests/reference/install.sh
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder

image:
	envs/containers/build.sh cpu

test-image: setup
	OMICSPREP_TEST_IMAGE=1 $(BIN)/python -m pytest tests/containers -v

MODULE ?=
mutate: setup
	$(BIN)/python -m pip install -q -e ".[mutate]"
	$(BIN)/python tests/mutation/mutate.py $(MODULE)

# Snakemake's benchmark folders, read from the rules' benchmark: paths (benchmarks/ also holds
# the tracked scripts, RESULTS.md and scaling/, which stay).
BENCHMARK_FOLDERS = $(sort $(shell sed -n 's|^ *"\(benchmarks/[a-z_]*\)/.*|\1|p' rules/*.smk))

clean:
	rm -rf results logs .snakemake $(BENCHMARK_FOLDERS)
