"""Shapes and data shared by the benchmarks (the grid of the speed issue)."""
import numpy as np

M_VALUES = [1, 8, 64, 256, 1024]
KN_VALUES = [(640, 2048), (2048, 640), (1152, 6912), (6912, 1152), (4096, 4096)]


def data(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    return x, w
