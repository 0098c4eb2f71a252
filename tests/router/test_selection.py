"""The rule of which layers go int8, shared by `Router` and `pyw8a8.torch.quantize`."""

import pytest

from pyw8a8.router.selection import float_reason


@pytest.mark.parametrize("settings, name, shape, reason", [
    ({}, "blk.0.attn_q.weight", (1024, 640), None),
    ({"include": ["blk.*.ffn_*"]}, "blk.3.ffn_gate.weight", (2048, 640), None),
    ({"include": ["blk.*.ffn_*"]}, "blk.3.attn_q.weight", (1024, 640), "not included"),
    ({"include": ["blk.*"], "exclude": ["*ffn_down*"]}, "blk.3.ffn_down.weight", (640, 2048),
     "excluded"),
    ({"exclude": ["blk.1[0-9].*"]}, "blk.12.ffn_up.weight", (2048, 640), "excluded"),
    ({"exclude": ["blk.1[0-9].*"]}, "blk.2.ffn_up.weight", (2048, 640), None),
    ({"min_in_features": 1024}, "q", (1024, 640), "in_features=640 < min_in_features=1024"),
    ({"min_in_features": 1024}, "x", (640, 1024), None),  # equal is enough
    ({"skip_rows": 100000}, "output", (262144, 2048), "out_features=262144 >= skip_rows=100000"),
    ({"skip_rows": 100000}, "y", (99999, 2048), None),
    # the first reason that applies, in the order include, exclude, K, N
    ({"include": ["a*"], "exclude": ["b*"], "min_in_features": 8, "skip_rows": 1}, "b", (4, 4),
     "not included"),
    ({"exclude": ["b*"], "min_in_features": 8, "skip_rows": 1}, "b", (4, 4), "excluded"),
    ({"min_in_features": 8, "skip_rows": 1}, "b", (4, 4), "in_features=4 < min_in_features=8"),
])
def test_float_reason(settings, name, shape, reason):
    assert float_reason(name, *shape, **settings) == reason
