"""The bench record's chart (pyw8a8/lab/chart.py): one bar per contender and shape, its
length the contender's share of the shape's roofline on one axis for every shape."""
import xml.etree.ElementTree as ET

from pyw8a8.lab.chart import roofline_chart

SVG = "{http://www.w3.org/2000/svg}"


def _bars(svg):
    root = ET.fromstring(svg)
    return {r.find(f"{SVG}title").text.split(":")[0]: float(r.get("width"))
            for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None}


def test_bars_are_shares_of_each_shape_s_roofline_on_one_axis():
    rows = [((1, 640, 2048), {"ours": 50.0, "peer": 100.0}),
            ((64, 2048, 640), {"ours": 900.0})]
    limits = {(1, 640, 2048): 200.0, (64, 2048, 640): 1000.0}
    svg = roofline_chart("title <&>", rows, ["ours", "peer"], lambda m, k, n: limits[m, k, n])
    root = ET.fromstring(svg)  # well-formed, the title escaped
    assert "title <&>" in "".join(root.itertext())
    widths = [float(r.get("width")) for r in root.iter(f"{SVG}rect")
              if r.find(f"{SVG}title") is not None]
    assert len(widths) == 3  # the peer has no bar where the row lacks it
    # 25%, 50% and 90% of the roofline, on one scale
    assert abs(widths[1] / widths[0] - 2) < 0.01 and abs(widths[2] / widths[0] - 3.6) < 0.01
    texts = list(root.itertext())
    assert {"25%", "50%", "90%"} <= set(texts)


def test_the_axis_stretches_past_the_roofline_when_a_bar_does():
    rows = [((8, 64, 64), {"ours": 150.0, "peer": 50.0})]
    bars = _bars(roofline_chart("t", rows, ["ours", "peer"], lambda m, k, n: 100.0))
    assert abs(bars["ours"] / bars["peer"] - 3) < 0.01
    assert "150%" in roofline_chart("t", rows, ["ours", "peer"], lambda m, k, n: 100.0)
