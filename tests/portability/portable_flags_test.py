#!/usr/bin/python3
"""A default build runs on any x86-64: no compile command in compile_commands.json tunes for the
build machine (-march=native, -mtune=native, -mcpu=native), and the kernels' source is compiled
once, its SIMD targets chosen at run time rather than by flags.

    portable_flags_test.py BUILD_DIR [--native-build]

With --native-build (a build configured with RINGATTN_NATIVE=ON) the check is skipped (exit 77).
"""
import json
import os
import sys

if "--native-build" in sys.argv:
    print("RINGATTN_NATIVE=ON: an explicitly native build, not checked")
    sys.exit(77)
path = os.path.join(sys.argv[1], "compile_commands.json")
commands = json.load(open(path))
bad = [c["file"] for c in commands
       if any(f in c.get("command", " ".join(c.get("arguments", [])))
              for f in ("-march=native", "-mtune=native", "-mcpu=native"))]
kernels = [c for c in commands if c["file"].endswith("src/core/block_kernels.cpp")]
print(f"{len(commands)} compile commands in {path}; {len(bad)} tune for the build machine")
for f in bad:
    print(f"  native: {f}")
ok = not bad and len(commands) > 0
if len(kernels) != 1:
    print(f"expected the kernels compiled once, found {len(kernels)} commands")
    ok = False
elif "-mavx" in kernels[0].get("command", ""):
    print("the kernels' baseline must not be raised by flags: targets are chosen at run time")
    ok = False
sys.exit(0 if ok else 1)
