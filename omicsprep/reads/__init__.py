"""From reads to counts: molecule tables, UMI deduplication (Numba kernels for the CPU and CUDA), counting."""
