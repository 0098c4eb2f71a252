"""What the pyw8a8.torch tests share: torch (skipping the importing test module, with the
reason shown, where it is not installed) and the float layers they quantize."""
import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'pyw8a8[torch]')")


def dense(k, n, bias=True, seed=0):
    """A float nn.Linear(k, n), its initial weights set by `seed`."""
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n, bias=bias)
