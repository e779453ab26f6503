"""Gene co-expression networks: correlations, modules, eigengenes and hub genes."""
