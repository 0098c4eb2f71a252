"""The bench's table as a picture: for each shape, each contender's speed as a share of
what the shape can reach on this CPU (its roofline), as an SVG that a markdown page shows.

One axis serves every shape (a share, not GOPS), so a decode-sized product read from memory
and a compute-bound one sit side by side, and each contender's distance to the hardware's
limit reads at a glance, the peers' beside pyw8a8's.  Plain SVG text: no plotting library.
"""
from __future__ import annotations

from html import escape

#: The contenders' colours, in the legend's order (pyw8a8's first).
PALETTE = ("#1f5fa8", "#6fa8dc", "#e69138", "#6aa84f", "#a64d79", "#999999", "#cc0000")
_BAR, _GAP, _LEFT, _WIDTH, _TOP = 9, 10, 150, 460, 56


def roofline_chart(title: str, rows: list, contenders: list[str], attainable) -> str:
    """The SVG of `rows` ([((M, K, N), {contender: GOPS})]) for `contenders` (bars in this
    order; those a row lacks are left out), each bar the contender's GOPS over
    ``attainable(M, K, N)`` (the shape's roofline GOPS), its share written at its end."""
    colours = dict(zip(contenders, PALETTE))
    top = max((gops.get(c, 0) / attainable(*shape) for shape, gops in rows
               for c in contenders), default=1.0)
    scale = max(1.0, top)  # the axis ends at 100%, or further where a bar passes it
    parts, y = [], _TOP
    for shape, gops in rows:
        limit = attainable(*shape)
        present = [c for c in contenders if gops.get(c)]
        height = len(present) * _BAR
        parts.append(f'<text x="{_LEFT - 8}" y="{y + height / 2 + 4:.0f}" '
                     f'text-anchor="end">{"x".join(map(str, shape))}</text>')
        for i, name in enumerate(present):
            share = gops[name] / limit
            width = _WIDTH * share / scale
            parts.append(f'<rect x="{_LEFT}" y="{y + i * _BAR}" width="{width:.1f}" '
                         f'height="{_BAR - 1}" fill="{colours[name]}"><title>{escape(name)}: '
                         f'{gops[name]:.0f} GOPS, {100 * share:.0f}% of {limit:.0f}'
                         f'</title></rect>')
            parts.append(f'<text x="{_LEFT + width + 3:.1f}" y="{y + i * _BAR + _BAR - 1}" '
                         f'font-size="8">{100 * share:.0f}%</text>')
        y += height + _GAP
    full = _LEFT + _WIDTH / scale
    parts.append(f'<line x1="{full:.1f}" y1="{_TOP - 4}" x2="{full:.1f}" y2="{y - _GAP + 4}" '
                 f'stroke="#000" stroke-dasharray="3,2"/>')
    parts.append(f'<text x="{full:.1f}" y="{y + 8}" text-anchor="middle" '
                 f'font-size="9">roofline (100%)</text>')
    legend = "".join(
        f'<rect x="{10 + 150 * (i % 4)}" y="{22 + 12 * (i // 4)}" width="9" height="9" '
        f'fill="{colours[c]}"/><text x="{22 + 150 * (i % 4)}" y="{30 + 12 * (i // 4)}" '
        f'font-size="9">{escape(c)}</text>' for i, c in enumerate(contenders))
    width, height = _LEFT + _WIDTH + 50, y + 16
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="10">'
            f'<rect width="100%" height="100%" fill="#fff"/>'
            f'<text x="10" y="13" font-size="11" font-weight="bold">{escape(title)}</text>'
            f'{legend}{"".join(parts)}</svg>\n')
