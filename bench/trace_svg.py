#!/usr/bin/env python3
"""A merged timeline (ddprun --trace DIR: DIR/trace.json) drawn as one SVG.

    trace_svg.py TRACE.json OUT.svg [--steps A:B] [--window MS:MS] [--title T]

Plain Python, no plotting library, the picture a trace viewer shows: a block per
rank ("rank R"), a row per track (thread or stream) named as in the trace, the
spans of each track stacked by nesting depth and coloured by what they are
(step phases, DDP buckets, collectives, waits), instants as ticks ("bucket N
ready") and flow arrows from each enqueue to the collective's run. The window is
rank 0's steps A to B (default: the two steps after the first), or MS:MS
milliseconds from the trace's start. Prints the window it drew.
"""

import argparse
import collections
import json
import sys

WIDTH = 1200
LEFT, RIGHT, TOP, BOTTOM = 190, 20, 64, 46
ROW_H, GAP = 15, 10

COLOURS = [  # (test on a span, fill): the first that matches
    (lambda e: e["name"] == "step", "#e8e8e8"),
    (lambda e: e["name"] == "data wait", "#9e9e9e"),
    (lambda e: e["name"] == "forward", "#4c78a8"),
    (lambda e: e["name"] == "backward", "#f58518"),
    (lambda e: e["name"].startswith("grad sync"), "#e45756"),
    (lambda e: e["name"] == "optimizer", "#54a24b"),
    (lambda e: e["name"] in ("evaluation", "checkpoint"), "#b279a2"),
    (lambda e: e.get("cat") == "ddp", "#9d755d"),
    (lambda e: e.get("cat") == "wait", "#ff9da6"),
    (lambda e: e.get("cat") == "collective", "#72b7b2"),
    (lambda e: e.get("cat") == "gpu", "#eeca3b"),
]
LEGEND = [("data wait", "#9e9e9e"), ("forward", "#4c78a8"), ("backward", "#f58518"),
          ("grad sync (exposed)", "#e45756"), ("optimizer", "#54a24b"),
          ("ddp bucket (launch)", "#9d755d"), ("all-reduce (run)", "#72b7b2"),
          ("wait in a collective", "#ff9da6"), ("bucket ready", "#222222")]


def colour(e):
    for test, fill in COLOURS:
        if test(e):
            return fill
    return "#bab0ac"


def escape(text):
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def window(events, steps, ms):
    if ms:
        a, b = (float(x) * 1000 for x in ms.split(":"))
        return a, b
    first_rank = min(e["pid"] for e in events)  # rank 0 is pid 1 (Note [trace files])
    marks = sorted((e["args"]["step"], e["ts"], e["ts"] + e["dur"]) for e in events
                   if e["ph"] == "X" and e["name"] == "step" and e["pid"] == first_rank
                   and "args" in e)
    if not marks:
        ends = [e["ts"] + e.get("dur", 0) for e in events if e["ph"] != "M"]
        return 0.0, max(ends)
    first, last = (int(x) for x in steps.split(":")) if steps else (marks[0][0] + 1,
                                                                     marks[0][0] + 2)
    chosen = [m for m in marks if first <= m[0] <= last] or marks[:2]
    start, end = chosen[0][1], chosen[-1][2]
    pad = 0.03 * (end - start)
    return start - pad, end + pad


def layout(events, t0, t1):
    """(pid, tid) -> spans with depths, in a row order: ranks, then tracks."""
    names = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    spans = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["ts"] < t1 and e["ts"] + e["dur"] > t0:
            spans[(e["pid"], e["tid"])].append(e)
    rows = []
    for key in sorted(spans):
        track = sorted(spans[key], key=lambda e: (e["ts"], -e["dur"]))
        stack, depth = [], 0
        placed = []
        for e in track:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - 0.002:
                stack.pop()
            placed.append((len(stack), e))
            stack.append(e)
            depth = max(depth, len(stack))
        rows.append((key, names.get(key, f"track {key[1]}"), depth, placed))
    return rows


def render(trace, t0, t1, title):
    events = trace["traceEvents"]
    rank_names = {e["pid"]: e["args"]["name"] for e in events
                  if e["ph"] == "M" and e["name"] == "process_name"}
    rows = layout(events, t0, t1)
    plot_w = WIDTH - LEFT - RIGHT
    x_of = lambda t: LEFT + plot_w * (t - t0) / (t1 - t0)  # noqa: E731
    y, row_y, body = TOP, {}, []
    last_pid = None
    for (pid, tid), name, depth, placed in rows:
        if pid != last_pid:
            if last_pid is not None:
                y += GAP
            body.append(f'<text x="8" y="{y + 12}" font-size="13" font-weight="bold">'
                        f'{escape(rank_names.get(pid, f"pid {pid}"))}</text>')
            last_pid = pid
        height = max(depth, 1) * ROW_H
        row_y[(pid, tid)] = y
        body.append(f'<rect x="{LEFT}" y="{y}" width="{plot_w}" height="{height}" '
                    f'fill="#fafafa" stroke="#e0e0e0"/>')
        body.append(f'<text x="{LEFT - 6}" y="{y + 11}" font-size="10" text-anchor="end">'
                    f'{escape(name[:30])}</text>')
        for level, e in placed:
            x0, x1 = max(x_of(e["ts"]), LEFT), min(x_of(e["ts"] + e["dur"]), LEFT + plot_w)
            w = max(x1 - x0, 0.6)
            yy = y + level * ROW_H + 1
            body.append(f'<rect x="{x0:.1f}" y="{yy}" width="{w:.1f}" height="{ROW_H - 2}" '
                        f'fill="{colour(e)}" stroke="#ffffff" stroke-width="0.4">'
                        f'<title>{escape(e["name"])} {e["dur"]:.1f} us</title></rect>')
            if w > 7 * len(e["name"]) * 0.55:
                body.append(f'<text x="{x0 + 2:.1f}" y="{yy + 10}" font-size="8.5" '
                            f'fill="#1a1a1a">{escape(e["name"])}</text>')
        y += height + 3
    body += marks(events, row_y, x_of, t0, t1)
    height = y + BOTTOM
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="DejaVu Sans, Arial, sans-serif">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>']
    out += legend()
    out += body
    out += axis(t0, t1, x_of, y)
    out.append("</svg>")
    return "\n".join(out)


def marks(events, row_y, x_of, t0, t1):
    out = []
    leaves = {}  # flows are bound to slices: bind_id with flow_out / flow_in
    for e in events:
        if e["ph"] == "X" and e.get("flow_out"):
            leaves[e["bind_id"]] = e
    for e in events:
        key = (e["pid"], e["tid"])
        if e["ph"] == "M" or key not in row_y or not t0 <= e["ts"] <= t1:
            continue
        x = x_of(e["ts"])
        if e["ph"] == "i" and e["name"].endswith(" ready"):
            y = row_y[key]
            out.append(f'<path d="M{x:.1f},{y} l-3,-5 h6 z" fill="#222222">'
                       f'<title>{escape(e["name"])}</title></path>')
        elif e["ph"] == "X" and e.get("flow_in"):
            s = leaves.get(e["bind_id"])
            if (s is None or (s["pid"], s["tid"]) not in row_y or s["tid"] == e["tid"]
                    or not t0 <= s["ts"] <= t1):
                continue
            xs, ys = x_of(s["ts"]), row_y[(s["pid"], s["tid"])] + 7
            ye = row_y[key] + 7
            out.append(f'<path d="M{xs:.1f},{ys} C{xs + 8:.1f},{ys} {x - 8:.1f},{ye} {x:.1f},{ye}" '
                       f'fill="none" stroke="#555555" stroke-width="0.7" opacity="0.7"/>')
    return out


def legend():
    out, x = [], LEFT
    for name, fill in LEGEND:
        out.append(f'<rect x="{x}" y="34" width="10" height="10" fill="{fill}"/>')
        out.append(f'<text x="{x + 13}" y="43" font-size="10">{escape(name)}</text>')
        x += 22 + 6 * len(name)
    return out


def axis(t0, t1, x_of, y):
    span_ms = (t1 - t0) / 1000
    step = next(s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
                if span_ms / s <= 12)
    out = [f'<line x1="{LEFT}" y1="{y + 4}" x2="{WIDTH - RIGHT}" y2="{y + 4}" stroke="#333"/>']
    tick = (int(t0 / 1000 / step) + 1) * step
    while tick * 1000 < t1:
        x = x_of(tick * 1000)
        out.append(f'<line x1="{x:.1f}" y1="{y + 4}" x2="{x:.1f}" y2="{y + 9}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 21}" font-size="10" text-anchor="middle">'
                   f'{tick:g} ms</text>')
        tick += step
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--steps", help="A:B, rank 0's steps to show")
    p.add_argument("--window", help="MS:MS from the trace's start")
    p.add_argument("--title", default="ddprun --trace: the merged timeline")
    a = p.parse_args()
    try:
        trace = json.load(open(a.trace))
    except (OSError, ValueError) as e:
        sys.exit(f"trace_svg.py: {a.trace}: {e}")
    t0, t1 = window(trace["traceEvents"], a.steps, a.window)
    with open(a.out, "w") as f:
        f.write(render(trace, t0, t1, a.title))
    print(f"trace_svg.py: {a.out}: {t0 / 1000:.3f} to {t1 / 1000:.3f} ms")


if __name__ == "__main__":
    main()
