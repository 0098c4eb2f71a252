"""`W8A8Config` in transformers' quantizer registry as soon as transformers has one, without
importing transformers from ``import pyw8a8.torch``.

A checkpoint saved by ``save_pretrained`` names pyw8a8's quantization in its
``config.json``; ``from_pretrained`` finds its config and quantizer by that name in the
registry that ``transformers.quantizers.auto`` holds.  Importing that module takes seconds
(it imports every quantization library installed), so pyw8a8 does not import it: where it
is already imported, :mod:`pyw8a8.torch.hf` registers at once; otherwise a finder on
``sys.meta_path`` runs the registration right after transformers imports it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

REGISTRY = "transformers.quantizers.auto"
_REGISTERS = "pyw8a8.torch.hf"


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds the registry's module as the other finders would, its loader wrapped to
    import :mod:`pyw8a8.torch.hf` (which registers) once the module has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != REGISTRY:
            return None
        sys.meta_path.remove(self)  # once: the other finders find the module itself
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def run_and_register(module):
            run(module)
            importlib.import_module(_REGISTERS)

        spec.loader.exec_module = run_and_register
        return spec


def register_with_transformers() -> None:
    """Register W8A8Config now if transformers' registry is imported, else when it is."""
    if REGISTRY in sys.modules:
        importlib.import_module(_REGISTERS)
    elif importlib.util.find_spec("transformers") is not None and not any(
            isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
