"""Chromatin accessibility (scATAC): fragments counted into peaks or tiles, TF-IDF and LSI."""
