"""Time spent inside the linear layers of a model, by wrapping the layers its factory hands out."""

from __future__ import annotations

import time

from ..models.gemma3 import OUTPUT_NAME
from ..router import SeparatePair

__all__ = ["LinearTimer", "TimedLayer", "TimedPair"]


class TimedLayer:
    """A layer that adds the wall time of each of its calls to ``seconds``.

    The wrapped layer's output is returned as it is: timing changes no result.
    """

    __slots__ = ("layer", "name", "seconds")

    def __init__(self, layer, name):
        self.layer = layer
        self.name = name
        self.seconds = 0.0

    def __call__(self, x):
        t0 = time.perf_counter()
        y = self.layer(x)
        self.seconds += time.perf_counter() - t0
        return y

    def __repr__(self):
        return f"TimedLayer({self.layer!r})"


class TimedPair(TimedLayer):
    """A timed gate/up pair that also has the fused gated unit (`LinearPair.glu`), timed
    alike: with it the model's FFN activation runs, and is timed, inside the layer."""

    __slots__ = ()

    def glu(self, x, activation):
        t0 = time.perf_counter()
        y = self.layer.glu(x, activation)
        self.seconds += time.perf_counter() - t0
        return y


class LinearTimer:
    """A ``linear(name, w)`` factory that times the layers of another factory.

    Parameters
    ----------
    factory : callable
        ``factory(name, w) -> layer`` (a `pyw8a8.router.Router`, ``float_linear`` ...).
        Its ``pair`` method, when it has one, builds the gate/up pairs (the router's
        shares one quantized activation); otherwise a pair is two separate layers.

    Notes
    -----
    Each call costs two ``time.perf_counter`` reads more (well under a microsecond),
    about 0.1 ms per forward pass of Gemma 3 270M's 109 linear calls.
    """

    def __init__(self, factory):
        self.factory = factory
        self.layers = []

    def _timed(self, name, layer):
        timed = (TimedPair if hasattr(layer, "glu") else TimedLayer)(layer, name)
        self.layers.append(timed)
        return timed

    def __call__(self, name, w):
        return self._timed(name, self.factory(name, w))

    def pair(self, name_gate, w_gate, name_up, w_up):
        """Gate/up pair factory: the wrapped factory's pair, timed as one layer."""
        make_pair = getattr(self.factory, "pair", None)
        if make_pair is not None:
            layer = make_pair(name_gate, w_gate, name_up, w_up)
        else:
            layer = SeparatePair(self.factory(name_gate, w_gate), self.factory(name_up, w_up))
        return self._timed(f"{name_gate}+{name_up}", layer)

    def seconds(self) -> float:
        """Seconds spent inside every layer since the last `reset`."""
        return sum(layer.seconds for layer in self.layers)

    def output_seconds(self) -> float:
        """Seconds spent inside the output (logits) layer since the last `reset`."""
        return sum(layer.seconds for layer in self.layers if layer.name == OUTPUT_NAME)

    def reset(self) -> None:
        """Start the clocks again from zero."""
        for layer in self.layers:
            layer.seconds = 0.0
