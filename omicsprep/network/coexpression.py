"""Gene co-expression networks: correlations, modules, eigengenes and hub genes.

Genes are standardized once on the device; the genes x genes correlation is then computed
``block_size`` genes against all at a time
(dense matrix products: CuPy on the GPU, NumPy on the CPU, the same code), and each block
is cut down to every gene's ``top_k`` partners before the next one, so no more than one
block of the matrix ever exists. Modules are communities of the resulting graph (cuGraph
or igraph, :func:`omicsprep.rna.clustering.partition_graph`).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
from anndata import AnnData
from scipy import sparse

from omicsprep.backend import BLOCK_BYTES, Backend, array_module, asnumpy, cuml, tf32_products
from omicsprep.errors import InputError
from omicsprep.options import Algorithm, Correlation, Pooling
from omicsprep.rna.clustering import partition_graph
from omicsprep.rna.preprocessing import normalize

UNASSIGNED = "unassigned"
# The GPU's split products (:func:`_gram_blocks`) hold two more copies of the standardized
# matrix; above this size the products stay in float32, so 20,000 genes fit in 8 GB.
SPLIT_MAX_BYTES = 1 << 31


def select_genes(adata: AnnData, *, n_genes: int) -> pd.Index:
    """The ``n_genes`` most variable genes of log-normalized ``X``.

    Genes ranked by ``var["highly_variable_rank"]`` (the workflow's seurat_v3 HVGs) come
    first, in that order; the rest follow by decreasing variance.
    """
    values = adata.X
    mean = np.asarray(values.mean(axis=0)).ravel()
    squares = values.multiply(values) if sparse.issparse(values) else np.square(values)
    variance = np.asarray(squares.mean(axis=0)).ravel() - mean**2
    rank = adata.var["highly_variable_rank"].to_numpy(float) if "highly_variable_rank" in adata.var else None
    rank = np.full(adata.n_vars, np.inf) if rank is None else np.nan_to_num(rank, nan=np.inf)
    order = np.lexsort((-variance, rank))
    return adata.var_names[order[:n_genes]]


def check_expression(
    adata: AnnData, *, genes: pd.Index, top_k: int, min_cells: int, min_expressing_cells: int
) -> pd.Index:
    """Refuse data the network cannot be built from; return the genes to use.

    Genes expressed in fewer than ``min_expressing_cells`` cells are left out (two such
    genes that meet in one cell correlate by chance), and so are constant genes.

    Raises
    ------
    InputError
        Fewer cells than ``min_cells``, NaN values, or fewer usable genes than
        ``top_k + 1``.
    """
    if adata.n_obs < min_cells:
        raise InputError(f"{adata.n_obs} cells, fewer than coexpression.min_cells ({min_cells})")
    values = sparse.csc_matrix(adata[:, genes].X)
    if np.isnan(values.data).any():
        raise InputError("expression holds NaN values")
    expressing = np.diff(values.indptr)
    constant = values.max(axis=0).toarray().ravel() == values.min(axis=0).toarray().ravel()
    usable = genes[(expressing >= min_expressing_cells) & ~constant]
    if len(usable) <= top_k:
        raise InputError(
            f"{len(usable)} usable genes (varying, expressed in at least {min_expressing_cells} "
            f"cells), too few for top_k={top_k} partners each"
        )
    return usable


def pool_metacells(adata: AnnData, *, method: Pooling, n_metacells: int, seed: int, backend: Backend) -> AnnData:
    """Pool cells' counts to tame single-cell sparsity; log-normalized.

    Parameters
    ----------
    adata
        Cells with raw counts in ``layers["counts"]`` (else in ``X``); ``knn`` needs
        ``obsp["connectivities"]``, ``kmeans`` ``obsm["X_pca"]``.
    method
        ``knn``: each cell's counts summed with its neighbours'; ``kmeans``: counts summed
        within ``n_metacells`` k-means groups of the PCA (cuML on the GPU); ``none``:
        ``adata`` itself.
    n_metacells
        Groups for ``kmeans``.
    seed
        Seed of k-means.
    backend
        ``"cpu"`` or ``"gpu"``.

    Returns
    -------
    Metacells x genes, library-size normalized and log1p-transformed.
    """
    if method == "none":
        return adata
    counts = sparse.csr_matrix(adata.layers.get("counts", adata.X))
    if method == "knn":
        pooling = (adata.obsp["connectivities"] > 0).astype(np.float32) + sparse.identity(adata.n_obs, format="csr")
    else:
        groups = _kmeans(adata.obsm["X_pca"], n_clusters=min(n_metacells, adata.n_obs), seed=seed, backend=backend)
        pooling = sparse.csr_matrix((np.ones(adata.n_obs, np.float32), (groups, np.arange(adata.n_obs))))
    metacells = AnnData(sparse.csr_matrix(pooling @ counts, dtype=np.float32), var=pd.DataFrame(index=adata.var_names))
    normalize(metacells, target_sum=1e4, backend="cpu")
    return metacells


def _kmeans(points: np.ndarray, *, n_clusters: int, seed: int, backend: Backend) -> np.ndarray:
    if backend == "gpu":
        model = cuml().KMeans(n_clusters=n_clusters, random_state=seed, n_init=1)
        return np.asarray(model.fit_predict(points.astype(np.float32)))
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=n_clusters, random_state=seed, n_init=1).fit_predict(points)


def standardize(expression: np.ndarray | sparse.spmatrix, *, method: Correlation, backend: Backend):
    """Samples x genes on the device, each gene centred and scaled to unit variance.

    Correlations are then matrix products (:func:`correlation_graph`).

    Parameters
    ----------
    expression
        Samples (cells or metacells) x genes, log-normalized, dense or sparse, host
        memory. Densified on the device (float32): with one block of correlations, the
        only large allocation (Spearman ranks need a second copy while ranking).
    method
        ``pearson``, or ``spearman`` (Pearson on ranks; ties share their mean rank).
    backend
        ``"cpu"`` or ``"gpu"``; the matrix moves to the device once.

    Returns
    -------
    A dense float32 CuPy (GPU) or NumPy (CPU) array; constant genes become zeros.
    """
    xp = array_module(backend)
    if sparse.issparse(expression):
        standardized = _densified(sparse.csr_matrix(expression, dtype=np.float32), backend=backend)
    else:
        standardized = xp.array(expression, dtype=xp.float32)  # a copy: standardized in place
    if method == "spearman":
        standardized = _ranks(standardized, xp=xp)
    _standardize_in_place(standardized, xp=xp)
    return standardized


def correlation_graph(
    standardized,
    *,
    top_k: int,
    min_correlation: float,
    power: float,
    backend: Backend,
) -> sparse.csr_matrix:
    """Sparse gene-gene graph: each gene joined to its ``top_k`` most correlated partners.

    Parameters
    ----------
    standardized
        :func:`standardize`'s samples x genes matrix, on the backend's device.
    top_k
        Partners kept per gene (positive correlations only: a signed network); of equal
        correlations, the lower gene index wins.
    min_correlation
        Weaker partners are dropped.
    power
        Edge weight = correlation ** power (WGCNA's soft threshold; 1 keeps correlations).
    backend
        ``"cpu"`` or ``"gpu"``, as for :func:`standardize`.

    Returns
    -------
    Symmetric weights, genes x genes, host memory (an edge kept by either gene is kept).
    """
    xp = array_module(backend)
    n_samples, n_genes = standardized.shape
    rows, cols, weights = [], [], []
    for start, stop, block in _gram_blocks(standardized, backend=backend):
        block /= n_samples
        block[xp.arange(stop - start), xp.arange(start, stop)] = -xp.inf  # no self-edges
        # Candidates above the threshold, then each gene's top_k of them: cheaper than
        # ranking whole rows, and ties go to the lower gene index on both backends.
        row, col = xp.nonzero(block >= max(min_correlation, np.finfo(np.float32).tiny))
        correlation = xp.minimum(block[row, col], 1.0)
        order = xp.lexsort(xp.stack([-correlation.astype(xp.float64), row.astype(xp.float64)]))
        row, col, correlation = row[order], col[order], correlation[order]
        keep = xp.arange(row.size) - xp.searchsorted(row, row, side="left") < top_k
        rows.append(asnumpy(row[keep] + start))
        cols.append(asnumpy(col[keep]))
        weights.append(asnumpy(correlation[keep] ** power))
    graph = sparse.csr_matrix(
        (np.concatenate(weights), (np.concatenate(rows), np.concatenate(cols))), shape=(n_genes, n_genes)
    )
    return graph.maximum(graph.T).tocsr()


def _split_tf32(values: Any, *, xp: ModuleType) -> tuple[Any, Any]:
    """``values`` (float32) as ``high + low``, ``high`` exact on TF32 tensor cores.

    ``high`` is rounded to TF32's 10 mantissa bits, ``low`` is the exact remainder (at most
    2^-11 of the value). For finite values below about 3.4e38 (standardized expression is
    far below).
    """
    bits = values.view(xp.uint32).copy()  # rounded in place: no temporaries beyond the two parts
    bits += xp.uint32(1 << 12)
    bits &= xp.uint32(0xFFFFE000)
    high = bits.view(xp.float32)
    return high, values - high


def _gram_blocks(standardized: Any, *, backend: Backend) -> Iterator[tuple[int, int, Any]]:
    """Row blocks of ``standardized.T @ standardized`` (genes x genes) as ``(start, stop, block)``.

    On the GPU (when the second copy fits :data:`SPLIT_MAX_BYTES`) each factor is split as
    ``high + low`` (:func:`_split_tf32`) and the products of the parts run on TF32 tensor
    cores: ``high·high + high·low + low·high`` keeps float32's accuracy (the dropped
    ``low·low`` is 2^-22 of the whole; CUTLASS's "3xTF32") faster than float32 products.
    Over all genes at once, ``low·high`` is the transpose of ``high·low``.
    """
    n_genes = standardized.shape[1]
    block_size = max(1, BLOCK_BYTES // (4 * n_genes))
    split = backend == "gpu" and standardized.nbytes <= SPLIT_MAX_BYTES
    if split:
        high, low = _split_tf32(standardized, xp=array_module(backend))
    for start in range(0, n_genes, block_size):
        stop = min(start + block_size, n_genes)
        if not split:
            yield start, stop, standardized[:, start:stop].T @ standardized
            continue
        with tf32_products():
            block = high[:, start:stop].T @ high
            cross = high[:, start:stop].T @ low
            block += cross
            block += cross.T if (start, stop) == (0, n_genes) else low[:, start:stop].T @ high
        yield start, stop, block


def _densified(matrix: sparse.csr_matrix, *, backend: Backend):
    """The dense matrix on the device.

    On the GPU only the sparse arrays cross and are added into place (CuPy's ``toarray``
    sorts a copy and makes a second, column-major, dense copy); on the CPU SciPy adds
    straight into the output. Both sum repeated entries, so the matrix need not be
    canonical (checking costs a pass over it).
    """
    xp = array_module(backend)
    dense = xp.zeros(matrix.shape, dtype=xp.float32)
    if backend == "cpu":
        matrix.toarray(out=dense)
        return dense
    indptr = xp.asarray(matrix.indptr)
    rows = xp.searchsorted(indptr, xp.arange(matrix.nnz, dtype=indptr.dtype), side="right") - 1
    xp.add.at(dense, (rows, xp.asarray(matrix.indices)), xp.asarray(matrix.data))
    return dense


def _standardize_in_place(values, *, xp: ModuleType) -> None:
    """Centre each column and scale it to unit variance; a constant column becomes zeros.

    A constant column correlates with nothing.

    Column sums are products with a vector of ones: BLAS reads the row-major matrix in
    order, where a column-wise reduction would stride through it (slow on the GPU). Only
    the squares of one block of rows are a temporary.
    """
    n_rows, n_cols = values.shape
    ones = xp.ones(n_rows, dtype=values.dtype)
    values -= (ones @ values) / n_rows
    squares = xp.zeros(n_cols, dtype=values.dtype)
    step = max(1, BLOCK_BYTES // (4 * n_cols))
    for start in range(0, n_rows, step):
        block = values[start : start + step]
        squares += ones[: block.shape[0]] @ (block * block)
    scale = xp.sqrt(squares / n_rows)
    scale[scale == 0] = 1
    values /= scale


def _ranks(values, *, xp: ModuleType):
    """Column ranks, ties sharing their mean rank."""
    ranks = xp.empty_like(values)
    for j in range(values.shape[1]):
        column = values[:, j]
        ordered = xp.sort(column)
        below, upto = xp.searchsorted(ordered, column, side="left"), xp.searchsorted(ordered, column, side="right")
        ranks[:, j] = (below + upto + 1) / 2
    return ranks


def find_modules(
    graph: sparse.csr_matrix,
    *,
    genes: pd.Index,
    algorithm: Algorithm,
    resolution: float,
    min_module_size: int,
    seed: int,
    backend: Backend,
) -> pd.DataFrame:
    """Modules (communities) of a co-expression graph and each gene's hub score.

    Modules are named ``M1``, ``M2``, ... by decreasing size; genes of modules under
    ``min_module_size`` are ``unassigned``. The hub score is a gene's weighted degree
    within its module over the module's largest.

    Returns
    -------
    Columns ``gene``, ``module``, ``hub_score``; sorted by module, then hub score.
    """
    labels = partition_graph(graph, algorithm=algorithm, resolution=resolution, seed=seed, backend=backend)
    names, sizes = np.unique(labels[labels >= 0], return_counts=True)
    large = names[sizes >= min_module_size][np.argsort(-sizes[sizes >= min_module_size], kind="stable")]
    module_of = {label: f"M{i + 1}" for i, label in enumerate(large)}
    modules = np.array([module_of.get(label, UNASSIGNED) for label in labels], dtype=object)
    table = pd.DataFrame({"gene": genes, "module": modules, "degree": _within_module_degree(graph, modules)})
    best = table.groupby("module")["degree"].transform("max").replace(0, 1)
    table["hub_score"] = np.where(table["module"] == UNASSIGNED, 0.0, table["degree"] / best)
    order = [f"M{i + 1}" for i in range(len(large))] + [UNASSIGNED]
    table["module"] = pd.Categorical(table["module"], categories=order)
    table = table.sort_values(["module", "hub_score"], ascending=[True, False], kind="stable")
    return table[["gene", "module", "hub_score"]].reset_index(drop=True)


def _within_module_degree(graph: sparse.csr_matrix, modules: np.ndarray) -> np.ndarray:
    coo = graph.tocoo()
    inside = modules[coo.row] == modules[coo.col]
    return np.bincount(coo.row[inside], weights=coo.data[inside], minlength=graph.shape[0])


def module_eigengenes(adata: AnnData, *, modules: pd.DataFrame, backend: Backend) -> None:
    """Per-cell module scores in ``obsm["module_eigengenes"]`` (cells x modules).

    A module's eigengene is the first principal component of its genes' standardized
    log-expression, oriented to rise with the module's mean and scaled to unit variance.

    Parameters
    ----------
    adata
        Cells, log-normalized ``X``.
    modules
        :func:`find_modules`'s table; ``unassigned`` genes are left out.
    backend
        ``"cpu"`` or ``"gpu"``.
    """
    xp = array_module(backend)
    assigned = modules[modules["module"] != UNASSIGNED]
    names = [m for m in assigned["module"].cat.categories if m != UNASSIGNED]
    values = adata[:, assigned["gene"].to_numpy()].X
    values = xp.asarray(values.toarray() if sparse.issparse(values) else values, dtype=xp.float32)
    standardized = (values - values.mean(axis=0)) / values.std(axis=0)
    position = {gene: i for i, gene in enumerate(assigned["gene"])}
    scores = xp.zeros((adata.n_obs, len(names)), dtype=xp.float32)
    for k, name in enumerate(names):
        columns = [position[g] for g in assigned.loc[assigned["module"] == name, "gene"]]
        member = standardized[:, columns]
        _, vectors = xp.linalg.eigh(member.T @ member / member.shape[0])
        score = member @ vectors[:, -1]
        if float((score * member.mean(axis=1)).sum()) < 0:
            score = -score
        scores[:, k] = score / score.std()
    adata.obsm["module_eigengenes"] = pd.DataFrame(asnumpy(scores), index=adata.obs_names, columns=names)
