"""Reading every supported format from real 10x data; clear errors; atomic and background writes."""

from __future__ import annotations

import os
from itertools import pairwise

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
from conftest import CITESEQ, DROPLETS_H5, MOUSE_ZARR, PBMC_H5, PBMC_MTX
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import sparse

from omicsprep import io
from omicsprep.errors import InputError


def test_detect_format_of_each_kind(tmp_path):
    (tmp_path / "x.h5ad").touch()
    assert io.detect_format(PBMC_H5) == "10x_h5"
    assert io.detect_format(PBMC_MTX) == "10x_mtx"
    assert io.detect_format(MOUSE_ZARR) == "zarr"
    assert io.detect_format(tmp_path / "x.h5ad") == "h5ad"


@pytest.mark.parametrize("path", [PBMC_H5, DROPLETS_H5], ids=["filtered", "raw"])
def test_10x_h5_reads_as_scanpy_reads_it_with_32_bit_indices(path):
    import scanpy as sc

    expected = sc.read_10x_h5(path, gex_only=False)
    adata = io.read_counts(path)
    assert adata.X.dtype == np.float32 and adata.X.indices.dtype == adata.X.indptr.dtype == np.int32
    assert (adata.X != expected.X).nnz == 0
    assert adata.obs.equals(expected.obs) and list(adata.obs_names) == list(expected.obs_names)
    expected.var_names_make_unique()
    assert adata.var.equals(expected.var) and list(adata.var_names) == list(expected.var_names)


def rewrite_matrix(source, target, *, dtypes: dict[str, str]) -> None:
    """A copy of a 10x HDF5 file with its matrix stored contiguous and unfiltered, in ``dtypes`` (field to type)."""
    import h5py

    with h5py.File(source, "r") as original, h5py.File(target, "w") as copy:
        for name in original:
            original.copy(original[name], copy, name=name)
        for field, dtype in dtypes.items():
            values = original["matrix"][field][:]
            del copy["matrix"][field]
            copy["matrix"].create_dataset(field, data=values.astype(dtype))


@pytest.mark.parametrize(
    "dtypes",
    [{"data": "<i4", "indices": "<i8"}, {"data": ">f4", "indices": ">i4"}],
    ids=["cell-ranger-types", "big-endian"],
)
def test_an_unfiltered_10x_h5_is_read_in_threads_to_the_same_matrix(tmp_path, dtypes):
    # Cell Ranger compresses its matrices (HDF5 reads them); uncompressed ones are read straight from the file.
    plain = tmp_path / "plain.h5"
    rewrite_matrix(PBMC_H5, plain, dtypes=dtypes)
    expected, adata = io.read_counts(PBMC_H5), io.read_counts(plain)
    assert adata.X.indices.dtype == np.int32
    for field in ("data", "indices", "indptr"):
        assert np.array_equal(getattr(adata.X, field), getattr(expected.X, field)), field


def test_a_truncated_10x_h5_is_refused_clearly(tmp_path):
    plain = tmp_path / "plain.h5"
    rewrite_matrix(PBMC_H5, plain, dtypes={"data": "<i4", "indices": "<i8"})
    os.truncate(plain, plain.stat().st_size // 2)
    with pytest.raises(InputError, match="cannot be read as 10x_h5"):
        io.read_counts(plain)


def test_h5_and_mtx_folders_hold_the_same_matrix():
    from_h5 = io.read_counts(PBMC_H5)
    from_mtx = io.read_counts(PBMC_MTX)
    assert from_h5.shape == (1107, 507)
    assert sparse.isspmatrix_csr(from_h5.X)
    assert list(from_h5.obs_names) == list(from_mtx.obs_names)
    assert list(from_h5.var_names) == list(from_mtx.var_names)
    assert (from_h5.X != from_mtx.X).nnz == 0
    assert from_h5.X.sum() == pytest.approx(from_h5.X.astype(np.int64).sum())


def test_v2_mtx_folder_with_genes_tsv(tmp_path):
    import scipy.io

    adata = io.read_counts(PBMC_H5)
    folder = tmp_path / "v2"
    folder.mkdir()
    scipy.io.mmwrite(folder / "matrix.mtx", adata.X.T.tocoo())
    (folder / "genes.tsv").write_text(
        "".join(f"{gid}\t{name}\n" for gid, name in zip(adata.var["gene_ids"], adata.var_names, strict=False))
    )
    (folder / "barcodes.tsv").write_text("".join(f"{b}\n" for b in adata.obs_names))
    v2 = io.read_counts(folder)
    assert v2.shape == adata.shape
    assert (v2.X != adata.X).nnz == 0


def test_zarr_and_h5ad_read_with_unique_names(tmp_path):
    mouse = io.read_counts(MOUSE_ZARR)
    assert mouse.shape == (10000, 1000)
    assert mouse.var_names.is_unique  # the source repeats e.g. 'Rp1'
    assert sparse.isspmatrix_csr(mouse.X)
    path = tmp_path / "mouse.h5ad"
    io.write_h5ad(mouse, path)
    again = io.read_counts(path)
    assert (again.X != mouse.X).nnz == 0


def test_missing_file_is_named(tmp_path):
    with pytest.raises(InputError, match=r"nope.h5.*does not exist"):
        io.read_counts(tmp_path / "nope.h5")


def test_unknown_format_is_named(tmp_path):
    path = tmp_path / "counts.xlsx"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match=r"counts\.xlsx.*unknown format"):
        io.read_counts(path)


def test_empty_matrix_is_refused(tmp_path):
    path = tmp_path / "empty.h5ad"
    ad.AnnData(sparse.csr_matrix((0, 5), dtype=np.float32)).write_h5ad(path)
    with pytest.raises(InputError, match=r"empty\.h5ad.*matrix is empty \(0 cells x 5 genes\)"):
        io.read_counts(path)


def test_negative_values_are_refused(tmp_path):
    path = tmp_path / "neg.h5ad"
    ad.AnnData(sparse.csr_matrix(np.array([[1.0, -2.0], [3.0, 0.0]], dtype=np.float32))).write_h5ad(path)
    with pytest.raises(InputError, match="negative values"):
        io.read_counts(path)


def test_normalized_values_are_refused(tmp_path):
    path = tmp_path / "normalized.h5ad"
    ad.AnnData(sparse.csr_matrix(np.array([[1.5, 0.0], [3.0, 0.2]], dtype=np.float32))).write_h5ad(path)
    with pytest.raises(InputError, match="non-integer values"):
        io.read_counts(path)


def test_explicit_format_is_checked(tmp_path):
    with pytest.raises(InputError, match="unknown format 'loom'"):
        io.resolve_format(PBMC_H5, fmt="loom")
    assert io.resolve_format(PBMC_MTX, fmt="10x_mtx") == "10x_mtx"


def test_error_names_the_sample():
    error = InputError("matrix is empty", path="x.h5").for_sample("s1")
    assert str(error) == "sample 's1': file 'x.h5': matrix is empty"


def test_atomic_write_gives_normal_permissions(tmp_path):
    target = tmp_path / "out.tsv"
    with io.atomic_path(target) as tmp:
        tmp.write_text("done")
    assert target.read_text() == "done"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.tsv"
    with pytest.raises(RuntimeError), io.atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_read_single_elements(tmp_path, pbmc):
    pbmc.obsm["X_umap"] = np.zeros((pbmc.n_obs, 2))
    path = tmp_path / "a.h5ad"
    io.write_h5ad(pbmc, path)
    elements = io.read_h5ad_elements(path, ["obs", "obsm/X_umap"])
    assert elements["obsm/X_umap"].shape == (pbmc.n_obs, 2)
    assert list(elements["obs"].index) == list(pbmc.obs_names)


def test_elements_skipped_are_not_read(tmp_path):
    """What rule merge reads of a sample: its counts, cells and genes; the rest stays on disk."""
    adata = clustered_cells()
    io.write_h5ad(adata, tmp_path / "a.h5ad", compression="gzip")
    partial = io.read_h5ad(tmp_path / "a.h5ad", skip=("X", "obsm", "obsp", "uns"))
    assert partial.X is None and not partial.obsm and not partial.obsp and not partial.uns
    assert (partial.layers["counts"] != adata.layers["counts"]).nnz == 0
    assert list(partial.obs_names) == list(adata.obs_names) and list(partial.var_names) == list(adata.var_names)


def test_has_feature_type_reads_the_feature_list_only():
    assert io.has_feature_type(PBMC_H5, "Gene Expression")
    assert not io.has_feature_type(PBMC_H5, "Antibody Capture")
    assert not io.has_feature_type(PBMC_MTX, "Antibody Capture")
    assert io.has_feature_type(CITESEQ / "cells", "Antibody Capture")


def clustered_cells() -> ad.AnnData:
    adata = io.read_counts(PBMC_H5)[:300].copy()
    adata.X.sort_indices()  # as the pipeline's matrices are: the layers below share X's indices
    adata.layers["counts"] = adata.X.copy()
    adata.X = adata.X.log1p()
    adata.obs["cluster"] = np.where(np.arange(adata.n_obs) % 3 == 0, "a", "b")  # text, written as categories
    adata.obsm["X_umap"] = np.arange(adata.n_obs * 2, dtype=np.float32).reshape(-1, 2)
    adata.obsp["connectivities"] = sparse.eye(adata.n_obs, format="csr")
    adata.uns["params"] = {"seed": 0, "method": "leiden"}
    return adata


def encodings(path) -> dict[str, tuple]:
    """Every element of an HDF5 file, by its path (hard links too): anndata encoding, shape, data type."""
    found = {}

    def walk(group, prefix: str) -> None:
        for name, item in group.items():
            attrs = item.attrs
            found[prefix + name] = (
                attrs.get("encoding-type"),
                attrs.get("encoding-version"),
                tuple(attrs.get("shape", ())),
                getattr(item, "dtype", None),
            )
            if isinstance(item, h5py.Group):
                walk(item, f"{prefix}{name}/")

    with h5py.File(path) as file:
        walk(file, "")
    return found


def test_an_h5ad_written_in_parts_holds_what_anndata_writes(tmp_path):
    """Written whole or in parts, an .h5ad holds what anndata's writer writes; the counts
    share X's indices and index pointers."""
    reference, whole, parted = clustered_cells(), clustered_cells(), clustered_cells()
    reference.write_h5ad(tmp_path / "anndata.h5ad")
    io.write_h5ad(whole, tmp_path / "whole.h5ad")
    with io.h5ad_in_parts(parted, tmp_path / "parted.h5ad") as parts:
        parts.write("X", parted.X)
        parts.write_layers(dict(parted.layers), x=parted.X)
        parted.X = parted.X.copy()  # another copy of the same values, as brought back from the GPU
        parts.finish(parted)
    one = ad.read_h5ad(tmp_path / "anndata.h5ad")
    saved = parted.X.indices.nbytes + parted.X.indptr.nbytes
    for name in ("whole.h5ad", "parted.h5ad"):
        two = ad.read_h5ad(tmp_path / name)
        assert (one.X != two.X).nnz == 0 and (one.layers["counts"] != two.layers["counts"]).nnz == 0
        # The counts' indices and index pointers are X's (hard links), not copies.
        with h5py.File(tmp_path / name) as written:
            for part in ("indices", "indptr"):
                assert written[f"layers/counts/{part}"] == written[f"X/{part}"]
        assert (tmp_path / name).stat().st_size < (tmp_path / "anndata.h5ad").stat().st_size - 0.9 * saved
        assert encodings(tmp_path / name) == encodings(tmp_path / "anndata.h5ad")
        pd.testing.assert_frame_equal(one.obs, two.obs)
        pd.testing.assert_frame_equal(one.var, two.var)
        assert isinstance(two.obs["cluster"].dtype, pd.CategoricalDtype)
        np.testing.assert_array_equal(one.obsm["X_umap"], two.obsm["X_umap"])
        assert (one.obsp["connectivities"] != two.obsp["connectivities"]).nnz == 0
        assert two.uns["params"] == {"seed": 0, "method": "leiden"}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["anndata.h5ad", "parted.h5ad", "whole.h5ad"]


def test_layers_link_only_to_the_matrix_written_as_x(tmp_path):
    """Counts laid out as an X other than the one written (re-sorted since, say) are written whole."""
    adata = clustered_cells()
    with io.h5ad_in_parts(adata, tmp_path / "a.h5ad") as parts:
        parts.write("X", adata.X)
        parts.write_layers(dict(adata.layers), x=adata.X.copy())
        parts.finish(adata)
    with h5py.File(tmp_path / "a.h5ad") as written:
        assert written["layers/counts/indices"] != written["X/indices"]
    assert (ad.read_h5ad(tmp_path / "a.h5ad").layers["counts"] != adata.layers["counts"]).nnz == 0


@pytest.mark.parametrize(
    ("qc_compression", "changed", "copied"), [("gzip", False, True), (None, False, False), ("gzip", True, False)]
)
def test_counts_stored_as_here_are_copied_from_the_file_they_were_read_from(
    tmp_path, monkeypatch, qc_compression, changed, copied
):
    """Rule cluster writes qc's counts again beside their normalized values. Stored in qc's file as this one
    stores them (compression, types), the counts' values and the indices they share with X are copied as
    stored, not compressed again; stored otherwise, or not the file's (a value changed), they are written."""
    from omicsprep.io import deflated

    cells = clustered_cells()
    qc = ad.AnnData(cells.layers["counts"].copy(), obs=cells.obs[[]], var=cells.var)
    monkeypatch.setattr(deflated, "CHUNK_BYTES", 4096)
    io.write_h5ad(qc, tmp_path / "qc.h5ad", compression=qc_compression)
    counts = io.read_h5ad(tmp_path / "qc.h5ad").X
    if changed:
        counts.data[0] += 1
    normalized = counts.copy()
    normalized.data = np.log1p(normalized.data)
    monkeypatch.setattr(deflated, "CHUNK_BYTES", 8192)  # what this file compresses is told apart by its chunks
    with io.h5ad_in_parts(cells, tmp_path / "processed.h5ad", compression="gzip") as parts:
        parts.write_with_counts(normalized, counts=counts, counts_file=tmp_path / "qc.h5ad")
        cells.X, cells.layers["counts"] = normalized.copy(), counts.copy()
        parts.finish(cells)
    back = ad.read_h5ad(tmp_path / "processed.h5ad")
    np.testing.assert_array_equal(back.X.toarray(), normalized.toarray())
    np.testing.assert_array_equal(back.layers["counts"].toarray(), counts.toarray())
    assert encodings(tmp_path / "processed.h5ad")["layers/counts"] == encodings(tmp_path / "processed.h5ad")["X"]
    with h5py.File(tmp_path / "qc.h5ad") as source, h5py.File(tmp_path / "processed.h5ad") as written:
        for part in ("indices", "indptr"):
            assert written[f"layers/counts/{part}"] == written[f"X/{part}"]
        assert filters(written["X/indices"]) == ["shuffle", "deflate"] and filters(written["X/data"]) == ["deflate"]
        as_in_qc = [
            written[ours].chunks == source[theirs].chunks
            for ours, theirs in (("X/indices", "X/indices"), ("layers/counts/data", "X/data"))
        ]
        assert as_in_qc == [copied, copied] and written["X/data"].chunks != source["X/data"].chunks


def test_an_h5ad_in_parts_leaves_nothing_unless_finished_with_what_was_written(tmp_path):
    adata = clustered_cells()
    with pytest.raises(RuntimeError, match="not finished"), io.h5ad_in_parts(adata, tmp_path / "a.h5ad") as parts:
        parts.write("X", adata.X)
    with pytest.raises(ValueError, match="X changed"), io.h5ad_in_parts(adata, tmp_path / "a.h5ad") as parts:
        parts.write("X", adata.X)
        parts.finish(adata[:, :100].copy())
    assert list(tmp_path.iterdir()) == []


def filters(dataset) -> list[str]:
    plist = dataset.id.get_create_plist()
    return [plist.get_filter(index)[3].decode() for index in range(plist.get_nfilters())]


@pytest.mark.parametrize(
    ("field", "kwargs", "read_here"),
    [
        ("indices", {"compression": "gzip", "shuffle": True}, True),  # as Cell Ranger stores them
        ("data", {"compression": "gzip"}, True),
        ("indices", {"compression": "lzf"}, False),  # another filter: HDF5 reads it
        ("indices", {"compression": "gzip", "fletcher32": True}, False),
    ],
    ids=["gzip-shuffle", "gzip", "lzf", "gzip-checksum"],
)
def test_deflated_10x_chunks_are_read_in_threads_to_the_same_matrix(tmp_path, field, kwargs, read_here):
    from omicsprep.io import deflated

    chunked = tmp_path / "chunked.h5"
    with h5py.File(PBMC_H5, "r") as original, h5py.File(chunked, "w") as copy:
        original.copy(original["matrix"], copy, name="matrix")
        values = original["matrix"][field][:]
        del copy["matrix"][field]
        copy["matrix"].create_dataset(field, data=values, chunks=(1000,), **kwargs)  # many chunks, the last partial
    with h5py.File(chunked, "r") as copy:
        assert (deflated.read_deflated(copy["matrix"][field]) is not None) == read_here
    expected, adata = io.read_counts(PBMC_H5), io.read_counts(chunked)
    for part in ("data", "indices", "indptr"):
        assert np.array_equal(getattr(adata.X, part), getattr(expected.X, part)), part


def written_plain_bytes(path, names) -> list[int]:
    with h5py.File(path) as written:
        return [written[name].id.get_storage_size() for name in names]


def test_a_gzip_h5ad_is_deflated_in_threads_and_read_back_by_any_reader(tmp_path, monkeypatch):
    """``h5ad_compression: gzip``: HDF5's own filters, so anndata reads the file; its matrices take less than half."""
    from omicsprep.io import deflated, writers

    monkeypatch.setattr(deflated, "CHUNK_BYTES", 1024)  # many chunks, the last partial
    monkeypatch.setattr(writers, "DEFLATED_MIN_BYTES", 1024)  # X_umap deflated here too
    adata = clustered_cells()
    adata.obsm["X_pca"] = np.random.default_rng(0).normal(size=(adata.n_obs, 30)).astype(np.float32)
    adata.obs["score"] = np.linspace(0, 1, adata.n_obs)  # a column of a data frame, deflated here too
    adata.copy().write_h5ad(tmp_path / "anndata.h5ad", compression="gzip")
    io.write_h5ad(adata.copy(), tmp_path / "plain.h5ad")
    io.write_h5ad(adata.copy(), tmp_path / "gzip.h5ad", compression="gzip")
    assert encodings(tmp_path / "gzip.h5ad") == encodings(tmp_path / "anndata.h5ad")
    with h5py.File(tmp_path / "gzip.h5ad") as written:
        assert filters(written["X/indices"]) == ["shuffle", "deflate"] and filters(written["X/data"]) == ["deflate"]
        assert written["X/indices"].id.get_num_chunks() > 1 and filters(written["obsm/X_pca"]) == ["deflate"]
        assert written["layers/counts/indices"] == written["X/indices"]
        assert filters(written["obs/score"]) == ["deflate"] and written["obs/score"].id.get_num_chunks() > 1
        matrices = ("X/data", "X/indices", "X/indptr", "layers/counts/data")
        stored = sum(written[name].id.get_storage_size() for name in matrices)
    assert stored < sum(written_plain_bytes(tmp_path / "plain.h5ad", matrices)) / 2
    for read in (ad.read_h5ad, io.read_h5ad):
        back = read(tmp_path / "gzip.h5ad")
        assert type(back.X) is type(adata.X) and (back.X != adata.X).nnz == 0
        assert (back.layers["counts"] != adata.layers["counts"]).nnz == 0
        assert (back.obsp["connectivities"] != adata.obsp["connectivities"]).nnz == 0
        for key in ("X_pca", "X_umap"):
            np.testing.assert_array_equal(back.obsm[key], adata.obsm[key])
        pd.testing.assert_frame_equal(back.obs, ad.read_h5ad(tmp_path / "anndata.h5ad").obs)
        assert back.uns["params"] == {"seed": 0, "method": "leiden"}


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_matrix_in_row_blocks_is_written_block_by_block_as_one(tmp_path, monkeypatch, compression):
    """X and counts in row blocks (a matrix beyond CuPy's 32-bit indices, on the GPU) are written as
    one matrix, each block brought over in turn, the counts linked to X's indices; every reader reads them."""
    from omicsprep.backend import row_block_bounds, row_blocks
    from omicsprep.io import deflated

    monkeypatch.setattr(deflated, "CHUNK_BYTES", 4096)  # chunks that span blocks, the last partial
    adata = clustered_cells()
    bounds = row_block_bounds(adata.X.indptr, max_entries=adata.X.nnz // 7)
    assert len(bounds) > 7

    def blocked(matrix):
        return row_blocks([matrix[start:stop] for start, stop in pairwise(bounds)])

    expected = adata.copy()
    blocks_in_memory = {"X": blocked(adata.X), "counts": blocked(adata.layers["counts"])}
    adata.X, adata.layers["counts"] = blocks_in_memory["X"], blocks_in_memory["counts"]
    assert io.stored_bytes(adata) == pytest.approx(io.stored_bytes(expected), rel=0.01)
    assert io.values_bytes(adata.X) == expected.X.data.nbytes
    io.write_h5ad(adata, tmp_path / "blocks.h5ad", compression=compression)
    with h5py.File(tmp_path / "blocks.h5ad") as written:
        assert written["layers/counts/indices"] == written["X/indices"]
        assert written["X/indptr"].dtype == np.int64 and written["X/indices"].dtype == np.int32
    for read in (ad.read_h5ad, io.read_h5ad):
        back = read(tmp_path / "blocks.h5ad")
        assert (back.X != expected.X).nnz == 0 and (back.layers["counts"] != expected.layers["counts"]).nnz == 0
        pd.testing.assert_frame_equal(back.obs, ad.read_h5ad(tmp_path / "blocks.h5ad").obs)


def test_an_h5ad_of_anndata_before_0_8_is_read_by_anndata(tmp_path):
    # Such files have no encoding on the file itself; anndata's reader knows their layout.
    clustered_cells().write_h5ad(tmp_path / "old.h5ad")
    with h5py.File(tmp_path / "old.h5ad", "r+") as file:
        del file.attrs["encoding-type"], file.attrs["encoding-version"]
    adata = io.read_h5ad(tmp_path / "old.h5ad")
    assert isinstance(adata, ad.AnnData) and (adata.X != clustered_cells().X).nnz == 0


def test_deflated_arrays_of_every_kind_round_trip(tmp_path, monkeypatch):
    from omicsprep.io import deflated

    monkeypatch.setattr(deflated, "CHUNK_BYTES", 1000)
    rng = np.random.default_rng(0)
    arrays = {
        "sorted-int32": np.sort(rng.integers(0, 20_000, 10_007)).astype(np.int32),
        "int64": np.arange(3001, dtype=np.int64),
        "big-endian": np.arange(999, dtype=">i4"),
        "float32": rng.random(5003).astype(np.float32),
        "bool": rng.random(999) > 0.5,
        "rows": rng.random((1001, 7)).astype(np.float32),
        "one": np.array([5], dtype=np.int32),
    }
    with h5py.File(tmp_path / "a.h5", "w") as file:
        for name, values in arrays.items():
            deflated.create_deflated(file, name, values)
    with h5py.File(tmp_path / "a.h5", "r") as file:
        for name, values in arrays.items():
            np.testing.assert_array_equal(file[name][...], values)  # HDF5's own filters
            back = deflated.read_deflated(file[name])
            assert back.dtype == file[name].dtype, name
            np.testing.assert_array_equal(back, values)
        assert deflated.read_deflated(file["int64"], dtype=np.int32).dtype == np.int32


def test_every_name_of_io_is_found_in_its_module():
    # omicsprep.io imports each name at first use: a name listed there must exist in its module.
    for name in io.__all__:
        assert getattr(io, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'read_everything'"):
        _ = io.read_everything


def same_matrix(ours: sparse.csr_matrix, theirs: sparse.csr_matrix) -> None:
    """The same CSR matrix to the last bit: values, their type, indices and row pointers."""
    assert ours.dtype == theirs.dtype == np.float32
    for name in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name), err_msg=name)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
@pytest.mark.parametrize("layout", ["dense", "csr", "csc"])
def test_the_same_counts_in_any_type_and_layout_are_read_as_one_matrix(tmp_path, dtype, layout):
    reference = io.read_counts(PBMC_H5)
    counts = reference.X.astype(dtype)
    stored = {"dense": counts.toarray(), "csr": counts, "csc": counts.tocsc()}[layout]
    path = tmp_path / "counts.h5ad"
    ad.AnnData(stored, obs=reference.obs[[]], var=reference.var[[]]).write_h5ad(path)
    same_matrix(io.read_counts(path).X, reference.X)
    zarr = tmp_path / "counts.zarr"
    ad.AnnData(stored, obs=reference.obs[[]], var=reference.var[[]]).write_zarr(zarr)
    same_matrix(io.read_counts(zarr).X, reference.X)


def test_counts_stored_as_dense_float64_cluster_as_the_10x_file_does(tmp_path):
    # Issue 45's case: float64 values carried through normalization and PCA had moved cells between clusters.
    from conftest import CLUSTER_OPTIONS, NO_DOUBLETS, QC_OPTIONS

    from omicsprep.rna.pipeline import run_clustering, run_qc

    reference = io.read_counts(PBMC_H5)
    path = tmp_path / "dense.h5ad"
    ad.AnnData(reference.X.toarray().astype(np.float64), obs=reference.obs[[]], var=reference.var).write_h5ad(path)
    results = []
    for counts in (reference, io.read_counts(path)):
        cells, _ = run_qc(counts, options=QC_OPTIONS, doublet_options=NO_DOUBLETS, seed=0, backend="cpu")
        run_clustering(cells, options=CLUSTER_OPTIONS, seed=0, backend="cpu")
        results.append(cells)
    pd.testing.assert_frame_equal(results[0].obs, results[1].obs)
    np.testing.assert_array_equal(results[0].obsm["X_umap"], results[1].obsm["X_umap"])


@settings(max_examples=40, deadline=None)
@given(
    cells=st.integers(1, 12),
    genes=st.integers(1, 9),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.int16, np.int64, np.uint32, np.float32, np.float64]),
    layout=st.sampled_from(["dense", "csr", "csc", "coo_with_repeats"]),
)
def test_any_storage_of_random_counts_reads_as_the_canonical_matrix(
    tmp_path_factory, cells, genes, seed, dtype, layout
):
    """Random counts, stored in any integer or float type and any layout (entries repeated
    and explicit zeros included), read back as one canonical CSR matrix of their sums."""
    rng = np.random.default_rng(seed)
    dense = rng.poisson(1.0, size=(cells, genes)) * (rng.random((cells, genes)) < 0.5)
    if not dense.any():
        dense[0, 0] = 1
    if layout == "coo_with_repeats":  # each entry split in two parts, some of them zero, in random order
        rows, columns = np.nonzero(np.ones_like(dense))
        first = rng.integers(0, dense.ravel() + 1)
        order = rng.permutation(2 * dense.size)
        values = np.concatenate([first, dense.ravel() - first])[order]
        stored = sparse.coo_matrix(
            (values.astype(dtype), (np.tile(rows, 2)[order], np.tile(columns, 2)[order])), shape=dense.shape
        ).tocsr(copy=False)
        stored.has_canonical_format = False
    else:
        stored = {"dense": dense, "csr": sparse.csr_matrix(dense), "csc": sparse.csc_matrix(dense)}[layout]
        stored = stored.astype(dtype)
    path = tmp_path_factory.mktemp("random") / "counts.h5ad"
    ad.AnnData(stored).write_h5ad(path)
    same_matrix(io.read_counts(path).X, sparse.csr_matrix(dense.astype(np.float32)))
