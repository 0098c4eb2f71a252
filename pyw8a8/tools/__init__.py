"""The lab's tools: what measures pyw8a8 rather than what it is.  ``bench`` (``python -m
pyw8a8 bench`` and ``info``) with its options, table, contender registry and peers; the
modes' modules (``proxies``, ``ffn_bench``, ``dask_bench``, ``toy_transformer``, the
``torch_*`` ones); ``quality``.  The processes, turns and records they share with the
evaluation are :mod:`pyw8a8.lab`'s."""
