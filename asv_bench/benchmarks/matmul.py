"""matmul and matmul_pair over the M x (K, N) grid (rotation off and on), and their fused
forms: bias and activation, the gated FFN unit (glu=)."""
import numpy as np

import pyw8a8

from .common import KN_VALUES, M_VALUES, data


class Matmul:
    params = (M_VALUES, KN_VALUES)
    param_names = ["M", "KN"]

    def setup(self, m, kn):
        k, n = kn
        self.x, w = data(m, k, n)
        self.packed = pyw8a8.pack_weight(w, rotate=False)
        for _ in range(30):  # let the blocking tuner settle before timing
            pyw8a8.matmul(self.x, self.packed)

    def time_matmul(self, m, kn):
        pyw8a8.matmul(self.x, self.packed)

    def track_gops(self, m, kn):
        import timeit
        k, n = kn
        reps = 5
        t = min(timeit.repeat(lambda: pyw8a8.matmul(self.x, self.packed), number=reps,
                              repeat=5)) / reps
        return 2 * m * n * k / t / 1e9

    track_gops.unit = "GOPS"


class MatmulRotated(Matmul):
    def setup(self, m, kn):
        k, n = kn
        self.x, w = data(m, k, n)
        self.packed = pyw8a8.pack_weight(w, rotate=True)
        for _ in range(30):
            pyw8a8.matmul(self.x, self.packed)


def pair_weights(m, k, n):
    """Activations (m, k) and two packed weights (n, k) of one shape: gate and up."""
    x, w1 = data(m, k, n, seed=1)
    _, w2 = data(m, k, n, seed=2)
    return x, pyw8a8.pack_weight(w1, rotate=False), pyw8a8.pack_weight(w2, rotate=False)


class MatmulPair:
    params = (M_VALUES, [(640, 2048), (1152, 6912)])
    param_names = ["M", "KN"]

    def setup(self, m, kn):
        self.x, self.p1, self.p2 = pair_weights(m, *kn)
        for _ in range(30):
            pyw8a8.matmul_pair(self.x, self.p1, self.p2)

    def time_matmul_pair(self, m, kn):
        pyw8a8.matmul_pair(self.x, self.p1, self.p2)


class MatmulEpilogue:
    """matmul with the bias and the activation fused into its epilogue, against the plain
    product (time_matmul above): what a biased, activated layer costs on top."""
    params = ([1, 64, 256], [(640, 2048), (1152, 6912)],
              ["relu", "gelu", "gelu_tanh", "silu"])
    param_names = ["M", "KN", "activation"]

    def setup(self, m, kn, activation):
        k, n = kn
        self.x, w = data(m, k, n)
        self.bias = np.random.default_rng(3).standard_normal(n).astype(np.float32)
        self.packed = pyw8a8.pack_weight(w, rotate=False)
        for _ in range(30):
            pyw8a8.matmul(self.x, self.packed, bias=self.bias, activation=activation)

    def time_matmul_bias_activation(self, m, kn, activation):
        pyw8a8.matmul(self.x, self.packed, bias=self.bias, activation=activation)


class MatmulPairGlu:
    """The gated FFN unit glu(x @ Wg.T) * (x @ Wu.T) in one call, against matmul_pair's two
    products (MatmulPair above)."""
    params = (M_VALUES, [(640, 2048), (1152, 6912)], ["gelu_tanh", "silu"])
    param_names = ["M", "KN", "glu"]

    def setup(self, m, kn, glu):
        self.x, self.pg, self.pu = pair_weights(m, *kn)
        for _ in range(30):
            pyw8a8.matmul_pair(self.x, self.pg, self.pu, glu=glu)

    def time_matmul_pair_glu(self, m, kn, glu):
        pyw8a8.matmul_pair(self.x, self.pg, self.pu, glu=glu)


class MixedModel:
    """A small numpy transformer (attention in numpy's BLAS) with its linear layers in
    numpy float32 or pyw8a8, default thread settings: what a user sees when the two pools
    take turns (``python -m pyw8a8 bench --mixed`` prints both side by side)."""

    params = (["float", "w8a8"],)
    param_names = ["linear"]

    def setup(self, linear):
        from pyw8a8.tools import toy_transformer as t
        self.layers = t.build()
        self.x = np.random.default_rng(1).standard_normal((t.TOKENS, t.D)).astype(np.float32)
        self.linear = t.float_linear if linear == "float" else t.w8a8_linear(self.layers)
        t.forward(self.x, self.layers, self.linear)  # tuning and first-touch untimed

    def time_forward(self, linear):
        from pyw8a8.tools import toy_transformer as t
        t.forward(self.x, self.layers, self.linear)
