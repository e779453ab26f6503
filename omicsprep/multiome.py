"""Modalities of one sample joined by cell barcode into a MuData."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anndata import AnnData

from omicsprep.errors import InputError

if TYPE_CHECKING:
    from mudata import MuData


def join_modalities(modalities: dict[str, AnnData], *, min_overlap: float) -> tuple[MuData, dict[str, float]]:
    """Keep the cells every modality has, in the first modality's order, as one MuData.

    Parameters
    ----------
    modalities
        Name (``rna``, ``prot``, ``atac``) to cells x features; at least two.
    min_overlap
        Smallest accepted share of each modality's cells found in all the others.

    Returns
    -------
    The MuData, and each modality's share of cells kept (also in ``uns["overlap"]``).

    Raises
    ------
    InputError
        A modality shares less than ``min_overlap`` of its cells with the others (the
        message gives every modality's share).
    """
    import mudata

    names = list(modalities)
    common = modalities[names[0]].obs_names
    for name in names[1:]:
        common = common.intersection(modalities[name].obs_names, sort=False)
    overlap = {name: round(len(common) / max(adata.n_obs, 1), 4) for name, adata in modalities.items()}
    if min(overlap.values()) < min_overlap:
        shares = ", ".join(f"{name} {share:.1%} of {modalities[name].n_obs}" for name, share in overlap.items())
        raise InputError(f"modalities share {len(common)} cell barcodes ({shares}); "
                         f"at least {min_overlap:.0%} of each is required")
    joined = mudata.MuData({name: adata[common].copy() for name, adata in modalities.items()})
    joined.uns["overlap"] = overlap
    return joined, overlap
