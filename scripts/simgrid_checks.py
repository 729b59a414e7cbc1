#!/usr/bin/python3
"""The checks scripts/test_simgrid.sh makes on simulated jobs' reports; an AssertionError names the
failed one (exit 1).

    simgrid_checks.py checked REPORT.json N       --check passed on N ranks, watchdog off, both passes timed
    simgrid_checks.py timing REAL.json TIMING.json
                                                  a timing-only job has the computed job's work and
                                                  ledger, no values, and compute within 10x
    simgrid_checks.py decode REPORT.json N POSITIONS
                                                  a decode job on N ranks: every position in one
                                                  rank's cache, steps timed, --check passed (unless
                                                  timing-only), the merge and its yardstick timed
"""
import json
import sys


def checked(path, n):
    r = json.load(open(path))
    assert r["check"]["passed"], r["check"]
    assert len(r["ranks"]) == int(n), len(r["ranks"])
    assert r["config"]["timeout"] == 0, "the watchdog is off under simulation"
    assert r["time"]["forward_s"] > 0 and r["time"]["backward_s"] > 0


def timing(real_path, timing_path):
    real, tim = json.load(open(real_path)), json.load(open(timing_path))
    assert tim["config"].get("timing_only") is True and "timing_only" not in real["config"]
    assert tim["config"]["strategy"] == real["config"]["strategy"]
    assert "check" not in tim and tim.get("loss") is None, "a timing-only job has no values"
    for a, b in zip(real["ranks"], tim["ranks"]):
        assert a["work"]["flops"] == b["work"]["flops"] and a["work"]["tile_pairs"] == b["work"]["tile_pairs"], \
            (a["work"], b["work"])
        assert a["ledger"] == b["ledger"], (a["rank"], a["ledger"], b["ledger"])
    # Both charge the same flops at the platform's speed: simulated compute agrees within 10x (the
    # real one is this host's kernel time scaled by --host-speed, timing-only the exact count).
    ca = max(r["time"]["compute_s"] for r in real["ranks"])
    cb = max(r["time"]["compute_s"] for r in tim["ranks"])
    assert cb > 0 and 0.1 < ca / cb < 10, (ca, cb)


def decode(path, n, positions):
    r = json.load(open(path))
    assert len(r["ranks"]) == int(n), len(r["ranks"])
    held = sum(x["decode"]["cache_positions"] for x in r["ranks"])
    assert held == int(positions), (held, positions)
    assert r["time"]["decode_step_s"] > 0 and r["identical_on_every_rank"]
    assert r["merge"]["merge_s"] > 0 and r["merge"]["allreduce_s"] > 0, r["merge"]
    if r["config"].get("timing_only"):
        assert "check" not in r, "a timing-only job has no values"
    else:
        assert r["check"]["passed"], r["check"]


if __name__ == "__main__":
    {"checked": checked, "timing": timing, "decode": decode}[sys.argv[1]](*sys.argv[2:])
