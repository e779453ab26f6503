"""RNA: quality control and doublets, normalization and PCA, clustering and markers, integration of samples."""
