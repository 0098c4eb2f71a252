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

import numpy as np
import torch
from torch import nn

from .._layout import W8_NR
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
        packed = head.packed("weight")
        self._biased = packed.encoding == "biased"
        self._rotated_k = packed.rotated_k
        scale = getattr(embedding, "embed_scale", None)
        self.register_buffer("embed_scale", None if scale is None else
                             torch.as_tensor(scale, dtype=torch.float32).clone(),
                             persistent=False)
        self.register_buffer("unrotation", _unrotation(packed) if packed.rotate else None,
                             persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        panels, _, scales, _ = self.head._tensors("weight")
        ids = input_ids.reshape(-1)
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


def _unrotation(packed) -> torch.Tensor:
    """The inverse of the head's rotation as its diagonal blocks (blocks, block, block):
    a rotated row r's float row is ``r @ blockdiag(blocks)``."""
    k, block = packed.rotated_k, packed.block
    whole = unrotate(np.eye(k, dtype=np.float32), block=block, seed=packed.seed)
    blocks = [whole[i:i + block, i:i + block] for i in range(0, k, block)]
    return torch.from_numpy(np.ascontiguousarray(np.stack(blocks)))
