#!/usr/bin/env python3
"""Registers, spills and shared memory of every kernel instance in a GPU source, and with --sass
the opcode mix of each kernel's loops: what ptxas decided, read on a machine without a GPU.

    python3 tools/kernel_stats.py native/gpu/matmul_mma_frag.cu --grep bulk
    python3 tools/kernel_stats.py native/gpu/matmul_int8.cu --grep 'IQ4_XS<1, 4, 1>' --sass

Why: a kernel's occupancy follows from its registers and shared memory, and a decode matmul on an
H200 is as much an instruction stream as a memory stream (docs/benchmarks.md), so both are worth
knowing before a device run is spent on a change. Instances are named by their template
arguments, the weight type by name (`matmul_int8_kernel IQ4_XS<1, 4, 1>`). --sass needs NVIDIA's
cuobjdump and nvdisasm on the PATH (the CUDA toolkit has them; elsewhere the PyPI wheels
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry the binaries). Exit status 2 when the
source does not compile or no kernel matches.
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INCLUDES = ("native/include", "native/src", "native/gpu")
GGML_TYPES = {0: "F32", 1: "F16", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 23: "IQ4_XS", 30: "BF16"}


def instance_name(mangled: str) -> str:
    """`matmul_int8_kernel IQ4_XS<1, 4, 1>` from a mangled kernel name: the last component of its
    nested name, then its template arguments (integers, booleans, the names of type arguments),
    the first integer of a matmul read as a ggml type."""
    if not mangled.startswith("_Z"):
        return mangled
    pos, base = (3 if mangled.startswith("_ZN") else 2), mangled  # a nested name, or a global one
    while pos < len(mangled) and mangled[pos].isdigit():
        digits = re.match(r"\d+", mangled[pos:]).group(0)
        pos += len(digits)
        base, pos = mangled[pos:pos + int(digits)], pos + int(digits)
    if not mangled.startswith("I", pos):
        return base
    values, text, i = [], mangled[pos + 1:].split("EEv")[0], 0
    while i < len(text):  # Li<n>E / Lb<n>E literals, <length><name> type names; the rest is glue
        if substitution := re.match(r"S[0-9A-Z]*_", text[i:]):  # a back-reference (the namespace)
            i += substitution.end()
        elif literal := re.match(r"L[ib](-?\d+)E?", text[i:]):
            values.append(int(literal.group(1)))
            i += literal.end()
        elif name := re.match(r"\d+", text[i:]):
            i += name.end()
            values.append(text[i:i + int(name.group(0))])
            i += int(name.group(0))
        else:
            i += 1
    if "matmul" in base and values and values[0] in GGML_TYPES:
        return f"{base} {GGML_TYPES[values[0]]}<{', '.join(map(str, values[1:]))}>"
    return f"{base}<{', '.join(map(str, values))}>"


def ptxas_stats(source: Path, arch: str, nvcc: str) -> dict[str, dict]:
    """{instance: {registers, spill_bytes, shared_bytes, mangled}} from nvcc -Xptxas -v."""
    cmd = [nvcc, "-std=c++17", "-O3", f"-arch=sm_{arch}", *(f"-I{REPO / d}" for d in INCLUDES),
           "-Xptxas", "-v", "-c", "-o", "/dev/null", str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{source} does not compile: " + proc.stderr.strip().splitlines()[-1])
    stats: dict[str, dict] = {}
    current = None
    for line in proc.stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            current = {"mangled": m.group(1), "registers": 0, "spill_bytes": 0, "shared_bytes": 0}
            stats[instance_name(m.group(1))] = current
        elif current is not None:
            if m := re.search(r"(\d+) bytes spill stores", line):
                current["spill_bytes"] = int(m.group(1))
            if m := re.search(r"Used (\d+) registers", line):
                current["registers"] = int(m.group(1))
            if m := re.search(r"(\d+) bytes smem", line):
                current["shared_bytes"] = int(m.group(1))
    return stats


def loop_opcodes(source: Path, arch: str, nvcc: str, mangled: set[str]) -> dict[str, list[tuple[int, collections.Counter]]]:
    """{mangled: [(instructions, opcode counts) per loop]}: a loop is the span of a backward branch."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        subprocess.run([nvcc, "-std=c++17", "-O3", f"-arch=sm_{arch}", *(f"-I{REPO / d}" for d in INCLUDES),
                        "-cubin", "-o", str(cubin), str(source)], check=True, capture_output=True)
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    loops: dict[str, list] = {}
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        if name not in mangled:
            continue
        code = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in
                re.finditer(r"/\*([0-9a-f]{4,})\*/\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", chunk)]
        found = []
        for offset, op, operands in code:
            target = re.search(r"0x([0-9a-f]+)", operands) if op.startswith("BRA") else None
            if target and int(target.group(1), 16) < offset:
                body = [o for at, o, _ in code if int(target.group(1), 16) <= at <= offset]
                found.append((len(body), collections.Counter(o.split(".")[0] for o in body)))
        loops[name] = found
    return loops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="a .cu file of native/gpu")
    ap.add_argument("--grep", default="", help="only instances whose name contains this text")
    ap.add_argument("--arch", default="90", help="SM architecture (default 90: the H200)")
    ap.add_argument("--sass", action="store_true", help="also each loop's instruction count and opcode mix")
    args = ap.parse_args(argv)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("kernel_stats: nvcc not found on PATH", file=sys.stderr)
        return 2
    if args.sass and not (shutil.which("cuobjdump") and shutil.which("nvdisasm")):
        print("kernel_stats: --sass needs cuobjdump and nvdisasm on PATH", file=sys.stderr)
        return 2
    try:
        stats = ptxas_stats(args.source, args.arch, nvcc)
    except RuntimeError as e:
        print(f"kernel_stats: {e}", file=sys.stderr)
        return 2
    chosen = {name: s for name, s in sorted(stats.items()) if args.grep in name}
    if not chosen:
        print(f"kernel_stats: no kernel of {args.source} matches {args.grep!r}", file=sys.stderr)
        return 2
    loops = loop_opcodes(args.source, args.arch, nvcc, {s["mangled"] for s in chosen.values()}) if args.sass else {}
    width = max(len(n) for n in chosen)
    print(f"{'kernel':<{width}}  registers  spill bytes  static shared bytes")
    for name, s in chosen.items():
        print(f"{name:<{width}}  {s['registers']:>9}  {s['spill_bytes']:>11}  {s['shared_bytes']:>19}")
        for n, ops in loops.get(s["mangled"], []):
            print(f"    loop of {n} instructions: " + ", ".join(f"{op} {k}" for op, k in ops.most_common(12)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
