"""Side-by-side timing: contenders called in interleaved rounds (A, B, C, A, B, C, ...), so
a noisy shared machine slows them alike, each round started from idle thread pools; the
medians are what the bench and the proxies report."""
import statistics
import time

SETTLE_SECONDS = 0.2


def _time_once(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(contenders, rounds, min_time):
    """Median seconds per call of each contender, timed in interleaved rounds."""
    for fn in contenders.values():  # warm up: first-call costs, caches, tuning
        fn()
        fn()
    reps = {}
    for name, fn in contenders.items():
        t = _time_once(fn)
        reps[name] = max(1, int(min_time / max(t, 1e-7)))
    samples = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            # Idle thread pools spin for a while after a call (OpenBLAS for up to ~0.1 s);
            # on a machine with few cores that steals the next contender's cores, so every
            # contender starts from pools that have gone to sleep.
            time.sleep(SETTLE_SECONDS)
            t0 = time.perf_counter()
            for _ in range(reps[name]):
                fn()
            samples[name].append((time.perf_counter() - t0) / reps[name])
    return {name: statistics.median(s) for name, s in samples.items()}
