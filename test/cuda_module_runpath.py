#!/usr/bin/env python3
"""Checks the CUDA half's modules' RUNPATH: every entry an absolute folder, none empty.

The dynamic loader reads an empty RUNPATH entry ("/usr/local/cuda/lib:" ends in one) or a relative one
as the current folder, so a libcudart.so.13 or libnccl.so.2 in whatever folder a job was started from
would be loaded in place of the real one. cmake/TinyddpCuda.cmake writes the RUNPATH itself; this
reads what the linker put in the built files.

    test/cuda_module_runpath.py build/lib/libtinyddp_cuda.so build/lib/libtinyddp_nccl.so
"""
import re
import subprocess
import sys


def runpath_entries(module):
    dynamic = subprocess.run(["readelf", "-d", module], check=True, capture_output=True, text=True).stdout
    found = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dynamic)
    return None if found is None else found.group(1).split(":")


def main(modules):
    failures = 0
    for module in modules:
        entries = runpath_entries(module)
        if entries is None:
            print(f"{module}: no RUNPATH (the loader then uses LD_LIBRARY_PATH and ldconfig's cache)")
            continue
        bad = [e for e in entries if not e.startswith("/") and not e.startswith("$ORIGIN")]
        if bad:
            failures += 1
            print(f"FAIL {module}: RUNPATH {':'.join(entries)} has entries the loader reads from the "
                  f"current folder: {bad}")
        else:
            print(f"ok {module}: RUNPATH {':'.join(entries)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
