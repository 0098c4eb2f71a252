"""`Int8Embedding`: the input embedding of a model whose embedding and LM head share one
weight (a tied vocabulary), read from the LM head's packed int8 weight.

:func:`pyw8a8.torch.quantize` packs a tied LM head like any layer; the float embedding it
shared the weight with would stay, the largest tensor of a small language model (Gemma 3
270M: 262,144 x 640, 671 MB in float32, beside the head's 168 MB of int8).  This module
takes its place and keeps no weight of its own: a token's row is gathered from the head's
panels, dequantized by the row's scale and rotated back (the head's weight is stored in
the rotated basis), then multiplied by the embedding's own scale where it has one (Gemma's
``embed_scale``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn

from .._layout import W8_NR, padded
from .._packed.panels import ENCODINGS
from ..rotation import unrotate
from .modules import Linear

__all__ = ["Int8Embedding"]


class Int8Embedding(nn.Module):
    """An ``nn.Embedding`` whose rows are a W8A8 layer's weight rows (a tied LM head's).

    Parameters
    ----------
    head : pyw8a8.torch.Linear
        The layer whose weight (N = vocabulary, K = width) the embedding shared; kept as a
        reference, not a submodule, so its buffers are saved once, under the head's name.
    embedding : nn.Embedding
        The embedding replaced: its width, dtype and, where it has one, its ``embed_scale``.

    Notes
    -----
    ``forward(input_ids)`` takes integer ids of any shape and returns (..., width) in the
    embedding's dtype: ``dequantized head row * embed_scale``, the float row to within the
    head's int8 rounding.  Under ``torch.compile`` it is plain tensor code.
    """

    def __init__(self, head: Linear, embedding: nn.Embedding) -> None:
        super().__init__()
        if not isinstance(head, Linear):
            raise TypeError(f"head must be a pyw8a8.torch.Linear, got {type(head).__name__}")
        if (embedding.num_embeddings, embedding.embedding_dim) != (head.out_features,
                                                                   head.in_features):
            raise ValueError(f"the embedding is {embedding.num_embeddings} x "
                             f"{embedding.embedding_dim}, the head's weight "
                             f"{head.out_features} x {head.in_features}")
        object.__setattr__(self, "head", head)
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self.padding_idx = embedding.padding_idx
        self.dtype = embedding.weight.dtype
        # Derived from the head's settings, never its arrays (a skeleton's are on 'meta'),
        # and held as plain tensors, not buffers: transformers' loading replaces every
        # non-persistent buffer with uninitialized memory for the model's own init to fill.
        settings = head.settings("weight")
        self._biased = ENCODINGS[settings["encoding"]] == "biased"
        block = settings["block"]
        self._rotated_k = padded(self.embedding_dim, block) if settings["rotate"] else \
            self.embedding_dim
        self.embed_scale = _embed_scale(embedding)
        self.unrotation = (_unrotation(self._rotated_k, block, settings["seed"])
                           if settings["rotate"] else None)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        panels, _, scales, _ = self.head._tensors("weight")
        ids = input_ids.reshape(-1)
        if ids.numel() and not torch.compiler.is_compiling():
            # an id past the vocabulary would index the panels' padding rows or fail with
            # an index of the panel layout: say which id (nn.Embedding refuses it too)
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.num_embeddings:
                bad = low if low < 0 else high
                raise IndexError(f"input_ids holds {bad}, outside the vocabulary of "
                                 f"{self.num_embeddings} tokens")
        # panels: (N / 16, Kp / 4, 16 channels x 4 consecutive K values)
        lanes = panels.view(panels.shape[0], panels.shape[1], W8_NR, 4)
        q = lanes[ids // W8_NR, :, ids % W8_NR].reshape(ids.shape[0], -1)[:, :self._rotated_k]
        q = (q ^ 0x80).view(torch.int8) if self._biased else q.view(torch.int8)
        rows = q.to(torch.float32) * scales[ids].unsqueeze(1)
        if self.unrotation is not None:
            blocks, block, _ = self.unrotation.shape
            rows = torch.einsum("nkb,kbc->nkc", rows.view(-1, blocks, block),
                                self.unrotation).reshape(-1, blocks * block)
        rows = rows[:, :self.embedding_dim]
        if self.embed_scale is not None:
            rows = rows * self.embed_scale
        return rows.reshape(*input_ids.shape, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, rows from the int8 weight of "
                f"a {type(self.head).__name__}")


def _embed_scale(embedding: nn.Module) -> Optional[torch.Tensor]:
    """The factor an embedding multiplies its rows by (Gemma's ``embed_scale``), float32,
    or None; read from the number the module keeps where it keeps one (its tensor is on
    'meta' in a skeleton)."""
    scale = getattr(embedding, "scalar_embed_scale", None)
    if scale is None:
        scale = getattr(embedding, "embed_scale", None)
    if scale is None:
        return None
    return torch.as_tensor(scale, dtype=torch.float32, device="cpu").clone()


def _unrotation(k: int, block: int, seed: int) -> torch.Tensor:
    """The inverse of the head's rotation over its `k` rotated features as its diagonal
    blocks (blocks, block, block): a rotated row r's float row is ``r @ blockdiag(blocks)``."""
    whole = unrotate(np.eye(k, dtype=np.float32), block=block, seed=seed)
    blocks = [whole[i:i + block, i:i + block] for i in range(0, k, block)]
    return torch.from_numpy(np.ascontiguousarray(np.stack(blocks)))
