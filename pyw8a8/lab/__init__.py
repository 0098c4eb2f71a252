"""What the bench (``pyw8a8.tools``) and the evaluation (``pyw8a8.evaluate``) share:
``processes`` (a run or a contender in a fresh Python process of its own), ``turns`` (the
contenders timed in turns, round by round) and ``record`` (a run kept in a dated file per
CPU kind).  Neither imports the other's modules; both import these.
"""
