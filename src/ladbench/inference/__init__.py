"""The inference stage: last-row attention capture, candidate scoring, prompts, and the cache.

Modules: ``attention`` (fast kernel + exact last-query attention, SoFA masks), ``scoring``
(identifier prefix trie, restricted normalisation), ``prompts`` (prompt texts, identifier
formats, answer parsing; which variant uses which: ``ladbench.variants``), ``cache`` (row
plan, resumable HDF5 writer, ``read_cache``), ``runner`` (the work of
the ``ladbench infer`` subcommand, whose flags are in ``ladbench.stages.infer``).
"""
