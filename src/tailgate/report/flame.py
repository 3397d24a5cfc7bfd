"""The differential flame graph of diagnose's profile: each stack's width is its time while
the slowest requests were in flight, its colour how much more (red) or less (blue) of the
service's time it took then than during the other requests (share in the tail less share in
the rest, as Brendan Gregg's differential flame graphs colour the second profile)."""

from __future__ import annotations

import html
from typing import Any

SEP = "\x1f"  # between frames in a node's id: symbol names may hold ';'


def flame_tree(folded: list[dict[str, Any]]) -> dict[str, list]:
    """Icicle nodes from folded stacks (root first): ids, labels, parents, inclusive tail and
    rest ms, and the colour value (tail share less rest share, in points of percent)."""
    tail: dict[str, float] = {}
    rest: dict[str, float] = {}
    label: dict[str, str] = {}
    parent: dict[str, str] = {}
    root = "all"
    tail[root] = rest[root] = 0.0
    label[root] = "all"
    parent[root] = ""
    for f in folded:
        tail[root] += f["tail_ms"]
        rest[root] += f["rest_ms"]
        node = root
        for frame in f["frames"]:
            child = node + SEP + frame
            if child not in tail:
                tail[child] = rest[child] = 0.0
                label[child] = frame
                parent[child] = node
            tail[child] += f["tail_ms"]
            rest[child] += f["rest_ms"]
            node = child
    tt, rr = tail[root] or 1.0, rest[root] or 1.0
    ids = [k for k in tail if tail[k] > 0]
    return {"ids": ids, "labels": [label[k] for k in ids], "parents": [parent[k] for k in ids],
            "tail_ms": [round(tail[k], 4) for k in ids],
            "rest_ms": [round(rest[k], 4) for k in ids],
            "excess": [round(100 * (tail[k] / tt - rest[k] / rr), 2) for k in ids]}


def flame_figure(prof: dict[str, Any]):
    """A plotly icicle drawn as a flame graph (root at the bottom)."""
    import plotly.graph_objects as go

    t = flame_tree(prof["folded"])
    lim = max((abs(x) for x in t["excess"]), default=1.0) or 1.0
    fig = go.Figure(go.Icicle(
        ids=t["ids"], labels=t["labels"], parents=t["parents"], values=t["tail_ms"],
        branchvalues="total", tiling={"orientation": "v", "flip": "y"},
        marker={"colors": t["excess"], "colorscale": "RdBu", "reversescale": True,
                "cmin": -lim, "cmax": lim, "cmid": 0,
                "colorbar": {"title": "tail % - rest %"}},
        customdata=list(zip(t["tail_ms"], t["rest_ms"], t["excess"], strict=True)),
        hovertemplate="%{label}<br>tail %{customdata[0]:.3f} ms, rest %{customdata[1]:.3f} ms"
                      "<br>share in the tail less in the rest: %{customdata[2]:+.1f} pts"
                      "<extra></extra>",
        maxdepth=-1))
    fig.update_layout(height=700, margin={"l": 10, "r": 10, "t": 50, "b": 10},
                      title="differential flame graph: width = time in the slowest 1 %, "
                            "red = more than in the other requests, blue = less")
    return fig


def flame_section(prof: dict[str, Any] | None) -> str:
    """The diagnose page's profile section: the ranked table and the flame graph ('' without
    a profile)."""
    from .plots import figure_div

    if not prof:
        return ""
    e = html.escape
    if "unknown" in prof:
        return f"<h2>profile</h2><p id='profile'>not measured: {e(prof['unknown'])}</p>"
    rows = "".join(
        f"<tr><td>{100 * r['tail_share']:.1f}</td><td>{100 * r['rest_share']:.1f}</td>"
        f"<td>{r['tail_ms']:.2f}</td><td>{e(r['state'])}</td>"
        f"<td>{e(r['syscall'] or '')}{e(' (' + r['site'] + ')' if r['site'] else '')}</td>"
        f"<td>{e(r['from'])}</td></tr>" for r in prof["ranked"])
    parts = [f"<h2>profile of the tail</h2><p id='profile'>{e(prof['sentence'])}</p>",
             "<table id='profile-ranked'><tr><th>tail %</th><th>rest %</th><th>tail ms</th>"
             f"<th>state</th><th>syscall (kernel)</th><th>from</th></tr>{rows}</table>"]
    parts += [f"<p class='noise'>{e(n)}</p>" for n in prof["notes"]]
    if prof["tail"]["profiled_ms"] > 0:
        parts.append(figure_div(flame_figure(prof), "flame"))
    return "".join(parts)
