"""The lab: what measures pyw8a8 rather than what it is.

``bench`` (``python -m pyw8a8 bench`` and ``info``: side-by-side speed against numpy and the
int8 peers, the machine's peaks; ``bench --check-isolation``), ``peers`` (ONNX Runtime's and
PyTorch's int8 products, where installed), ``proxies`` (llvm-mca cycles, the time around the
kernels, the amx / avx512vnni crossover), ``ffn_bench`` (``bench --ffn``: the gated FFN
block), ``dask_bench`` (``bench --dask``), ``quality``
(``python -m pyw8a8 quality``: quantization error on synthetic outliers),
``toy_transformer`` (``bench --mixed``: a small numpy model), ``measure`` (the
interleaved timing they share, in this process or in one per contender) and ``record``
(``bench --record DIR``: a run kept in a dated file per CPU kind).
"""
