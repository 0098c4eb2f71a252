"""Block Hadamard rotation: FWHT against a plain copy, rotate, and its cost in matmul."""
import numpy as np

import pyw8a8
from pyw8a8.tools.bench import aligned_empty

from .common import data

K = N = 2048
BLOCK = 128


class FWHT:
    """Unnormalized FWHT of every 128-block of an (M, 2048) float32 array, in place; a
    copy of the same array (np.copyto) is the memory-bound floor to compare with. Both
    arrays start on a cache line (see pyw8a8.tools.probes.fwht_vs_copy for why)."""
    params = [1, 64, 256]
    param_names = ["M"]

    def setup(self, m):
        x, _ = data(m, K, 1)
        self.x, self.y = aligned_empty(x.shape), aligned_empty(x.shape)
        self.x[...] = x
        self.blocks = self.x.reshape(m, K // BLOCK, BLOCK)

    def time_fwht_128_blocks(self, m):
        pyw8a8.fwht(self.blocks, out=self.blocks)

    def time_copyto(self, m):
        np.copyto(self.y, self.x)


class Rotate:
    params = ([1, 64, 256], [64, 128])
    param_names = ["M", "block"]

    def setup(self, m, block):
        self.x, _ = data(m, K, 1)

    def time_rotate(self, m, block):
        pyw8a8.rotate(self.x, block)

    def time_unrotate(self, m, block):
        pyw8a8.unrotate(self.x, block)


class MatmulRotation:
    """matmul with and without the rotation (fused with the activation quantization)."""
    params = ([1, 64], [False, True])
    param_names = ["M", "rotate"]

    def setup(self, m, rotate):
        self.x, w = data(m, K, N)
        self.packed = pyw8a8.pack_weight(w, rotate=rotate, block=BLOCK)
        for _ in range(30):  # let the blocking tuner settle before timing
            pyw8a8.matmul(self.x, self.packed)

    def time_matmul(self, m, rotate):
        pyw8a8.matmul(self.x, self.packed)
