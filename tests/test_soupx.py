"""SoupX: soup profile, autoEstCont and adjustCounts against R SoupX 1.6.2 (recorded) and against the planted truth."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import REPO, import_for_gpu_test
from scipy import sparse

from omicsprep.cells.soupx import RHO_PROBES, estimate_contamination, remove_soup, soup_profile
from omicsprep.testing.reference_runs import missing_r_package

sys.path.insert(0, str(REPO / "tests" / "data" / "soupx"))
import make_reference
from make_reference import TFIDF_MIN, Droplets, SoupxResult

NO_MARKERS = (
    r"^no plausible marker genes: is the sample low in complexity\? Otherwise lower tfidf_min or soup_quantile$"
)


@pytest.fixture(scope="module")
def droplets() -> Droplets:
    return make_reference.generate_droplets()


@pytest.fixture(scope="module")
def soupx_reference(droplets: Droplets) -> SoupxResult:
    """R SoupX's result as recorded in tests/data/soupx, on exactly the input it was recorded on."""
    recorded, checksum = make_reference.load_reference()
    assert make_reference.input_checksum(droplets) == checksum, (
        "the generated droplets differ from those the SoupX reference was recorded on "
        f"(omicsprep/testing/droplets.py changed?): regenerate with `{make_reference.REGENERATE}` (needs R SoupX)"
    )
    return recorded


def assert_close_counts(got: sparse.csr_matrix, expected: sparse.csr_matrix, tolerance: float = 1e-6) -> None:
    difference = abs(got - expected)
    assert difference.max() <= tolerance, difference.max()


def test_soup_profile_is_soupx(droplets, soupx_reference):
    assert np.array_equal(soup_profile(droplets.raw), soupx_reference.soup)


def test_contamination_is_soupx(droplets, soupx_reference):
    estimate = estimate_contamination(
        droplets.cells, soup_profile(droplets.raw), clusters=droplets.cell_type, tfidf_min=TFIDF_MIN
    )
    assert estimate.markers == soupx_reference.markers
    assert abs(estimate.rho - soupx_reference.rho) <= 0.01
    assert estimate.rho == soupx_reference.rho  # the same grid point, measured
    assert estimate.rho_half_max == soupx_reference.rho_half_max


@pytest.mark.parametrize("by", ["cluster", "cell"])
def test_remove_soup_is_soupx(droplets, soupx_reference, by):
    clusters = droplets.cell_type if by == "cluster" else None
    corrected = remove_soup(
        droplets.cells, soupx_reference.soup, rho=soupx_reference.rho, clusters=clusters, backend="cpu"
    )
    assert_close_counts(corrected[droplets.recorded_cells], soupx_reference.corrected[f"by_{by}"])


def test_remove_soup_with_a_rho_per_cell_is_soupx(droplets, soupx_reference):
    corrected = remove_soup(
        droplets.cells, soupx_reference.soup, rho=droplets.cell_rho, clusters=droplets.cell_type, backend="cpu"
    )
    assert_close_counts(corrected[droplets.recorded_cells], soupx_reference.corrected["by_cluster_cell_rho"])


def test_recorded_reference_is_what_r_soupx_gives(droplets, soupx_reference):
    """Re-runs R SoupX (~20 s) where it is installed: the recording must still be its output."""
    if reason := missing_r_package("SoupX"):
        pytest.skip(f"{reason}: the recorded SoupX reference is not re-checked")
    live, _ = make_reference.run_soupx(droplets)
    assert live.markers == soupx_reference.markers
    assert (live.rho, live.rho_half_max) == (soupx_reference.rho, soupx_reference.rho_half_max)
    np.testing.assert_allclose(live.soup, soupx_reference.soup, rtol=1e-12, atol=0)
    for name, recorded in soupx_reference.corrected.items():
        assert_close_counts(live.corrected[name], recorded, tolerance=1e-9)


def test_contamination_is_the_planted_one(droplets):
    estimate = estimate_contamination(
        droplets.cells, soup_profile(droplets.raw), clusters=droplets.cell_type, tfidf_min=TFIDF_MIN
    )
    assert abs(estimate.rho - droplets.ambient_fraction.mean()) <= 0.03


def test_remove_soup_clears_markers_from_other_types(droplets):
    soup = soup_profile(droplets.raw)
    rho = estimate_contamination(droplets.cells, soup, clusters=droplets.cell_type, tfidf_min=TFIDF_MIN).rho
    corrected = remove_soup(droplets.cells, soup, rho=rho, clusters=droplets.cell_type)
    for cell_type, markers in enumerate(droplets.markers):
        others = droplets.cell_type != cell_type
        before = droplets.cells[others][:, markers].sum()
        after = corrected[others][:, markers].sum()
        assert after <= 0.2 * before, (cell_type, before, after)


def test_remove_soup_removes_rho_of_each_cell_at_most(droplets):
    soup = soup_profile(droplets.raw)
    rho = droplets.cell_rho
    totals = np.asarray(droplets.cells.sum(axis=1)).ravel()
    for clusters in (droplets.cell_type, None):
        corrected = remove_soup(droplets.cells, soup, rho=rho, clusters=clusters)
        removed = totals - np.asarray(corrected.sum(axis=1)).ravel()
        assert (corrected.data > 0).all()
        assert (corrected > droplets.cells).nnz == 0
        if clusters is None:  # every cell loses exactly its soup; by cluster, each cluster does
            np.testing.assert_allclose(removed, rho * totals, rtol=1e-9)
        else:
            np.testing.assert_allclose(
                np.bincount(clusters, weights=removed), np.bincount(clusters, weights=rho * totals), rtol=1e-9
            )


def test_remove_soup_leaves_the_input_alone(droplets):
    before = droplets.cells.copy()
    remove_soup(droplets.cells, soup_profile(droplets.raw), rho=0.1, clusters=droplets.cell_type)
    assert (droplets.cells != before).nnz == 0
    assert np.array_equal(droplets.cells.indptr, before.indptr)


def test_no_markers_is_one_clear_error(droplets):
    # No gene reaches a tf-idf of 50: no marker.
    with pytest.raises(ValueError, match="no plausible marker genes"):
        estimate_contamination(droplets.cells, soup_profile(droplets.raw), clusters=droplets.cell_type, tfidf_min=50)


@pytest.mark.gpu
@pytest.mark.parametrize("by", ["cluster", "cell"])
def test_remove_soup_gpu_is_cpu(droplets, request, by):
    import_for_gpu_test(request.config, "cupy")
    soup = soup_profile(droplets.raw)
    rho = droplets.cell_rho
    clusters = droplets.cell_type if by == "cluster" else None
    cpu = remove_soup(droplets.cells, soup, rho=rho, clusters=clusters, backend="cpu")
    gpu = remove_soup(droplets.cells, soup, rho=rho, clusters=clusters, backend="gpu")
    assert isinstance(gpu, sparse.csr_matrix)
    assert_close_counts(gpu, cpu)


def test_the_pooling_clusters_keep_genes_that_every_cell_counts():
    """SoupX's and DecontX's pooling clusters (``quick_clusters``) leave out only the genes no cell
    counts: here two groups differ only in eight genes that every cell counts."""
    import anndata as ad

    from omicsprep.cells.ambient import quick_clusters

    rng = np.random.default_rng(0)
    groups = np.repeat([0, 1], 150)
    markers = [np.where(groups == 0, rng.poisson(30, 300), rng.poisson(3, 300)) + 1 for _ in range(8)]
    noise = rng.poisson(0.5, size=(300, 40))
    cells = ad.AnnData(sparse.csr_matrix(np.column_stack([*markers, noise]).astype(np.float32)))
    clusters = quick_clusters(cells, resolution=0.5, seed=0, backend="cpu")
    purity = sum(np.bincount(groups[clusters == cluster]).max() for cluster in np.unique(clusters)) / len(groups)
    assert len(np.unique(clusters)) >= 2 and purity > 0.75  # 0.83; without the markers one cluster, 0.5


def test_the_soup_is_the_droplets_strictly_inside_its_range():
    """SoupX's estimateSoup: totals above the lower bound and below the upper, not at them; no count
    there is one error naming the range; a soup of one UMI is that gene alone."""
    totals_and_genes = [(10, 0), (11, 1), (50, 2), (99, 1), (100, 3)]  # droplet total, its only gene
    rows = [np.eye(4)[gene] * total for total, gene in totals_and_genes]
    raw = sparse.csr_matrix(np.array(rows, dtype=np.float32))
    expected = np.array([0, 11 + 99, 50, 0]) / 160
    np.testing.assert_allclose(soup_profile(raw, soup_range=(10, 100)), expected, rtol=1e-12)
    with pytest.raises(ValueError, match=r"^no counts in droplets with 0 < total < 5: no soup profile$"):
        soup_profile(raw, soup_range=(0, 5))
    one = sparse.csr_matrix(np.array([[0, 1, 0, 0], [0, 0, 0, 500]], dtype=np.float32))
    np.testing.assert_array_equal(soup_profile(one, soup_range=(0, 100)), [0, 1, 0, 0])


def test_a_cell_expresses_a_marker_by_bh_over_the_cells_of_that_marker():
    """SoupX's estimateNonExpressingCells adjusts each marker's Poisson p-values over the cells
    (BH per gene): one cell with 6 counts where 1 is expected (p = 6e-4) among 100 cells is not
    significant at 0.05 (q = 0.06), though it would be over that cell's two markers (q = 1.2e-3)."""
    from omicsprep.cells.soupx import _non_expressing

    counts = np.zeros((100, 3))
    counts[:, 2] = 100
    counts[0, 0], counts[0, 2] = 6, 94  # every cell's total is 100
    soup = np.array([0.01, 0.01, 0.98])

    def non_expressing() -> np.ndarray:
        return _non_expressing(
            sparse.csr_matrix(counts), soup, markers=np.array([0, 1]), cluster_of=np.zeros(100, dtype=int),
            n_clusters=1, max_contamination=1.0, fdr=0.05,
        )  # fmt: skip

    np.testing.assert_array_equal(non_expressing(), [[True, True]])
    counts[0, 0], counts[0, 2] = 9, 91  # p = 1.1e-6: significant over the cells too
    np.testing.assert_array_equal(non_expressing(), [[False, True]])


def test_benjamini_hochberg_adjusts_along_the_axis_asked():
    """quickMarkers adjusts each cluster's p-values over the genes (axis 1 here), estimateNonExpressingCells
    each marker's over the cells (axis 0)."""
    from omicsprep.cells.soupx import _benjamini_hochberg

    p_values = np.array([[0.01, 0.04, 0.5], [0.03, 0.02, 0.9]])
    np.testing.assert_allclose(_benjamini_hochberg(p_values, axis=1), [[0.03, 0.06, 0.5], [0.045, 0.045, 0.9]])
    np.testing.assert_allclose(_benjamini_hochberg(p_values, axis=0), [[0.02, 0.04, 0.9], [0.03, 0.04, 0.9]])


def test_a_marker_is_a_clusters_gene_by_the_hypergeometric_tail_from_its_count():
    """quickMarkers' test: P(X >= k) for k of a cluster's 20 cells (of 100) expressing a gene that 5
    cells express. k = 4: p = 0.0054, a marker at FDR 0.01 (from k - 1 it would be 0.053); k = 3:
    p = 0.053, none (from k + 1 it would be 0.0002)."""
    from omicsprep.cells.soupx import _marker_scores

    cluster_of = np.repeat([0, 1], [20, 80])
    for in_cluster, is_marker in ((4, True), (3, False)):
        expressing = [*range(in_cluster), *range(50, 55 - in_cluster)]  # 5 in all
        counts = np.zeros((100, 1))
        counts[expressing, 0] = 1
        score = _marker_scores(sparse.csr_matrix(counts), cluster_of, 2)[0]
        assert np.isfinite(score) == is_marker, in_cluster


def test_a_cell_expresses_a_marker_beyond_the_soup_at_its_own_depth():
    """estimateNonExpressingCells' Poisson test: expected = the cell's own total x the largest
    contamination x the soup's share, and P(X >= count). Cell A (total 100, 4 of the marker) expects
    1.0: p = 0.019, q = 0.038 over the two cells, expressing at FDR 0.05 (from count - 2, from
    the total of all cells, or dividing by the contamination, it would not be). Cell B, none of
    the marker: q = 1, not expressing even at FDR 1."""
    from omicsprep.cells.soupx import _non_expressing

    counts = sparse.csr_matrix(np.array([[4.0, 96.0], [0.0, 900.0]]))

    def non_expressing(fdr: float) -> np.ndarray:
        return _non_expressing(
            counts, np.array([0.02, 0.98]), markers=np.array([0]), cluster_of=np.array([0, 1]), n_clusters=2,
            max_contamination=0.5, fdr=fdr,
        )  # fmt: skip

    np.testing.assert_array_equal(non_expressing(0.05), [[False], [True]])
    np.testing.assert_array_equal(non_expressing(1.0), [[False], [True]])


def test_a_marker_needs_a_q_value_below_the_fdr_not_at_it():
    """quickMarkers calls q < FDR: a gene only a one-cell cluster's cell expresses has p = q = 1/100
    among 100 cells, exactly MARKER_FDR (0.01), and is no marker; among 200 cells (p = 0.005) it is."""
    from omicsprep.cells.soupx import MARKER_FDR, _marker_scores

    assert MARKER_FDR == 0.01
    for n_cells, is_marker in ((100, False), (200, True)):
        counts = np.zeros((n_cells, 1))
        counts[0, 0] = 1
        cluster_of = np.minimum(np.arange(n_cells), 1)
        assert np.isfinite(_marker_scores(sparse.csr_matrix(counts), cluster_of, 2)[0]) == is_marker, n_cells


def test_no_cells_is_the_no_markers_error():
    """Without cells there are no clusters, so no markers: the error that says so, not NumPy's
    reduction of an empty axis."""
    cells = sparse.csr_matrix((0, 4))
    with pytest.raises(ValueError, match=NO_MARKERS):
        estimate_contamination(cells, np.full(4, 0.25), clusters=np.array([], dtype=int))


def test_the_defaults_are_soupxs_and_the_configurations():
    """estimate_contamination's and soup_profile's defaults are SoupX's (autoEstCont's tfidfMin = 1,
    soupQuantile = 0.9, ...) as the configuration's SoupX options hold them."""
    import inspect

    from omicsprep.options.counting import SoupxOptions

    configured = SoupxOptions()
    for function in (estimate_contamination, soup_profile):
        for name, parameter in inspect.signature(function).parameters.items():
            if parameter.default is not inspect.Parameter.empty and hasattr(configured, name):
                assert parameter.default == getattr(configured, name), (function.__name__, name)
    assert configured.tfidf_min == 1.0 and configured.soup_quantile == 0.9
    assert inspect.signature(remove_soup).parameters["backend"].default == "cpu"


def test_called_without_cuts_the_markers_are_autoestconts(droplets):
    """The defaults at work, not only in the signature: the droplets' markers with tf-idf above
    autoEstCont's 1 are five (none above 2), and with no other cut the best 100 of 937 are taken."""
    soup = soup_profile(droplets.raw)
    markers = estimate_contamination(droplets.cells, soup, clusters=droplets.cell_type).markers
    assert len(markers) == 5
    assert markers == estimate_contamination(droplets.cells, soup, clusters=droplets.cell_type, tfidf_min=1.0).markers
    uncut = estimate_contamination(droplets.cells, soup, clusters=droplets.cell_type, tfidf_min=0.0, soup_quantile=0.0)
    assert len(uncut.markers) == 100


def marker_scores(droplets: Droplets) -> np.ndarray:
    """Each gene's best tf-idf as a marker of the planted types (quickMarkers)."""
    from omicsprep.cells.soupx import _marker_scores

    _, cluster_of = np.unique(droplets.cell_type, return_inverse=True)
    return _marker_scores(sparse.csr_matrix(droplets.cells, dtype=np.float64), cluster_of, cluster_of.max() + 1)


def test_markers_need_a_score_and_a_soup_share_strictly_above_their_cuts(droplets):
    """autoEstCont keeps tf-idf > tfidfMin and soup > its quantile: with either cut at the best
    gene that passes the other, no gene passes both."""
    soup, scores = soup_profile(droplets.raw), marker_scores(droplets)
    best_score = scores[soup > np.quantile(soup, 0.9)].max()
    top_soup = soup[scores > TFIDF_MIN].max()
    top_soup_rank = np.flatnonzero(np.sort(soup) == top_soup)[0]
    quantile = top_soup_rank / (soup.size - 1)
    assert np.quantile(soup, quantile) == top_soup
    for cuts in ({"tfidf_min": float(best_score)}, {"tfidf_min": TFIDF_MIN, "soup_quantile": quantile}):
        with pytest.raises(ValueError, match=NO_MARKERS):
            estimate_contamination(droplets.cells, soup, clusters=droplets.cell_type, **cuts)


def test_the_markers_chosen_are_logged_with_their_counts(droplets, caplog):
    """The log says how many genes pass the tf-idf cut, how many also the soup's quantile, and how
    many are taken (at most max_markers); the cut at the default and at a candidate's own score."""
    soup, scores = soup_profile(droplets.raw), marker_scores(droplets)
    in_soup = soup > np.quantile(soup, 0.9)
    for tfidf_min in (TFIDF_MIN, float(np.sort(scores[in_soup & (scores > TFIDF_MIN)])[-6])):
        passing = scores > tfidf_min
        candidates = passing & in_soup
        caplog.clear()
        with caplog.at_level("INFO", logger="omicsprep"):
            estimate_contamination(
                droplets.cells, soup, clusters=droplets.cell_type, tfidf_min=tfidf_min, max_markers=3
            )
        expected = (
            f"SoupX markers: {passing.sum()} pass tf-idf > {tfidf_min:g}, {candidates.sum()} also the soup quantile; "
            f"taking {min(3, candidates.sum())}"
        )
        assert expected in caplog.messages
        assert candidates.sum() > 3


def test_fewer_than_ten_markers_are_a_warning(droplets, caplog):
    """SoupX warns below ten markers: nine are, ten are not."""
    soup = soup_profile(droplets.raw)
    for max_markers, warned in ((9, True), (10, False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="omicsprep"):
            estimate_contamination(
                droplets.cells, soup, clusters=droplets.cell_type, tfidf_min=TFIDF_MIN, max_markers=max_markers
            )
        warning = "only 9 SoupX marker genes: the contamination estimate may be unstable"
        assert (warning in caplog.messages) == warned
        assert not any("marker genes" in message for message in caplog.messages if message != warning)


def test_fewer_than_ten_cluster_estimates_are_a_warning_and_none_an_error(droplets, caplog):
    """Each marker here gives five cluster-level estimates: one marker (five) warns, two (ten) do
    not; where the largest contamination allowed explains no cluster's counts, none is one error."""
    soup = soup_profile(droplets.raw)
    warning = "only 5 cluster-level estimates of rho: the estimate may be unstable"
    for max_markers, warned in ((1, True), (2, False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="omicsprep"):
            estimate = estimate_contamination(
                droplets.cells, soup, clusters=droplets.cell_type, tfidf_min=TFIDF_MIN, max_markers=max_markers
            )
        assert estimate.estimates["used"].sum() == 5 * max_markers
        assert (warning in caplog.messages) == warned
        assert not any("cluster-level" in message for message in caplog.messages if message != warning)
    with pytest.raises(
        ValueError, match=r"^every cluster expresses every marker: no contamination estimate \(set rho by hand\)$"
    ):
        estimate_contamination(
            droplets.cells, soup, clusters=droplets.cell_type, tfidf_min=TFIDF_MIN, contamination_range=(1e-6, 1e-5)
        )


def test_the_posterior_is_soupxs_gamma_prior_updated_by_each_used_estimate(droplets):
    """SoupX's autoEstCont: v2 = (sd / rho)^2, k = 1 + v2^-2 / 2 * (1 + sqrt(1 + 4 v2)),
    theta = rho / (k - 1); each used estimate's posterior is gamma(k + observed, theta / (1 + theta
    expected)) and the curve is their mean. A prior whose sd is half its mode, as at SoupX's
    default sd / mode = 2 the square and the double of it are both 4."""
    from scipy import stats

    prior_rho, prior_sd = 0.10, 0.05
    estimate = estimate_contamination(
        droplets.cells,
        soup_profile(droplets.raw),
        clusters=droplets.cell_type,
        tfidf_min=TFIDF_MIN,
        prior_rho=prior_rho,
        prior_rho_std_dev=prior_sd,
    )
    used = estimate.estimates[estimate.estimates["used"]]
    v2 = (prior_sd / prior_rho) ** 2
    k = 1 + v2**-2 / 2 * (1 + np.sqrt(1 + 4 * v2))
    theta = prior_rho / (k - 1)
    rho = RHO_PROBES
    expected = np.mean(
        [stats.gamma.pdf(rho, k + row.observed, scale=theta / (1 + theta * row.expected)) for row in used.itertuples()],
        axis=0,
    )
    assert len(used) >= 10
    np.testing.assert_allclose(estimate.posterior, expected, rtol=1e-9, atol=0)


def test_each_cluster_estimate_is_its_observed_over_its_expected_soup_counts(droplets):
    """A row per cluster and marker: the cluster's counts of the marker, its total counts times
    the marker's soup share, and their ratio; the columns by these names, in this order."""
    soup = soup_profile(droplets.raw)
    estimate = estimate_contamination(droplets.cells, soup, clusters=droplets.cell_type, tfidf_min=TFIDF_MIN)
    table = estimate.estimates
    assert list(table.columns) == ["gene", "cluster", "observed", "expected", "rho", "used"]
    assert sorted(set(table["gene"])) == sorted(estimate.markers)
    assert len(table) == len(estimate.markers) * np.unique(droplets.cell_type).size
    cells = droplets.cells.tocsc()
    for row in table.itertuples():
        in_cluster = droplets.cell_type == row.cluster
        assert row.observed == cells[in_cluster, row.gene].sum()
        assert row.expected == pytest.approx(cells[in_cluster].sum() * soup[row.gene], rel=1e-12)
        assert row.rho == pytest.approx(row.observed / row.expected, rel=1e-12)


def test_the_estimate_is_the_posteriors_mode_within_the_range_ends_included(droplets):
    """The planted contamination lies below 0.3: searched within [0.3, 0.5] the estimate is 0.3,
    the range's lowest probe; within [0.01, 0.05], 0.05, its highest; and a range where the
    posterior is nothing (its density underflows to 0) is the estimate's whole half-maximum
    interval, not an error (a prior sharp around 0.05 makes it so near 1)."""
    soup = soup_profile(droplets.raw)

    def estimated(lowest: int, highest: int, prior_sd: float = 0.1):
        return estimate_contamination(
            droplets.cells,
            soup,
            clusters=droplets.cell_type,
            tfidf_min=TFIDF_MIN,
            contamination_range=(RHO_PROBES[lowest], RHO_PROBES[highest]),
            prior_rho_std_dev=prior_sd,
        )

    unbounded = estimated(10, 800)
    assert 0.05 < unbounded.rho < 0.3
    assert estimated(300, 500).rho == RHO_PROBES[300]
    assert estimated(10, 50).rho == RHO_PROBES[50]
    nothing = estimated(990, 1000, prior_sd=0.001)
    assert nothing.posterior[990:].max() == 0
    assert nothing.rho == RHO_PROBES[990]
    assert nothing.rho_half_max == (RHO_PROBES[990], RHO_PROBES[1000])


@pytest.mark.parametrize("clusters", [None, np.array(["a", "b", "a"])])
def test_remove_soup_of_no_counts_and_of_one_count(clusters):
    """Cells without counts stay empty; a lone count of 4 at a contamination of 0.25 (its cell's
    soup is 1) loses 1, whatever the soup profile's shares (it is the cell's only gene). Genes
    after the last counted one keep their columns."""
    soup = np.array([0.5, 0.3, 0.2])
    empty = remove_soup(sparse.csr_matrix((3, 3)), soup, rho=0.25, clusters=clusters)
    assert empty.shape == (3, 3) and empty.nnz == 0
    one = sparse.csr_matrix(([4.0], ([1], [1])), shape=(3, 3))
    corrected = remove_soup(one, soup, rho=0.25, clusters=clusters)
    assert corrected.shape == (3, 3)
    np.testing.assert_array_equal(corrected.toarray(), [[0, 0, 0], [0, 3.0, 0], [0, 0, 0]])


@pytest.mark.parametrize("clusters", [None, np.array(["a", "a"])])
def test_remove_soup_never_takes_a_gene_absent_from_the_soup(clusters):
    """A cell's soup (rho x its total) beyond its soup genes' counts stays: the genes the soup lacks
    keep every count. Here 0.5 x 12 = 6 of soup against 2 counts of soup genes in the first cell,
    and in the second 0.5 x 4 = 2 against 2: its soup genes are taken exactly whole."""
    soup = np.array([0.5, 0.5, 0.0])
    cells = sparse.csr_matrix(np.array([[1.0, 1.0, 10.0], [1.0, 1.0, 2.0]]))
    corrected = remove_soup(cells, soup, rho=0.5, clusters=clusters)
    np.testing.assert_array_equal(corrected.toarray(), [[0, 0, 10.0], [0, 0, 2.0]])
