#!/usr/bin/env python3
"""Draws one training step of a TINYDDP_TRACE file as an SVG timeline, and says how much of the
gradient all-reduce was hidden behind the backward pass.

    TINYDDP_TRACE=run.json build/bin/train_bench --world-size 2 --samples 2048 --epochs 1
    python3 scripts/trace_to_svg.py run.json -o docs/images/overlap.svg --step 4

The file is a Chrome trace (core/trace.h): one process per rank ("pid" = rank), lanes as threads
("tid": 1 compute, 2 communication, 3 data loading, 4 host), "X" events are spans and "i" events
instants. The step drawn is the --step-th "train_step" span (counting from 1, on every rank), from
its start to the end of the "optimizer step" that follows it. Spans nest on a lane (train_step holds
forward, which holds each layer's forward); each level of nesting gets its own row.

Python 3 standard library only, so it runs wherever the project builds.
"""
import argparse
import html
import json
import re
import sys

LANE_ORDER = {1: 0, 2: 1, 3: 2}  # compute, communication, data loading; host instants are left out
COLOURS = [  # (name prefix, fill): the first that matches
    ("all_reduce", "#4caf50"),
    ("forward", "#64b5f6"),
    ("backward pass", "#ffe0b2"),
    ("backward ", "#ff9800"),  # one layer's backward ("backward 2 Linear")
    ("backward", "#ffcc80"),   # DDP's whole backward
    ("optimizer", "#ba68c8"),
    ("wait", "#bdbdbd"),
    ("train_step", "#e3f2fd"),
]
ROW = 18        # pixels per nesting level
LANE_GAP = 6
LEFT = 150      # room for the lane names
WIDTH = 1000    # the time axis


def colour(name):
    for prefix, fill in COLOURS:
        if name.startswith(prefix):
            return fill
    return "#e0e0e0"


def load(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    lane_names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            lane_names[(e["pid"], e["tid"])] = e["args"]["name"]
    return events, lane_names


def step_window(events, step):
    """[begin, end] of the step-th train_step and the optimizer step after it, over every rank."""
    begins, ends = [], []
    for rank in sorted({e["pid"] for e in events if e.get("ph") == "X"}):
        spans = sorted((e for e in events if e.get("ph") == "X" and e["pid"] == rank), key=lambda e: e["ts"])
        starts = [e for e in spans if e["name"] == "train_step"]
        if len(starts) < step:
            sys.exit(f"trace_to_svg: rank {rank} has {len(starts)} train_step spans, fewer than --step {step}; "
                     "hint: pick a smaller --step or trace a longer run")
        begin = starts[step - 1]["ts"]
        optimizer = [e for e in spans if e["name"] == "optimizer step" and e["ts"] >= begin]
        if not optimizer:
            sys.exit(f"trace_to_svg: rank {rank} has no optimizer step after train_step {step}; hint: is the trace complete?")
        begins.append(begin)
        ends.append(optimizer[0]["ts"] + optimizer[0]["dur"])
    if not begins:
        sys.exit("trace_to_svg: the trace has no spans; hint: was TINYDDP_TRACE set for a training run?")
    return min(begins), max(ends)


def nest(spans):
    """Gives each span a depth: 0 unless it lies inside an earlier span of the same lane."""
    stack = []
    for s in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        while stack and s["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
            stack.pop()
        s["depth"] = len(stack)
        stack.append(s)
    return spans


def overlap(a_begin, a_end, b_begin, b_end):
    return max(0, min(a_end, b_end) - max(a_begin, b_begin))


def summarise(events, begin, end):
    """Per rank: how long the bucket all-reduces took, how much of that ran while a layer's backward
    was computing (hidden), and how long the rank then waited for the rest ("wait for gradients")."""
    lines = []
    for rank in sorted({e["pid"] for e in events if e.get("ph") == "X"}):
        inside = [e for e in events if e.get("ph") == "X" and e["pid"] == rank and begin <= e["ts"] < end]
        layers = [e for e in inside if re.match(r"backward \d", e["name"])]
        reduces = [e for e in inside if e["name"].startswith("all_reduce")]
        waits = [e for e in inside if e["name"] == "wait for gradients"]
        if not layers or not reduces:
            continue
        total = sum(e["dur"] for e in reduces)
        hidden = sum(overlap(r["ts"], r["ts"] + r["dur"], l["ts"], l["ts"] + l["dur"]) for r in reduces for l in layers)
        step = max(e["ts"] + e["dur"] for e in inside) - min(e["ts"] for e in inside)
        lines.append(f"rank {rank}: step {step / 1000:.1f} ms; {len(reduces)} bucket all-reduces {total / 1000:.1f} ms, "
                     f"{hidden / 1000:.1f} ms of it ({100 * hidden / total:.0f}%) while layers computed their backward; "
                     f"then waited {sum(e['dur'] for e in waits) / 1000:.1f} ms for gradients")
    return lines


def draw(events, lane_names, begin, end, title):
    scale = WIDTH / (end - begin)
    x = lambda t: LEFT + (t - begin) * scale
    rows, y = [], 40
    body = []
    for rank in sorted({e["pid"] for e in events if e.get("ph") == "X"}):
        for tid in sorted(LANE_ORDER, key=LANE_ORDER.get):
            spans = [dict(e) for e in events if e.get("ph") == "X" and e["pid"] == rank and e["tid"] == tid
                     and e["ts"] < end and e["ts"] + e["dur"] > begin]
            instants = [e for e in events if e.get("ph") == "i" and e["pid"] == rank and e.get("tid") == tid
                        and begin <= e["ts"] <= end]
            # A lane with nothing visible (the data loader's zero-length waits) only takes room.
            if sum(min(s["ts"] + s["dur"], end) - max(s["ts"], begin) for s in spans) < 0.005 * (end - begin) \
                    and not instants:
                continue
            nest(spans)
            depth = max([s["depth"] for s in spans], default=0) + 1
            height = depth * ROW
            lane = lane_names.get((rank, tid), f"lane {tid}")
            body.append(f'<text x="{LEFT - 8}" y="{y + height / 2 + 4}" text-anchor="end">rank {rank} {html.escape(lane)}</text>')
            body.append(f'<rect x="{LEFT}" y="{y}" width="{WIDTH}" height="{height}" fill="#fafafa" stroke="#eeeeee"/>')
            for s in spans:
                x0, x1 = max(x(s["ts"]), LEFT), min(x(s["ts"] + s["dur"]), LEFT + WIDTH)
                top = y + s["depth"] * ROW
                name = html.escape(s["name"])
                body.append(f'<rect x="{x0:.1f}" y="{top + 1}" width="{max(x1 - x0, 0.8):.1f}" height="{ROW - 2}" '
                            f'fill="{colour(s["name"])}" stroke="#555" stroke-width="0.4">'
                            f'<title>{name}: {s["dur"] / 1000:.2f} ms</title></rect>')
                if x1 - x0 > 7 * len(s["name"]) * 0.8:
                    body.append(f'<text x="{x0 + 3:.1f}" y="{top + ROW - 5}">{name}</text>')
            for i in instants:
                xi = x(i["ts"])
                body.append(f'<path d="M{xi:.1f},{y} l-4,-7 h8 z" fill="#d32f2f"><title>{html.escape(i["name"])}</title></path>')
                body.append(f'<text x="{xi + 5:.1f}" y="{y - 1}" fill="#d32f2f">{html.escape(i["name"])}</text>')
            y += height + LANE_GAP + (12 if instants else 0)
            rows.append(lane)
        y += 10
    # The time axis: a tick every 1, 2, 5, 10, ... ms, whichever gives about ten ticks.
    span_ms = (end - begin) / 1000
    tick = next(t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if span_ms / t <= 12)
    axis = []
    t = 0.0
    while t <= span_ms + 1e-9:
        xt = LEFT + t * 1000 * scale
        axis.append(f'<line x1="{xt:.1f}" y1="30" x2="{xt:.1f}" y2="{y}" stroke="#ddd" stroke-width="0.5"/>')
        axis.append(f'<text x="{xt:.1f}" y="{y + 14}" text-anchor="middle">{t:g} ms</text>')
        t += tick
    legend, lx = [], LEFT
    for label, fill in (("forward", "#64b5f6"), ("backward (per layer)", "#ff9800"), ("bucket all-reduce", "#4caf50"),
                        ("optimizer step", "#ba68c8"), ("wait", "#bdbdbd")):
        legend.append(f'<rect x="{lx}" y="{y + 24}" width="12" height="12" fill="{fill}" stroke="#555" stroke-width="0.4"/>')
        legend.append(f'<text x="{lx + 16}" y="{y + 34}">{label}</text>')
        lx += 16 + 7 * len(label) + 18
    total_height = y + 46
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{total_height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{LEFT}" y="18" font-size="13">{html.escape(title)}</text>',
        *axis, *body, *legend, "</svg>", ""])


def main():
    parser = argparse.ArgumentParser(description="Draw one training step of a TINYDDP_TRACE file as an SVG.")
    parser.add_argument("trace", help="the merged trace (the TINYDDP_TRACE file)")
    parser.add_argument("-o", "--output", required=True, help="the SVG to write")
    parser.add_argument("--step", type=int, default=3,
                        help="which train_step to draw, from 1 (default 3: after the buckets were rebuilt)")
    parser.add_argument("--title", default="", help="a line above the picture")
    args = parser.parse_args()
    events, lane_names = load(args.trace)
    begin, end = step_window(events, args.step)
    summary = summarise(events, begin, end)
    title = args.title or f"{args.trace}: train_step {args.step}, every rank on one time axis"
    with open(args.output, "w") as f:
        f.write(draw(events, lane_names, begin, end, title))
    for line in summary:
        print(line)
    print(f"wrote {args.output} ({(end - begin) / 1000:.1f} ms drawn)")


if __name__ == "__main__":
    main()
