"""Lines to signature hits: the prefilter, the signatures as data, hard-wrap rejoining,
stats rollups and the --jobs split. Knows nothing of time windows or classes."""
