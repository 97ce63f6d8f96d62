#!/usr/bin/env python3
"""Two loss curves (ours and PyTorch's, step / lr / loss / grad_norm TSV files) as one SVG.

    plot_loss_curve.py OURS.tsv TORCH.tsv OUT.svg [--title T] [--subtitle S]

Plain Python, no plotting library: a line per curve over the steps, the y axis from the
lowest to the highest loss, ticks every 10% of the steps, a legend, and the largest
relative difference between the two curves in the subtitle line. Prints that figure.
"""

import argparse
import sys

WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 60, 50


def read_losses(path):
    rows = [line.split("\t") for line in open(path).read().splitlines()[1:] if line.strip()]
    if not rows:
        sys.exit(f"plot_loss_curve.py: {path} has no rows")
    return [float(r[2]) for r in rows]


def escape(text):
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def polyline(losses, x_of, y_of, colour, dash=""):
    points = " ".join(f"{x_of(i):.1f},{y_of(v):.1f}" for i, v in enumerate(losses))
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<polyline fill="none" stroke="{colour}" stroke-width="1.6"{dash_attr} '
            f'points="{points}"/>')


def render(ours, theirs, title, subtitle):
    steps = max(len(ours), len(theirs))
    lo, hi = min(ours + theirs), max(ours + theirs)
    pad = 0.05 * (hi - lo or 1.0)
    lo, hi = lo - pad, hi + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(i):
        return LEFT + plot_w * i / max(steps - 1, 1)

    def y_of(v):
        return TOP + plot_h * (hi - v) / (hi - lo)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="15">{escape(title)}</text>',
           f'<text x="{LEFT}" y="40" fill="#555">{escape(subtitle)}</text>',
           f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
           f'stroke="#999"/>']
    for k in range(11):
        step = round((steps - 1) * k / 10)
        x = x_of(step)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" '
                   f'y2="{TOP + plot_h + 4}" stroke="#999"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">'
                   f'{step}</text>')
    for k in range(6):
        v = lo + (hi - lo) * k / 5
        y = y_of(v)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" '
                   f'stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 10}" text-anchor="middle">'
               f'optimizer step</text>')
    out.append(f'<text x="16" y="{TOP + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + plot_h / 2})">training loss (nats)</text>')
    out.append(polyline(theirs, x_of, y_of, "#d62728"))
    out.append(polyline(ours, x_of, y_of, "#1f77b4", dash="5,3"))
    legend_x = LEFT + plot_w - 170
    for row, (label, colour, dash) in enumerate(
            [("ddp (C++)", "#1f77b4", "5,3"), ("PyTorch 1.13", "#d62728", "")]):
        y = TOP + 18 + 18 * row
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{legend_x}" y1="{y}" x2="{legend_x + 30}" y2="{y}" '
                   f'stroke="{colour}" stroke-width="1.6"{dash_attr}/>')
        out.append(f'<text x="{legend_x + 38}" y="{y + 4}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ours")
    parser.add_argument("theirs")
    parser.add_argument("out")
    parser.add_argument("--title", default="GPT training loss: ddp vs PyTorch")
    parser.add_argument("--subtitle", default="")
    args = parser.parse_args(argv)
    ours, theirs = read_losses(args.ours), read_losses(args.theirs)
    if len(ours) != len(theirs):
        sys.exit(f"plot_loss_curve.py: {len(ours)} steps in {args.ours}, "
                 f"{len(theirs)} in {args.theirs}")
    worst = max((abs(a - b) / abs(b), i) for i, (a, b) in enumerate(zip(ours, theirs)))
    subtitle = (f"{args.subtitle}; " if args.subtitle else "") + \
        f"largest relative difference {worst[0]:.2g} (step {worst[1]})"
    with open(args.out, "w") as f:
        f.write(render(ours, theirs, args.title, subtitle))
    print(f"plot_loss_curve: {len(ours)} steps, first loss {ours[0]:.4f} / {theirs[0]:.4f}, "
          f"last {ours[-1]:.4f} / {theirs[-1]:.4f} (ours / torch), largest relative "
          f"difference {worst[0]:.3g} at step {worst[1]} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
