#!/usr/bin/env python3
"""Checks that the CUDA kernels whose results the tests compare with the CPU's bit for bit hold no
fused multiply-add the source does not write.

nvcc fuses a * b + c into one fma.rn.f32 (one rounding) unless told --fmad=false
(cmake/TinyddpCuda.cmake), while the CPU build rounds twice: fill_uniform would then draw other
numbers on a GPU than the CPU tests checked. Each .cu file is compiled again to PTX with the build's
own nvcc command line (compile_commands.json, every flag kept but the targets), so this runs without
a GPU and checks what the build really passes to nvcc.

    test/cuda_contraction.py build/compile_commands.json

Kernels calling the CUDA math library (expf, logf, tanhf: the losses, GELU) are not listed: those
functions are made of explicit FMAs, and their tests compare with a tolerance.
"""
import json
import re
import shlex
import subprocess
import sys
import tempfile

# The kernels, and the file each is defined in.
KERNELS = {
    "core/cuda/random.cu": ["fill_uniform_kernel"],
    "kernels/cuda/convert.cu": ["convert_kernel"],
    "kernels/cuda/optimizers.cu": ["sgd_kernel", "adam_kernel"],
    "kernels/cuda/elementwise.cu": ["axpy_kernel", "scale_kernel", "bias_add_kernel", "bias_grad_kernel"],
}


def ptx_of(entry, out):
    """The entry's nvcc command, made to write PTX for one virtual architecture to `out`."""
    words = shlex.split(entry["command"])
    command, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word in ("-o", "-c"):
            skip = word == "-o"
            continue
        if word.startswith("--generate-code") or word.startswith("-gencode") or word.startswith("-arch"):
            continue
        command.append(word)
    command += ["-arch=compute_90", "-ptx", "-o", out]
    subprocess.run(command, cwd=entry["directory"], check=True)
    with open(out) as f:
        return f.read()


def fma_counts(ptx):
    """{kernel's mangled name: fma instructions in its body}."""
    counts, name = {}, None
    for line in ptx.splitlines():
        entry = re.match(r"^\s*(?:\.\w+\s+)*\.entry\s+([^\s(]+)", line)
        if entry:
            name = entry.group(1)
            counts[name] = 0
        elif name and re.search(r"\bfma\.rn", line):
            counts[name] += 1
        elif name and line.startswith("}"):
            name = None
    return counts


def main():
    entries = json.load(open(sys.argv[1]))
    failed = False
    with tempfile.TemporaryDirectory() as scratch:
        for source, kernels in KERNELS.items():
            matching = [e for e in entries if e["file"].endswith("/" + source)]
            if not matching:
                print(f"FAIL: {source} is not in {sys.argv[1]}")
                failed = True
                continue
            counts = fma_counts(ptx_of(matching[0], f"{scratch}/out.ptx"))
            for kernel in kernels:
                found = {name: n for name, n in counts.items() if kernel in name}
                if not found:
                    print(f"FAIL: no kernel named *{kernel}* in the PTX of {source}")
                    failed = True
                for name, n in found.items():
                    if n:
                        print(f"FAIL: {n} fused multiply-add(s) in {kernel} ({name}), {source}")
                        failed = True
    if not failed:
        print("no contracted multiply-add in: " + ", ".join(k for ks in KERNELS.values() for k in ks))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
