"""Time spent inside the linear layers of a model, by wrapping the layers its factory hands out."""

from __future__ import annotations

import time

from ..models.gemma3 import OUTPUT_NAME
from ..router import SeparatePair

__all__ = ["LinearTimer", "TimedLayer", "TimedPair"]


class TimedLayer:
    """A layer adding each call's wall time to ``seconds``; its output unchanged."""

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
    """A timed gate/up pair with the fused gated unit (`Int8GatedLinear.glu`), timed alike."""

    __slots__ = ()

    def glu(self, x, activation):
        t0 = time.perf_counter()
        y = self.layer.glu(x, activation)
        self.seconds += time.perf_counter() - t0
        return y


class LinearTimer:
    """A ``linear(name, w)`` factory timing the layers of `factory` (a `Router`,
    ``float_linear`` ...), whose ``pair``, where it has one, builds the gate/up pairs.  Each
    call costs two clock reads more (about 0.1 ms a forward of Gemma 3 270M)."""

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
        """The wrapped factory's gate/up pair (else two layers), timed as one layer."""
        make_pair = getattr(self.factory, "pair", None)
        if make_pair is not None:
            layer = make_pair(name_gate, w_gate, name_up, w_up)
        else:
            layer = SeparatePair(self.factory(name_gate, w_gate), self.factory(name_up, w_up))
        return self._timed(f"{name_gate}+{name_up}", layer)

    def seconds(self) -> float:
        """Seconds inside every layer since the last `reset`."""
        return sum(layer.seconds for layer in self.layers)

    def output_seconds(self) -> float:
        """Seconds inside the output (logits) layer since the last `reset`."""
        return sum(layer.seconds for layer in self.layers if layer.name == OUTPUT_NAME)

    def reset(self) -> None:
        """Start the clocks again from zero."""
        for layer in self.layers:
            layer.seconds = 0.0
