"""``python -m pyw8a8.torch.build``: build pyw8a8.torch's C++ operator for the installed torch
now (importing pyw8a8.torch does), so that no later import waits for it."""
from . import _native

if __name__ == "__main__":
    print(f"pyw8a8.torch: the C++ operator for torch {_native.torch.__version__} is "
          f"{_native.NATIVE.__file__}")
