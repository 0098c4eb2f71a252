"""FFN groups: collect each FFN's gate, up and down weights and equalize them once, before
packing."""

from __future__ import annotations

import logging
import threading

__all__ = ["FfnGroup", "ffn_role"]

logger = logging.getLogger("pyw8a8")

_FFN_ROLES = (
    ("ffn_gate", "gate"), ("ffn_up", "up"), ("ffn_down", "down"),
    ("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"),
)


def ffn_role(name):
    """(group key, role) for FFN weights, else (None, None)."""
    for token, role in _FFN_ROLES:
        if token in name:
            return name.replace(token, "\0ffn\0"), role
    return None, None


class FfnGroup:
    """Collects gate/up/down of one FFN and equalizes them once, at first use.

    Parameters
    ----------
    key : str
        The group key of `ffn_role`.
    backend : object
        Provides ``equalize_ffn`` (see `pyw8a8.router.layers.COMPILED_KERNELS`).
    """

    def __init__(self, key, backend):
        self.key = key
        self.backend = backend
        self.raw = {}
        self.done = None
        self.lock = threading.Lock()

    def weight(self, role):
        with self.lock:
            if self.done is None:
                if all(r in self.raw for r in ("gate", "up", "down")):
                    # equalize_ffn returns (w_gate, w_up, w_down[, factors])
                    g, u, d = self.backend.equalize_ffn(
                        self.raw["gate"], self.raw["up"], self.raw["down"]
                    )[:3]
                    self.done = {"gate": g, "up": u, "down": d}
                    logger.debug("pyw8a8: equalized FFN %s", self.key.replace("\0ffn\0", "ffn_*"))
                else:
                    missing = {"gate", "up", "down"} - set(self.raw)
                    logger.warning(
                        "pyw8a8: FFN scaling skipped for %s (missing %s)",
                        self.key.replace("\0ffn\0", "ffn_*"), sorted(missing),
                    )
                    self.done = dict(self.raw)
                self.raw = None  # drop the float references
            return self.done[role]

    def release(self, role):
        with self.lock:
            if self.done is not None:
                self.done.pop(role, None)
