"""The bench's table as markdown: GOPS per contender and shape, the ratios to numpy and to
the best int8 peer, the fractions of the peaks, the plain-words verdict, and
``--check-isolation``'s table."""
from ..lab.record import markdown_table
from .contenders import ROTATED, fastest_torch

#: The table's one torch column: the fastest of torch's engines in each row.
TORCH_COLUMN = "torch int8"
#: How far a contender timed beside the others may be from it timed alone.
ISOLATION_TOLERANCE = 0.10
GOPS_NOTE = ("GOPS = 2*M*N*K / median time, activation quantization included, each "
             "contender in a process of its own. pyw8a8 runs with rotation off, the "
             "'rotated' column with it on (block 128); torch int8: the fastest of torch's "
             "dynamic int8 engines, named; xnnpack int8: XNNPACK through LiteRT; torchao "
             "inductor: torchao's int8 Linear compiled by Inductor (freezing, max-autotune); "
             "vs best "
             "peer: the fastest pyw8a8 ISA over the fastest int8 peer (below 1.00x: the "
             "peer is faster); % peak: of the ISA's instruction loop above, which a "
             "kernel can pass when it issues faster than that loop; roofline: what the "
             "shape can reach, its operations over the longer of the instruction peak's "
             "time and its bytes' time at the read bandwidth of the level holding the "
             "weight (L2, L3 or DRAM, else compute-bound), and each pyw8a8 contender's "
             "share of it")


def table_header(names):
    """The columns of :func:`format_table` for contenders `names`: torch's engines folded
    into TORCH_COLUMN."""
    header = ["M", "K", "N"] + [h for h in names if not h.startswith("torch ")]
    return header + [TORCH_COLUMN] * any(h.startswith("torch ") for h in names)


def column_value(gops, column):
    """(GOPS, " (engine)" for TORCH_COLUMN) of `column` in a row; (None, "") if absent."""
    if column == TORCH_COLUMN:
        best, value = fastest_torch({h: v for h, v in gops.items()
                                     if not h.endswith(" beside")}, max)
        return (value, f" ({best})") if best else (None, "")
    return gops.get(column), ""


def rotated_and_peers(header):
    """(the rotated pyw8a8 contender or None, the peers) of a table's header."""
    rotated = [h for h in header[4:] if h.startswith("pyw8a8 ") and h.endswith(ROTATED)]
    return (rotated or [None])[0], [h for h in header[4:] if not h.startswith("pyw8a8 ")]


def format_table(header, rows, isas, peaks=None, roofline=None, fp32_peak=None):
    """Markdown table: GOPS per contender, the fastest pyw8a8 ISA (and the rotated
    contender) against numpy and the best peer, each ISA's fraction of its instruction
    peak `peaks` (numpy's of `fp32_peak`) and, with a :class:`~.roofline.Roofline`, the
    attainable GOPS of the fastest ISA at the shape and the shares of it that the fastest
    pyw8a8 ISA and the rotated contender reach."""
    rotated, peer_names = rotated_and_peers(header)
    cols = header + ["vs numpy"] + (["vs best peer"] if peer_names else [])
    cols += [f"{rotated[len('pyw8a8 '):]} vs best peer"] if rotated and peer_names else []
    cols += [f"% peak {i}" for i in isas] if peaks else []
    cols += ["numpy % fp32 peak"] if fp32_peak else []
    cols += ["roofline GOPS (bound)", "% roofline"] if roofline else []
    cols += [f"{rotated[len('pyw8a8 '):]} % roofline"] if roofline and rotated else []
    table = []
    for (m, k, n), gops in rows:
        ours = max(gops[f"pyw8a8 {i}"] for i in isas)
        cells = [m, k, n]
        for h in header[3:]:
            value, label = column_value(gops, h)
            cells.append("-" if value is None else f"{value:.0f}{label}")
        cells.append(f"{ours / gops['numpy f32']:.1f}x")
        if peer_names:
            best_peer = max((v for v, _ in (column_value(gops, p) for p in peer_names)
                             if v is not None), default=None)
            cells.append(f"{ours / best_peer:.2f}x" if best_peer else "-")
            if rotated:
                cells.append(f"{gops[rotated] / best_peer:.2f}x" if best_peer else "-")
        if peaks:
            cells += [f"{100 * gops[f'pyw8a8 {i}'] / peaks[i]:.0f}%" for i in isas]
        if fp32_peak:
            cells.append(f"{100 * gops['numpy f32'] / fp32_peak:.0f}%")
        if roofline:
            best_isa = max(isas, key=lambda i: gops[f"pyw8a8 {i}"])
            attainable, bound = roofline.attainable(best_isa, m, k, n)
            cells += [f"{attainable:.0f} ({bound})", f"{100 * ours / attainable:.0f}%"]
            if rotated:
                cells.append(f"{100 * gops[rotated] / attainable:.0f}%")
        table.append(cells)
    return markdown_table(cols, table)


def summary_lines(header, rows, isas):
    """The table's verdict in plain words: for the fastest pyw8a8 ISA (rotation off) and
    the rotated contender, the range of their ratios to the best int8 peer and every shape
    where a peer is faster, named with that peer and its lead; [] without peers."""
    rotated, peer_names = rotated_and_peers(header)
    if not peer_names:
        return []
    contenders = [("pyw8a8 (rotation off)", lambda g: max(g[f"pyw8a8 {i}"] for i in isas))]
    if rotated:
        contenders.append((rotated, lambda g: g[rotated]))
    lines = []
    for what, pick in contenders:
        ratios, behind = [], []
        for (m, k, n), gops in rows:
            peers_here = [(v, p + label) for v, label, p in
                          ((*column_value(gops, p), p) for p in peer_names) if v is not None]
            if not peers_here:
                continue
            best, name = max(peers_here)
            ratios.append(pick(gops) / best)
            if ratios[-1] < 1:
                behind.append(f"{m}x{k}x{n} ({name} {1 / ratios[-1]:.2f}x faster)")
        if not ratios:
            continue
        span = f"{min(ratios):.2f}-{max(ratios):.2f}x the best int8 peer"
        lines.append(f"{what}: {span}; " + (
            f"slower than a peer at {len(behind)} of {len(ratios)} shapes: "
            + ", ".join(behind) if behind else "ahead of every peer at every shape"))
    return lines


def format_isolation(rows, names):
    """``bench --check-isolation``'s table: each contender's GOPS beside the others and
    alone, their ratio, then a line counting the ratios outside ISOLATION_TOLERANCE."""
    table, off = [], []
    for (m, k, n), gops in rows:
        for name in names:
            beside, alone = gops[f"{name} beside"], gops[name]
            if abs(beside / alone - 1) > ISOLATION_TOLERANCE:
                off.append(f"{m}x{k}x{n} {name}")
            table.append([m, k, n, name, f"{beside:.0f}", f"{alone:.0f}",
                          f"{beside / alone:.2f}"])
    verdict = (f"all {sum(len(names) for _ in rows)} within {ISOLATION_TOLERANCE:.0%}"
               if not off else f"{len(off)} outside {ISOLATION_TOLERANCE:.0%}: "
               + ", ".join(off))
    return markdown_table(["M", "K", "N", "contender", "beside the others", "alone",
                           "beside / alone"], table) + ["", f"beside / alone: {verdict}"]
