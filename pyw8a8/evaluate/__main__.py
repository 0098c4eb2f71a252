"""``python -m pyw8a8.evaluate``: the same as ``python -m pyw8a8 eval``."""
import sys

from .cli import main

sys.exit(main())
