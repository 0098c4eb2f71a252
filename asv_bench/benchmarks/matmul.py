"""matmul and matmul_pair over the M x (K, N) grid (rotation off and on)."""
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


class MatmulPair:
    params = (M_VALUES, [(640, 2048), (1152, 6912)])
    param_names = ["M", "KN"]

    def setup(self, m, kn):
        k, n = kn
        self.x, w1 = data(m, k, n, seed=1)
        _, w2 = data(m, k, n, seed=2)
        self.p1 = pyw8a8.pack_weight(w1, rotate=False)
        self.p2 = pyw8a8.pack_weight(w2, rotate=False)
        for _ in range(30):
            pyw8a8.matmul_pair(self.x, self.p1, self.p2)

    def time_matmul_pair(self, m, kn):
        pyw8a8.matmul_pair(self.x, self.p1, self.p2)
