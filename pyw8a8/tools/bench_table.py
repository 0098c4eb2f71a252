"""The bench's table as markdown: GOPS per contender and shape, the ratios to numpy and to
the best int8 peer, the fractions of the peaks, the plain-words verdict, and
``--check-isolation``'s table."""
from .contenders import ROTATED
from .probes import CACHE_RESIDENT_BYTES

#: The table's one torch column: the fastest of torch's engines in each row.
TORCH_COLUMN = "torch int8"

def table_header(names):
    """The columns of :func:`format_table` for contenders `names`: torch's engines folded
    into TORCH_COLUMN."""
    header = ["M", "K", "N"] + [h for h in names if not h.startswith("torch ")]
    return header + [TORCH_COLUMN] * any(h.startswith("torch ") for h in names)


def _cell(gops, column):
    """(GOPS, label) of `column` in one row's figures; TORCH_COLUMN is the fastest engine,
    labelled with its name. (None, "") where the row lacks the column."""
    if column == TORCH_COLUMN:
        engines = {h[len("torch "):]: v for h, v in gops.items()
                   if h.startswith("torch ") and not h.endswith(" beside")}
        if not engines:
            return None, ""
        best = max(engines, key=engines.get)
        return engines[best], f" ({best})"
    return gops.get(column), ""


def format_table(header, rows, isas, peaks=None, bandwidth=None, fp32_peak=None):
    """Markdown table: GOPS per contender, ratios of the fastest pyw8a8 ISA to numpy and
    to the best peer (and of the rotated contender, where the table has one, to the best
    peer), each ISA's fraction of its own int8 instruction peak (and numpy's of the
    float32 FMA peak) and, at M = 1, the weight-read GB/s against the bandwidth of the
    level the weight is read from (`bandwidth`: {"L3": GB/s, "DRAM": GB/s}). The torch
    column (TORCH_COLUMN, see :func:`table_header`) names its fastest engine."""
    ours_names = [f"pyw8a8 {i}" for i in isas]
    rotated = [h for h in header[4:] if h.startswith("pyw8a8 ") and h.endswith(ROTATED)]
    peer_names = [h for h in header[4:] if not h.startswith("pyw8a8 ")]
    cols = header + ["vs numpy"] + (["vs best peer"] if peer_names else [])
    cols += [f"{rotated[0][len('pyw8a8 '):]} vs best peer"] if rotated and peer_names else []
    cols += [f"% peak {i}" for i in isas] if peaks else []
    cols += ["numpy % fp32 peak"] if fp32_peak else []
    cols += ["M=1 weight GB/s (% of L3 or DRAM read)"] if bandwidth else []
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (m, k, n), gops in rows:
        ours = max(gops[name] for name in ours_names)
        cells = [str(m), str(k), str(n)]
        for h in header[3:]:
            value, label = _cell(gops, h)
            cells.append("-" if value is None else f"{value:.0f}{label}")
        cells.append(f"{ours / gops['numpy f32']:.1f}x")
        if peer_names:
            best_peer = max((v for v, _ in (_cell(gops, p) for p in peer_names)
                             if v is not None), default=None)
            cells.append(f"{ours / best_peer:.2f}x" if best_peer else "-")
            if rotated:
                cells.append(f"{gops[rotated[0]] / best_peer:.2f}x" if best_peer else "-")
        if peaks:
            cells += [f"{100 * gops[f'pyw8a8 {i}'] / peaks[i]:.0f}%" for i in isas]
        if fp32_peak:
            cells.append(f"{100 * gops['numpy f32'] / fp32_peak:.0f}%")
        if bandwidth:
            if m == 1:
                gbs = ours / 2  # at M = 1: 2 ops per weight byte, so GB/s = GOPS / 2
                level = "L3" if k * n <= CACHE_RESIDENT_BYTES else "DRAM"
                cells.append(f"{gbs:.1f} ({100 * gbs / bandwidth[level]:.0f}% of {level})")
            else:
                cells.append("")
        out.append("| " + " | ".join(cells) + " |")
    return out


def summary_lines(header, rows, isas):
    """The table's verdict in plain words: for the fastest pyw8a8 ISA (rotation off) and
    the rotated contender, the range of their ratios to the best int8 peer and every shape
    where a peer is faster, named with that peer and its lead; [] without peers."""
    rotated = [h for h in header[4:] if h.startswith("pyw8a8 ") and h.endswith(ROTATED)]
    peer_names = [h for h in header[4:] if not h.startswith("pyw8a8 ")]
    if not peer_names:
        return []
    contenders = [("pyw8a8 (rotation off)", lambda g: max(g[f"pyw8a8 {i}"] for i in isas))]
    if rotated:
        contenders.append((rotated[0], lambda g: g[rotated[0]]))
    lines = []
    for what, pick in contenders:
        ratios, behind = [], []
        for (m, k, n), gops in rows:
            peers_here = [(v, p + label) for v, label, p in
                          ((*_cell(gops, p), p) for p in peer_names) if v is not None]
            if not peers_here:
                continue
            best, name = max(peers_here)
            ratio = pick(gops) / best
            ratios.append(ratio)
            if ratio < 1:
                behind.append(f"{m}x{k}x{n} ({name} {1 / ratio:.2f}x faster)")
        if not ratios:
            continue
        span = f"{min(ratios):.2f}-{max(ratios):.2f}x the best int8 peer"
        lines.append(f"{what}: {span}; " + (
            f"slower than a peer at {len(behind)} of {len(ratios)} shapes: "
            + ", ".join(behind) if behind else "ahead of every peer at every shape"))
    return lines


#: How far a contender timed beside the others may be from it timed alone.
ISOLATION_TOLERANCE = 0.10


def format_isolation(rows, names):
    """Markdown table of ``bench --check-isolation``: each contender's GOPS beside the
    others (in one process) and alone (a process of its own), timed in the same rounds,
    and their ratio; then a line that counts the ratios outside ISOLATION_TOLERANCE."""
    out = ["| M | K | N | contender | beside the others | alone | beside / alone |",
           "|---|---|---|---|---|---|---|"]
    off = []
    for (m, k, n), gops in rows:
        for name in names:
            beside, alone = gops[f"{name} beside"], gops[name]
            ratio = beside / alone
            if abs(ratio - 1) > ISOLATION_TOLERANCE:
                off.append(f"{m}x{k}x{n} {name}")
            out.append(f"| {m} | {k} | {n} | {name} | {beside:.0f} | {alone:.0f} | "
                       f"{ratio:.2f} |")
    verdict = (f"all {sum(len(names) for _ in rows)} within {ISOLATION_TOLERANCE:.0%}"
               if not off else f"{len(off)} outside {ISOLATION_TOLERANCE:.0%}: "
               + ", ".join(off))
    return out + ["", f"beside / alone: {verdict}"]

GOPS_NOTE = ("GOPS = 2*M*N*K / median time, activation quantization included, each "
             "contender in a process of its own. pyw8a8 runs with rotation off, the "
             "'rotated' column with it on (block 128); torch int8: the fastest of torch's "
             "dynamic int8 engines, named; xnnpack int8: XNNPACK through LiteRT; torchao "
             "inductor: torchao's int8 Linear compiled by Inductor (freezing, max-autotune); "
             "vs best "
             "peer: the fastest pyw8a8 ISA over the fastest int8 peer (below 1.00x: the "
             "peer is faster); % peak: of the ISA's instruction loop above, which a "
             "kernel can pass when it issues faster than that loop")
