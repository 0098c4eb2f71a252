"""What the bench (``pyw8a8.tools``) and the evaluation (``pyw8a8.evaluate``) share, neither
importing the other: fresh processes (``processes``), turns (``turns``), records (``record``)."""
