"""The lab: what measures pyw8a8 rather than what it is.

``bench`` (``python -m pyw8a8 bench`` and ``info``: side-by-side speed against numpy and the
int8 peers, the machine's peaks; ``bench --check-isolation``), with its ``bench_options``
and ``bench_table``; ``contenders`` (the one registry of every table's contenders),
``peers`` (ONNX Runtime's, XNNPACK's and PyTorch's int8 products, where installed),
``proxies`` (llvm-mca cycles, the time around the kernels, the amx / avx512vnni
crossover), ``ffn_bench`` (``bench --ffn``: the gated FFN block), ``dask_bench``
(``bench --dask``), ``quality`` (``python -m pyw8a8 quality``: quantization error on
synthetic outliers), ``toy_transformer`` (``bench --mixed``: a small numpy model) and the
``torch_*`` modules of ``bench --torch`` and ``--torch-layer``.  The fresh processes, the
turns and the records they share with the evaluation are :mod:`pyw8a8.lab`'s.
"""
