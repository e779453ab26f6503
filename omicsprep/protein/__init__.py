"""Antibody-derived tags (CITE-seq): QC, CLR and dsb normalization."""
