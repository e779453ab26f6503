#!/usr/bin/env bash
# The GPU check, run on the GPU machine from the repository root once the RAPIDS bundle is
# unpacked (see ../shared/gpu/README.md):
#   bash .gpu/stage.sh && source .gpu/env.sh && bash benchmarks/gpu_check.sh [SECTION ...]
# Sections (default: all; one call of the device may run 10 minutes, so split them there):
#   tests     the GPU tests (marker gpu, in every test file) (only those matching $GPU_TESTS_K, a pytest -k expression, if set),
#             required (pytest --require-gpu: without a usable GPU, or without dask_cuda, they
#             fail instead of skipping); prints each test's outcome, the MEASURE lines (CPU-GPU
#             agreement), pytest's summary line (passed/failed/skipped/errors) and its exit
#             code; the script then exits non-zero if pytest failed (after the other sections)
#   workflow  the workflow on the demo data with backend cpu, then gpu twice (cold: empty
#             CuPy kernel cache, kernels compile; warm: the cache is on disk), and
#             CPU-vs-GPU agreement ($WORKFLOW_RUNS picks among cpu gpu_cold gpu_warm)
#   umi       UMI deduplication: a fresh process's first CUDA kernel call with an empty and
#             with a filled Numba cache, then benchmarks/umi_dedup.py
#   coexpr    benchmarks/coexpr.py at 5,000 genes x 100,000 cells and 20,000 x 50,000
#             (or $COEXPR_SIZES)
#   fragments benchmarks/fragments.py: 10M fragments on both backends (unless
#             $FRAGMENTS_SKIP_10M is set), 100M on the GPU (in chunks of each of
#             $FRAGMENTS_GPU_CHUNK_ROWS, default 20000000)
#   tables    benchmarks/umi_table.py: molecule tables ($TABLE_READS, 10000000 and
#             30000000 reads; Parquet and TSV.gz) to counts, pyarrow+Numba vs cuDF+CUDA
#   merge     benchmarks/merge.py: $MERGE_SAMPLES (10) samples of $MERGE_CELLS (50000)
#             cells with the merge rule, on $MERGE_BACKENDS (gpu; empty: only generate the
#             samples), the merge rule on $MERGE_GPUS (1; more: merge.dask) GPUs
#   merge_step benchmarks/merge_step.py: the merge step alone, $MERGE_STEP_SAMPLES (10) x
#             $MERGE_STEP_CELLS (100000) cells, in each of $MERGE_STEP_MODES (gpu dask:N, N
#             the GPUs visible)
#   profile   benchmarks/step_profile.py: the qc and cluster chains in one process at
#             $PROFILE_CELLS (300000) cells, with h5ad writes in $PROFILE_COMPRESSIONS (lzf none)
#   droplets  issue 17's benchmarks: benchmarks/emptydrops.py (CPU and GPU backends; R is
#             not on the GPU machine), benchmarks/decontx.py (pydecontx, CPU, GPU; pydecontx's
#             wheel in .gpu/extra)
#   cellbender benchmarks/cellbender.py: omicsprep's SoupX and DecontX, then CellBender's fast
#             setting and its defaults (--cuda), at 2,000 cells among 40,000 barcodes x 10,000 genes
#             ($CELLBENDER_ARGS replace these); needs CellBender's wheels in .gpu/cellbender/ (see
#             that script), which also let the tests run CellBender's --cuda CLI test
#   transfers benchmarks/transfers.py: a CSR matrix of $TRANSFER_NNZ (800000000) non-zeros to the GPU and back,
#             CuPy's copies against omicsprep.backend's staged ones in 1, 2, 4 and 8 threads
#   doublets  benchmarks/doublets.py: Scrublet's stages in one group of $DOUBLETS_CELLS (20000) cells, on
#             $DOUBLETS_BACKENDS (gpu cpu), $DOUBLETS_REPEATS (3) times, after one of $DOUBLETS_WARM_UP_CELLS (0: none);
#             with $DOUBLETS_GROUPS: that many groups scored in pools of 1, 2 and 4 threads instead
#   deflate   benchmarks/deflate_threads.py at $DEFLATE_CELLS (500000) cells: a Cell Ranger matrix read, .h5ad
#             matrices written and read, HDF5's one-thread gzip against omicsprep.io.deflated's threads
#   kernels   benchmarks/kernel_compile.py: warm-kernels' steps from empty caches (CuPy's kernel requests
#             recorded into a manifest), on the filled caches, and with that manifest compiled ahead in
#             $KERNEL_PROCESSES (16) processes (omicsprep.kernels)
#   imports   benchmarks/imports.py: a GPU rule's imports in fresh processes (rapids-singlecell, the pipeline,
#             both as a rule that runs qc and cluster in one process starts)
#   e2e       benchmarks/e2e.py on $E2E_BACKENDS (gpu) at $E2E_CELLS (1000000) cells (data cached in /tmp/ob):
#             each backend's first run (no GPU pool yet: the run starts it) and its next run, with
#             $E2E_ARGS (--cold: from empty kernel caches, a fresh machine); prints where each rule's seconds
#             went; with $E2E_TRACE
#             (a name), every process of the run sampled by py-spy (its wheel in .gpu/extra) into
#             $OUT/trace_$E2E_TRACE.json.gz, summarized by benchmarks/trace_summary.py; the rules' logs of
#             the runs at $E2E_CELLS go to $OUT/rule_logs_<time>.tgz; the GPU memory in use is sampled
#             during the runs ($OUT/gpu_memory_e2e.csv, its peak printed) and the outputs' sizes printed
#   stalls    benchmarks/writer_stalls.py at $STALLS_CELLS (200000) cells: how long each cluster step holds the
#             interpreter's lock at once, and the normalized matrix's background write beside the steps and alone
#   first_calls benchmarks/first_calls.py: in a process set up as a pool worker, the steps whose first call
#             costs more (co-expression's metacells, Leiden, Louvain), the first profiled
#   codecs    benchmarks/output_codecs.py on the qc.h5ad and processed.h5ad of the e2e section's latest run at
#             $CODECS_CELLS (100000) cells (run e2e first, in the same call or on the same machine)
#   study     benchmarks/study.py: the bundled demo and a study of $STUDY_SAMPLES (16) x $STUDY_CELLS (10000) cells
#             ($STUDY_WHAT: demo study), each with the mission's command on $STUDY_BACKENDS (gpu cpu); tables in
#             $OUT/study.md ($STUDY_EXTRA: more Snakemake arguments, a tuning tip; STUDY_WARMUP=1: each backend
#             runs the study once, unmeasured, first, so that both find its kernels compiled)
#   atlas     benchmarks/atlas.py (issue 46) at $ATLAS_CELLS (1000000) cells x 2,000 genes on the GPU, the
#             parts $ATLAS_PARTS (ours celltypist scib_check: the merge's scVI at batch sizes $ATLAS_BATCH_SIZES
#             (0: its default; 4096:16: 4,096 cells a step, 16 epochs) with where a step's time goes, CellTypist,
#             scIB against scib-metrics on 20,000 cells; harmony and scanvi (from ours' default model): the merge's
#             other embeddings; held_out: the cached models' ELBO on the cells the defaults held out; silhouettes:
#             the kernel's pass, checked against matrix products; scib_profile: where one embedding's scIB time
#             goes; then, in calls of their own, defaults (scvi-tools' defaults, about 530 s at a million cells,
#             and the held-out ELBOs) and scib (every embedding, each metric's seconds in the log)); the study,
#             embeddings and models kept in /tmp/omicsprep-atlas between calls; table in $OUT/atlas.md
#   scib_cache scIB's table of the atlas study's PCA at $SCIB_CACHE_CELLS (20000) cells on the GPU, in two
#             fresh processes: JAX's and Numba's caches empty, then filled by the first (omicsprep/jit_cache.py)
#   probe     a GPU rule's imports timed in one process and in one per core at once, and the slowest imports
#   bam       benchmarks/umi.py: BAM in, counts out, CPU backend (all cores) and GPU backend
#             against umi_tools count, at $BAM_READS (10000000) reads; the BAM (pysam, about 2
#             minutes) is written in the background from the start, beside the other sections;
#             $BAM_BENCH_ARGS go to umi.py (--skip-readers, --skip-umi-tools-above 0 to save time)
# Tables and logs go to $OUT (default: gpu_check_out/).
set -uo pipefail
repo=$(pwd)
out=${OUT:-$repo/gpu_check_out}
mkdir -p "$out"
sections=${*:-tests workflow umi coexpr}
log=$out/gpu_check_${sections// /_}.log
exec > >(tee "$log") 2>&1
export PYTHONUNBUFFERED=1

echo "== machine"; date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
# Wheels the RAPIDS bundle lacks, carried in .gpu/extra/: fetch them here with
#   pip download --no-deps --python-version 3.12 --only-binary=:all: -d .gpu/extra mudata==0.3.10 harmonypy==2.1.0 \
#     oxbow==0.8.2 arro3-core==0.9.1 deflate==0.9.0 pydecontx==0.1.0 py-spy==0.4.3 \
#     multiqc==1.35 coloredlogs==15.0.1 colormath2==3.0.3 plotly==7.1.0 polars==2.1.0 rich-click==1.9.9 \
#     spectra==0.1.0 typeguard==4.6.1 \
#     scvi-tools==1.4.2 scib-metrics==0.5.10 celltypist==1.7.1 ml_collections==1.1.0 pyro-ppl==1.9.2 \
#     pyro-api==0.1.2 sparse==0.19.3 plottable==0.1.5 openpyxl==3.1.5 et_xmlfile==2.0.0
#   (MultiQC, scvi-tools, scib-metrics, CellTypist and what of their dependencies the image lacks:
#   it has PyTorch, Lightning and JAX), and pip wheel --no-deps -w .gpu/extra docrep==0.3.2 (no wheel on PyPI);
# and, for the bam section, UMI-tools and the two of its dependencies the image lacks, built with a Python 3.12
# (pyenv's here): pip wheel --no-deps -w .gpu/extra future pybktree, and umi_tools==1.1.6 with --no-build-isolation
# in a venv holding "setuptools<81" cython numpy. Add .gpu/extra to carry.
# All in one call, so that each wheel's scripts land in one bin/ (pip --target keeps an existing
# folder); one at a time if that fails.
rm -rf /tmp/gpu-extra; python3 -m pip install -q --no-deps --target /tmp/gpu-extra .gpu/extra/*.whl >/dev/null 2>&1 \
  || for wheel in .gpu/extra/*.whl; do
    [ -e "$wheel" ] && python3 -m pip install -q --no-deps --target /tmp/gpu-extra "$wheel" >/dev/null 2>&1
  done
[ -d /tmp/gpu-extra ] && export PYTHONPATH=/tmp/gpu-extra:$PYTHONPATH PATH=/tmp/gpu-extra/bin:$PATH
# Wheels too large to carry beside the work tree (polars' runtime, for MultiQC: 54 MB; pip download
# --no-deps --python-version 3.12 --only-binary=:all: polars-runtime-32==2.1.0, which the polars wheel above
# needs) come in parts, one per call before this one, as the bundle does (split -b 27M -d -a 1 WHEEL .gpu/large/WHEEL.part-):
#   carry [".gpu/large/<wheel>.part-0"], command: mkdir -p /tmp/gpu-large && cp .gpu/large/* /tmp/gpu-large/
# and the same for part-1; joined and installed here once, kept while the machine stays warm.
if ls /tmp/gpu-large/*.part-0 >/dev/null 2>&1 && [ ! -d /tmp/gpu-large/site ]; then
  for first in /tmp/gpu-large/*.part-0; do cat "${first%.part-0}".part-* > "${first%.part-0}"; done
  python3 -m pip install -q --no-deps --target /tmp/gpu-large/site /tmp/gpu-large/*.whl
fi
[ -d /tmp/gpu-large/site ] && export PYTHONPATH=$PYTHONPATH:/tmp/gpu-large/site
if [ -d .gpu/cellbender ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cb .gpu/cellbender/*.whl >/dev/null 2>&1
  export PYTHONPATH=$PYTHONPATH:/tmp/cb PATH=$PATH:/tmp/cb/bin  # after the image's and the bundle's packages
fi
# STAR 2.7.10b for the FASTQ tests, carried in .gpu/star/ (Debian rna-star's STAR-avx2 binary
# and the libraries it links: libhts.so.3, libdeflate.so.0, libhtscodecs.so.2):
#   cp /usr/lib/rna-star/bin/STAR-avx2 .gpu/star/STAR; cp -L /lib/x86_64-linux-gnu/{libhts.so.3,libdeflate.so.0,libhtscodecs.so.2} .gpu/star/
# A wrapper on PATH gives only STAR those libraries.
if [ -x .gpu/star/STAR ]; then
  mkdir -p /tmp/star-bin
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$repo/.gpu/star" "$repo/.gpu/star/STAR" > /tmp/star-bin/STAR
  chmod +x /tmp/star-bin/STAR; export PATH=/tmp/star-bin:$PATH
  echo "STAR $(STAR --version)"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
python3 -c "import omicsprep.backend as b; print('gpu usable:', b.gpu_unavailable_reason() is None, b.gpu_unavailable_reason() or '')"

wants() { [[ " $sections " == *" $1 "* ]]; }

if wants bam; then
  python3 -c "from pathlib import Path; from benchmarks.umi import benchmark_bam
benchmark_bam(Path('/tmp/omicsprep-umi'), ${BAM_READS:-10000000})" > "$out/bam_generate.log" 2>&1 &
  bam_writer=$!
fi

tests_status=0
if wants tests; then
echo "== GPU tests (required: --require-gpu), in ${GPU_TEST_PROCESSES:-4} processes sharing the GPU"
# One after another they pass 600 s, a device call's limit; -rA reports each test's output
# (the MEASURE lines), which pytest-xdist's workers do not print as they go.
python3 -m pytest -m gpu -v -rA -p no:cacheprovider --tb=short --durations=20 --require-gpu \
  -n "${GPU_TEST_PROCESSES:-4}" --dist load ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} tests > "$out/pytest_gpu.log" 2>&1
tests_status=$?
grep -E "PASSED|FAILED|ERROR|SKIPPED|^E " "$out/pytest_gpu.log" | tail -n 80
echo "== CPU-GPU agreement measured (MEASURE lines)"
grep -E "^MEASURE " "$out/pytest_gpu.log"
echo "== pytest summary"
grep -E "^=+ .* in [0-9.]+s" "$out/pytest_gpu.log" | tail -n 1
echo "pytest exit code: $tests_status"
fi

if wants workflow; then
for run in ${WORKFLOW_RUNS:-cpu gpu_cold gpu_warm}; do
  echo "== workflow, backend ${run%_*} ($run)"
  dir=/tmp/omicsprep_$run; rm -rf "$dir"; mkdir -p "$dir"; ln -s "$repo/resources" "$dir/resources"
  # The cold run starts from an empty CuPy kernel cache; the warm run finds it filled.
  if [ "$run" = gpu_cold ]; then export CUPY_CACHE_DIR=/tmp/cupy_kernel_cache; rm -rf "$CUPY_CACHE_DIR"; fi
  time snakemake -s "$repo/Snakefile" --directory "$dir" --configfile "$repo/config/config.yaml" "$repo/resources/demo/config.yaml" \
    --config backend="${run%_*}" samples="$repo/resources/demo/samples.tsv" --cores 16 --resources gpu=1 -q \
    || { echo "workflow failed ($run)"; tail -n 30 "$dir"/logs/*/*.log; }
  cp "$dir/results/run_times.tsv" "$out/run_times_$run.tsv" 2>/dev/null
  (cd "$dir/results" && find . -type f ! -name '*.tmp*' | sort) > "/tmp/outputs_$run.txt"
done

echo "== same outputs?"
diff /tmp/outputs_cpu.txt /tmp/outputs_gpu_cold.txt && echo "same set of output files"
echo "== CPU vs GPU"
python3 -m benchmarks compare_backends /tmp/omicsprep_cpu/results /tmp/omicsprep_gpu_cold/results | tee "$out/compare_cpu_gpu.tsv"
fi

if wants umi; then
echo "== UMI kernel: first call in a fresh process, Numba cache empty then filled"
export NUMBA_CACHE_DIR=/tmp/numba_cache_umi; rm -rf "$NUMBA_CACHE_DIR"
for cache in empty filled; do
  python3 - "$cache" <<'PY'
import sys, time
start = time.perf_counter()
from omicsprep.testing.reads import generate_read_codes
from omicsprep.reads.umi import dedup_reads
reads = generate_read_codes(10_000, n_cells=20, n_genes=200, seed=1)
imported = time.perf_counter()
dedup_reads(reads, method="directional", backend="gpu")
first = time.perf_counter()
dedup_reads(reads, method="directional", backend="gpu")
print(f"cache {sys.argv[1]}: imports {imported - start:.1f} s, first call {first - imported:.2f} s, "
      f"second {time.perf_counter() - first:.3f} s")
PY
done
unset NUMBA_CACHE_DIR
echo "== UMI deduplication benchmark"
python3 -m benchmarks umi_dedup --reads 10000000 100000000 --backends cpu gpu --cpu-max-reads 10000000 \
  --results "$out/umi_dedup.md" 2>&1 | tail -n 30
fi

if wants tables; then
echo "== molecule tables to counts"
python3 -m benchmarks umi_table --reads ${TABLE_READS:-10000000 30000000} --formats parquet tsv.gz \
  --backends cpu gpu --results "$out/umi_tables.md" 2>&1
fi

if wants coexpr; then
echo "== co-expression benchmark"
python3 -m benchmarks coexpr --sizes ${COEXPR_SIZES:-5000x100000 20000x50000} --backends cpu gpu \
  --results "$out/coexpr.md" 2>&1 | tail -n 20
fi

if wants fragments; then
echo "== fragments benchmark"
[ -z "${FRAGMENTS_SKIP_10M:-}" ] && python3 -m benchmarks fragments --fragments 10000000 --backends cpu gpu \
  --results "$out/fragments.md" 2>&1 | tail -n 8
for rows in ${FRAGMENTS_GPU_CHUNK_ROWS:-20000000}; do
  python3 -m benchmarks fragments --fragments 100000000 --backends gpu --chunk-rows "$rows" \
    --results "$out/fragments.md" 2>&1 | tail -n 3
done
fi

if wants merge; then
echo "== many samples merged"
python3 -m benchmarks merge --samples "${MERGE_SAMPLES:-10}" --cells "${MERGE_CELLS:-50000}" \
  --backends ${MERGE_BACKENDS-gpu} --merge-gpus "${MERGE_GPUS:-1}" --cores "$(nproc)" --results "$out/merge.md" \
  2>&1 | tail -n 8
fi

if wants merge_step; then
echo "== the merge step alone"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
python3 -m benchmarks merge_step --samples "${MERGE_STEP_SAMPLES:-10}" --cells "${MERGE_STEP_CELLS:-100000}" \
  --modes ${MERGE_STEP_MODES:-gpu dask:$gpus} --results "$out/merge_step.md" > "$out/merge_step.log" 2>&1
tail -n 40 "$out/merge_step.log"
fi

if wants profile; then
echo "== qc and cluster chains in one process, profiled"
for cells in ${PROFILE_CELLS:-300000}; do
  python3 -m benchmarks step_profile --cells "$cells" --backend gpu --workdir /tmp/ob --out "$out/profile" \
    --compressions ${PROFILE_COMPRESSIONS:-lzf none} > "$out/profile_$cells.log" 2>&1
  grep -E "^ +[a-z_]+ +[0-9.]+ s$|Error" "$out/profile_$cells.log"; cat "$out/profile/profile_gpu_$cells.json"
done
fi

if wants droplets; then
echo "== droplets: emptyDrops (500,000 barcodes x 33,000 genes, 10,000 cells, niters 10,000), CPU and GPU"
python3 -m benchmarks emptydrops --skip-r --gpu --profile 2>&1 | tail -n 40
echo "== droplets: DecontX (10,000 cells x 33,000 genes), pydecontx, CPU and GPU"
python3 -m benchmarks decontx --backend cpu gpu gpu 2>&1 | tail -n 20
fi
if wants cellbender; then
echo "== cellbender: omicsprep's SoupX and DecontX, CellBender fast and default (--cuda)"
# The table is rewritten after each run, so a run cut short by the timeout keeps the rows before it.
timeout "${CELLBENDER_TIMEOUT:-560}" python3 -m benchmarks cellbender \
  ${CELLBENDER_ARGS:---cells 2000 --barcodes 40000 --genes 10000 --total-droplets 6000} 2>&1 | tail -n 20
fi
if wants transfers; then
echo "== a count matrix to the GPU and back: CuPy's copies against the staged ones (benchmarks/transfers.py)"
python3 -m benchmarks transfers --nnz "${TRANSFER_NNZ:-800000000}" 2>&1 | tail -n 12
fi
if wants doublets; then
echo "== Scrublet's stages in one group of ${DOUBLETS_CELLS:-20000} cells (benchmarks/doublets.py)"
python3 -m benchmarks doublets --cells "${DOUBLETS_CELLS:-20000}" --backends ${DOUBLETS_BACKENDS:-gpu cpu} \
  --repeats "${DOUBLETS_REPEATS:-3}" --warm-up-cells "${DOUBLETS_WARM_UP_CELLS:-0}" \
  ${DOUBLETS_GROUPS:+--groups "$DOUBLETS_GROUPS"} 2>&1 | tail -n 30
fi
if wants deflate; then
echo "== deflate in threads against HDF5's gzip, ${DEFLATE_CELLS:-500000} cells (benchmarks/deflate_threads.py)"
python3 -m benchmarks deflate_threads --cells "${DEFLATE_CELLS:-500000}" --dir /tmp 2>&1 | tail -n 12
fi
if wants kernels; then
echo "== kernel compiles of a fresh machine (benchmarks/kernel_compile.py)"
python3 -m benchmarks kernel_compile --processes "${KERNEL_PROCESSES:-16}" --out "$out/kernels" 2>&1 | tail -n 40
fi
if wants imports; then
echo "== a GPU rule's imports (benchmarks/imports.py)"
python3 -m benchmarks imports --out "$out/imports" 2>&1 | tail -n 45
fi
if wants e2e; then
echo "== end to end: benchmarks/e2e.py"
# The scaling rows and plot stay on the machine (only a few files come back from $OUT).
tracer=()
[ -n "${E2E_TRACE:-}" ] && tracer=(py-spy record --subprocesses --nonblocking --rate 100 --format chrometrace
  --output "$out/trace_${E2E_TRACE}.json" --)
# GPU memory in use, sampled twice a second while the runs go (its peak printed after them).
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 500 >"$out/gpu_memory_e2e.csv" &
sampler=$!
"${tracer[@]}" python3 -m benchmarks e2e --cells ${E2E_CELLS:-1000000} --backends ${E2E_BACKENDS:-gpu} ${E2E_ARGS:-} --cores "$(nproc)" --host H200 --workdir /tmp/ob \
  --results "$out/RESULTS_h200.md" --scaling-dir /tmp/ob/scaling --plot /tmp/ob/scaling.png 2>&1 | tail -n 60
kill "$sampler"
awk -F', ' '$2 > peak { peak = $2 } END { printf "GPU memory in use, peak during the runs: %d MiB\n", peak }' "$out/gpu_memory_e2e.csv"
for cells in ${E2E_CELLS:-1000000}; do du -sh /tmp/ob/*_"$cells"x*/results/*/*.h5ad 2>/dev/null; done
# The runs' rule logs (step ends, GPU start-up, phases: the rules' timelines), in one archive
# (few files come back from $OUT).
logs=()
for cells in ${E2E_CELLS:-1000000}; do
  for run_dir in /tmp/ob/*_"$cells"x*/; do [ -d "$run_dir/logs" ] && logs+=("${run_dir#/tmp/ob/}logs"); done
done
[ ${#logs[@]} -gt 0 ] && tar czf "$out/rule_logs_$(date -u +%H%M%S).tgz" -C /tmp/ob "${logs[@]}"
if [ -n "${E2E_TRACE:-}" ]; then
  gzip -f "$out/trace_${E2E_TRACE}.json"
  python3 -m benchmarks trace_summary "$out/trace_${E2E_TRACE}.json.gz" | head -n 60
fi
fi

if wants study; then
echo "== studies as users run them: snakemake --cores $(nproc) --resources gpu=1, the shipped config, both backends"
for what in ${STUDY_WHAT:-demo study}; do
  if [ "$what" = demo ]; then which=(--demo); else which=(--samples "${STUDY_SAMPLES:-16}" --cells "${STUDY_CELLS:-10000}"); fi
  python3 -m benchmarks study "${which[@]}" --backends ${STUDY_BACKENDS:-gpu cpu} --cores "$(nproc)" \
    --workdir /tmp/study --results "$out/study.md" ${STUDY_EXTRA:+--extra "$STUDY_EXTRA"} \
    ${STUDY_WARMUP:+--warm-up} 2>&1 | tail -n 40
done
fi

if wants atlas; then
echo "== the atlas steps: scVI (ours and scvi-tools' defaults), scIB, CellTypist"
python3 -c "import jax, torch; print('jax', jax.__version__, jax.devices(), '| torch', torch.__version__, torch.cuda.get_device_name())"
python3 -m benchmarks atlas --cells "${ATLAS_CELLS:-1000000}" --genes 2000 --backend gpu \
  --parts ${ATLAS_PARTS:-ours celltypist scib_check} --batch-sizes ${ATLAS_BATCH_SIZES:-0} \
  --results "$out/atlas.md" 2>&1 | grep --line-buffered -v "Warning\|warn(\|srun\|TPU available\|litlogger\|max_epochs=\|LeafSpec\|it/s]\|s/it]"
fi

if wants scib_cache; then
echo "== scIB's compile caches: one table in two fresh processes, the caches empty then filled"
export JAX_COMPILATION_CACHE_DIR=/tmp/scib_cache/jax NUMBA_CACHE_DIR=/tmp/scib_cache/numba
rm -rf /tmp/scib_cache
for caches in empty filled; do
  echo "-- caches $caches"
  python3 -m benchmarks atlas --cells "${SCIB_CACHE_CELLS:-20000}" --genes 2000 --backend gpu --parts scib \
    --cache /tmp/omicsprep-scib-cache 2>&1 | grep -E "^ *(step|study|scib)" | tail -n 4
done
unset JAX_COMPILATION_CACHE_DIR NUMBA_CACHE_DIR
fi

if wants probe; then
echo "== a GPU rule's imports: one process, then $(nproc) at once"
imports='import time; t=time.perf_counter(); import omicsprep.rna.pipeline, rapids_singlecell, cuml, pylibcugraph, cupy; cupy.cuda.runtime.free(0); print(f"{time.perf_counter()-t:.2f}")'
python3 -c "$imports"; python3 -c "$imports"
for i in $(seq "$(nproc)"); do python3 -c "$imports" & done | sort -n | tr '\n' ' '; echo
python3 -X importtime -c 'import omicsprep.rna.pipeline, rapids_singlecell, cuml, pylibcugraph' 2>&1 \
  | sort -t'|' -k2 -n | tail -n 25
fi

if wants stalls; then
echo "== how long the cluster steps hold the interpreter (benchmarks/writer_stalls.py)"
python3 -m benchmarks writer_stalls --cells "${STALLS_CELLS:-200000}" --backend gpu 2>&1 | tail -n 20
fi

if wants first_calls; then
echo "== a pool worker's first calls: benchmarks/first_calls.py"
python3 -m benchmarks first_calls --out "$out" 2>&1 | tail -n 160
fi

if wants codecs; then
cells=${CODECS_CELLS:-100000}
echo "== output stores and codecs: benchmarks/output_codecs.py on the e2e section's outputs at $cells cells"
run_dir=$(ls -td /tmp/ob/*_"$cells"x*/ 2>/dev/null | head -n 1)
python3 -m benchmarks output_codecs "$run_dir/results/bench/qc.h5ad" "$run_dir/results/bench/processed.h5ad" \
  --workdir /tmp --results "$out/codecs_h200.md" 2>&1 | tail -n 25
fi

if wants bam; then
echo "== BAM in, counts out: omicsprep count-umis (CPU on $(nproc) cores, GPU) against umi_tools count"
wait "$bam_writer" || { echo "BAM generation failed"; tail -n 20 "$out/bam_generate.log"; }
python3 -m benchmarks umi --reads "${BAM_READS:-10000000}" --repeats 3 --backends cpu gpu \
  ${BAM_BENCH_ARGS:-} --results "$out/umi_bench.md" 2>&1 | tail -n 20
fi

# The GPU tests' verdict is the script's (the other sections report their own failures in the log).
exit "$tests_status"
