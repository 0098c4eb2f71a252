"""Per-token activation quantization and weight packing."""
import numpy as np

import pyw8a8

from .common import KN_VALUES, M_VALUES, data


class QuantizePerToken:
    params = (M_VALUES, [640, 2048, 6912])
    param_names = ["M", "K"]

    def setup(self, m, k):
        self.x = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)

    def time_quantize_per_token(self, m, k):
        pyw8a8.quantize_per_token(self.x)


class PackWeight:
    params = (KN_VALUES, [False, True])
    param_names = ["KN", "rotate"]
    timeout = 120

    def setup(self, kn, rotate):
        k, n = kn
        _, self.w = data(1, k, n)

    def time_pack_weight(self, kn, rotate):
        pyw8a8.pack_weight(self.w, rotate=rotate)

    def peakmem_pack_weight(self, kn, rotate):
        pyw8a8.pack_weight(self.w, rotate=rotate)
