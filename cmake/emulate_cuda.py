#!/usr/bin/env python3
"""Turns a .cu/.cuh file into C++ for the emulated CUDA device.

Note [emulated CUDA device] (runtime/cuda/emu/kernel_emu.h): the kernels' own source
runs on the CPU. Each launch `kernel<<<grid, block, shared, stream>>>(args)` becomes
`::ddp::cuda_emu::launch("kernel", Config(grid, block, shared, stream), <a call of
kernel>, args)`; a .cu file includes kernel_emu.h first. Line numbers are kept, and
#line names the original file, so that compiler errors and sanitizer reports point at
the source.

usage: emulate_cuda.py INPUT OUTPUT
"""
import re
import sys

# A kernel name, optionally qualified and with template arguments nested once, then the
# launch configuration and the opening parenthesis of the arguments.
LAUNCH = re.compile(
    r"(?P<kernel>[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*(?:<(?:[^<>;]|<[^<>;]*>)*>)?)"
    r"(?P<gap>\s*)<<<(?P<config>[^;]*?)>>>(?P<tail>\s*)\((?P<empty>\s*\))?")


def rewrite(text):
    spans = []

    def launch(m):
        spans.append(m.span())
        kernel = " ".join(m.group("kernel").split())
        config = " ".join(m.group("config").split())
        newlines = m.group(0).count("\n")
        # k<<<...>>>() has no arguments to follow the call's comma.
        rest = ")" if m.group("empty") else ", "
        return ('::ddp::cuda_emu::launch("%s", ::ddp::cuda_emu::Config(%s), '
                '[&](auto&&... ddp_emu_args) { %s(ddp_emu_args...); }%s%s'
                % (kernel, config, kernel, rest, "\n" * newlines))
    out, count = LAUNCH.subn(launch, text)
    for m in re.finditer("<<<", text):
        if not any(a <= m.start() < b for a, b in spans):
            line = text[:m.start()].count("\n") + 1
            sys.exit("emulate_cuda.py: a launch at line %d is not in a form it knows "
                     "(kernel<<<config>>>(args) with no ';' in the config)" % line)
    return out, count


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    out, _ = rewrite(text)
    header = ""
    if src.endswith(".cu"):
        header = '#include "runtime/cuda/emu/kernel_emu.h"\n'
    header += '#line 1 "%s"\n' % src
    with open(dst, "w", encoding="utf-8") as f:
        f.write(header + out)


if __name__ == "__main__":
    main()
