#!/usr/bin/python3
"""A default build runs on any x86-64: no compile command in compile_commands.json tunes for the
build machine (-march=native, -mtune=native, -mcpu=native), and the kernels' source is compiled
once, its SIMD targets chosen at run time rather than by flags.

    portable_flags_test.py BUILD_DIR [--native-build]

An entry of compile_commands.json holds its command line as one string ("command"), as a list
("arguments"), or both; every check reads both. With --native-build (a build configured with
RINGATTN_NATIVE=ON) the check is skipped (exit 77).
"""
import json
import os
import sys

NATIVE = ("-march=native", "-mtune=native", "-mcpu=native")


def flags(entry):
    """Every word of an entry's command line, from "command" and "arguments" alike."""
    return entry.get("command", "").split() + list(entry.get("arguments", []))


def native(entry):
    return any(f in NATIVE for f in flags(entry))


def raised_baseline(entry):
    """An x86 ISA extension forced on the kernels' source (a cross build's own -march is its baseline)."""
    return any(f.startswith("-mavx") for f in flags(entry))


def self_check():
    """The checks see a flag wherever an entry keeps it (a check that cannot fail is no check)."""
    for entry in ({"command": "c++ -O2 -march=native -c a.cpp"}, {"arguments": ["c++", "-mtune=native", "a.cpp"]},
                  {"command": "c++ -c a.cpp", "arguments": ["c++", "-mcpu=native", "a.cpp"]}):
        assert native(entry), entry
    for entry in ({"command": "c++ -mavx2 -c k.cpp"}, {"arguments": ["c++", "-mavx512f", "k.cpp"]}):
        assert raised_baseline(entry), entry
    assert not native({"command": "c++ -O2 -c a.cpp", "arguments": ["c++", "-O2", "a.cpp"]})


if "--native-build" in sys.argv:
    print("RINGATTN_NATIVE=ON: an explicitly native build, not checked")
    sys.exit(77)
self_check()
path = os.path.join(sys.argv[1], "compile_commands.json")
commands = json.load(open(path))
bad = [c["file"] for c in commands if native(c)]
kernels = [c for c in commands if c["file"].endswith("src/core/block_kernels.cpp")]
print(f"{len(commands)} compile commands in {path}; {len(bad)} tune for the build machine")
for f in bad:
    print(f"  native: {f}")
ok = not bad and len(commands) > 0
if len(kernels) != 1:
    print(f"expected the kernels compiled once, found {len(kernels)} commands")
    ok = False
elif raised_baseline(kernels[0]):
    print("the kernels' baseline must not be raised by flags: targets are chosen at run time")
    ok = False
sys.exit(0 if ok else 1)
