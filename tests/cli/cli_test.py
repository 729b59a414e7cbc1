#!/usr/bin/python3
"""End-to-end checks of the `ringattn` command line, one named test per invocation.

    cli_test.py NAME --binary PATH [--mpirun EXE]

Each test runs real mpirun jobs and exits 0 when every assertion holds, 1 otherwise.
"""
import json
import math
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, main, run  # noqa: E402


ARGS = None  # set by harness.main


def ringattn(n, *args, timeout=300, extra_env=None):
    return run([ARGS.mpirun, "-np", n, ARGS.binary, *args], timeout=timeout, extra_env=extra_env)


def expected_ledger(sizes, B, HKV, D, H, r, traffic="full", causal=True):
    """Closed form of the ring protocol (independent of the C++), for contiguous shards.

    full: every block visits every rank. aware: block o travels only as far as the farthest rank
    that needs it (under a causal mask rank q needs o iff o's first position <= q's last)."""
    N, S, e = len(sizes), sum(sizes), 2 * B * HKV * D
    first = [sum(sizes[:o]) for o in range(N)]
    last = [first[o] + sizes[o] - 1 for o in range(N)]

    def need(q, o):
        return sizes[q] > 0 and sizes[o] > 0 and (not causal or first[o] <= last[q])

    if traffic == "full":
        fwd_send = e * sum(sizes[(r - j) % N] for j in range(N - 1))
        fwd_recv = e * (S - sizes[r])
        remote = max([e * sizes[o] for o in range(N) if o != r], default=0)
        grad_send, grad_recv = e * (S - sizes[r]), e * (N - 1) * sizes[r]
    else:
        reach = [max([t for t in range(1, N) if need((o + t) % N, o)], default=0) for o in range(N)]
        dist = [(r - o) % N for o in range(N)]
        fwd_recv = e * sum(sizes[o] for o in range(N) if 1 <= dist[o] <= reach[o])
        fwd_send = e * sum(sizes[o] for o in range(N) if dist[o] < reach[o])
        remote = max([e * sizes[o] for o in range(N) if 1 <= dist[o] <= reach[o]], default=0)
        grad_send = e * sum(sizes[o] for o in range(N) if o != r and need(r, o))
        grad_recv = e * sizes[r] * sum(1 for q in range(N) if q != r and need(q, r))
    return {
        "fwd_kv_send_elems": fwd_send, "fwd_kv_recv_elems": fwd_recv,
        "replay_kv_send_elems": fwd_send, "replay_kv_recv_elems": fwd_recv,
        "grad_send_elems": grad_send, "grad_recv_elems": grad_recv,
        "resident_qkv_elems": B * sizes[r] * (H + 2 * HKV) * D,
        "remote_block_elems": remote,
        "online_state_elems": sizes[r] * B * H * (D + 2),
    }


ACCEPT = ["run", "--seq", 37, "--batch", 2, "--heads", 4, "--kv-heads", 2, "--head-dim", 16, "--dtype", "f64",
          "--causal", "--partition", "10,0,27", "--check"]


def test_partition_check():
    with tempfile.TemporaryDirectory() as d:
        p = ringattn(3, *ACCEPT, "--report", f"{d}/r.json")
        print(p.stdout)
        check(p.returncode == 0, f"exit 0 (got {p.returncode}: {p.stderr.strip()})")
        rep = json.load(open(f"{d}/r.json"))
        errs = rep["check"]["max_rel_err"]
        for k in ("o", "lse", "dq", "dk", "dv"):
            check(errs[k] is not None and errs[k] <= 1e-12, f"max rel err {k} = {errs[k]} <= 1e-12")
        check(rep["check"]["passed"] is True, "check.passed")


def test_report_fields():
    for traffic in ("full", "aware"):
        report_fields(traffic)


def report_fields(traffic):
    print(f"--traffic {traffic}")
    with tempfile.TemporaryDirectory() as d:
        p = ringattn(3, *ACCEPT, "--report", f"{d}/r.json", "--iters", 3, "--warmup", 1, "--traffic", traffic)
        check(p.returncode == 0, f"exit 0 (got {p.returncode})")
        rep = json.load(open(f"{d}/r.json"))
        for k in ("config", "loss", "time", "check", "ranks"):
            check(k in rep, f"top-level field {k}")
        for k in ("forward_s", "backward_s"):
            check(isinstance(rep["time"].get(k), float) and rep["time"][k] > 0, f"time.{k} > 0")
        for opt in ("seq", "batch", "heads", "kv_heads", "head_dim", "dtype", "causal", "window", "doc_lens", "layout",
                    "partition", "scale", "seed", "inputs", "out", "check", "report", "warmup", "iters", "trace",
                    "timeout", "precision"):
            check(opt in rep["config"], f"config.{opt}")
        check(rep["config"]["precision"] == "f32", f"config.precision is f32 by default ({rep['config']['precision']})")
        check(len(rep["ranks"]) == 3, "one entry per rank")
        sizes = [10, 0, 27]
        for r, rr in enumerate(rep["ranks"]):
            check(rr["rank"] == r and rr["positions"] == sizes[r], f"rank {r} positions {sizes[r]}")
            want = expected_ledger(sizes, 2, 2, 16, 4, r, traffic)
            for k, v in want.items():
                check(rr["ledger"].get(k) == v, f"rank {r} ledger.{k} = {rr['ledger'].get(k)} (closed form {v})")
            sent = sum(want[k] for k in ("fwd_kv_send_elems", "replay_kv_send_elems", "grad_send_elems"))
            recv = sum(want[k] for k in ("fwd_kv_recv_elems", "replay_kv_recv_elems", "grad_recv_elems"))
            check(rr["ledger"]["send_bytes"] == 8 * sent, f"rank {r} send_bytes")
            check(rr["ledger"]["recv_bytes"] == 8 * recv, f"rank {r} recv_bytes")
            for k in ("forward_s", "backward_s", "compute_s", "wait_s"):
                check(isinstance(rr["time"].get(k), float) and rr["time"][k] >= 0, f"rank {r} time.{k}")
            for k in ("tile_pairs", "flops"):
                check(k in rr["work"], f"rank {r} work.{k}")
            check((rr["work"]["tile_pairs"] > 0) == (sizes[r] > 0), f"rank {r} did work iff it has positions")


def a2a_closed_form(sizes, U, B, H, HKV, D, r):
    """The all-to-all elements of rank r under usp with groups of U consecutive ranks (independent of
    the C++): member u holds H/U query heads and H/U / gcd(H/U, H/HKV) kv heads."""
    import math
    Hu = H // U
    HKVu = Hu // math.gcd(Hu, H // HKV)
    e = Hu + 2 * HKVu
    g = r // U
    out = dict(a2a_fwd_send_elems=0, a2a_fwd_recv_elems=0, a2a_bwd_send_elems=0, a2a_bwd_recv_elems=0)
    for w in range(g * U, g * U + U):
        if w == r:
            continue
        Lr, Lw = sizes[r], sizes[w]
        out["a2a_fwd_send_elems"] += B * D * (Lr * e + Lw * Hu) + B * Hu * Lw
        out["a2a_fwd_recv_elems"] += B * D * (Lw * e + Lr * Hu) + B * Hu * Lr
        out["a2a_bwd_send_elems"] += B * D * (Lr * Hu + Lw * e)
        out["a2a_bwd_recv_elems"] += B * D * (Lw * Hu + Lr * e)
    return out


# usp and ulysses in the report and the trace: config names the strategy and U, the ledger's
# all-to-all fields are the closed form, the bytes count everything, each all-to-all is a trace step.
def test_strategy_report():
    sizes = [6, 0, 7, 8]
    for strategy, U, H, HKV in (("usp", 2, 4, 2), ("ulysses", 4, 4, 1)):
        print(f"--strategy {strategy} (U={U}, H={H}, HKV={HKV})")
        with tempfile.TemporaryDirectory() as d:
            extra = ["--ulysses-degree", U] if strategy == "usp" else []
            p = ringattn(4, "run", "--seq", 21, "--batch", 2, "--heads", H, "--kv-heads", HKV,
                         "--head-dim", 8, "--dtype", "f64", "--causal", "--partition", "6,0,7,8", "--check",
                         "--strategy", strategy, *extra, "--report", f"{d}/r.json", "--trace", f"{d}/t.jsonl")
            check(p.returncode == 0 and "PASSED" in p.stdout, f"exit 0, check passed ({p.returncode})")
            label = f"usp U={U}" if strategy == "usp" else strategy
            check(p.stdout.splitlines()[0].endswith(f"strategy {label}"), f"summary names {label}")
            rep = json.load(open(f"{d}/r.json"))
            check(rep["config"].get("strategy") == strategy and rep["config"].get("ulysses_degree") == U,
                  f"config.strategy {rep['config'].get('strategy')}, ulysses_degree {rep['config'].get('ulysses_degree')}")
            # the tiles the kernels ran: the ring of a group of U ranks attends their positions with
            # gcd(H/U, H/HKV) query heads per KV head, and every target's default tiles (at least
            # 64 x 128) are cut to that
            Lg = max(sum(sizes[g:g + U]) for g in range(0, len(sizes), U))
            Gu = math.gcd(H // U, H // HKV)
            cfg = rep["config"]
            check((cfg.get("tile_q"), cfg.get("tile_k")) == (Lg * Gu, Lg),
                  f"config.tile_q, tile_k {cfg.get('tile_q')}, {cfg.get('tile_k')} (groups of {Lg} positions, "
                  f"Gu={Gu}: {Lg * Gu}, {Lg})")
            check(cfg.get("traffic") == ("aware" if strategy == "usp" else None) and cfg.get("kv_head_group") is None,
                  f"config.traffic {cfg.get('traffic')!r}, kv_head_group {cfg.get('kv_head_group')!r}")
            steps = [json.loads(l) for l in open(f"{d}/t.jsonl") if l.strip()]
            for r, rr in enumerate(rep["ranks"]):
                led = rr["ledger"]
                for k, v in a2a_closed_form(sizes, U, 2, H, HKV, 8, r).items():
                    check(led.get(k) == v, f"rank {r} ledger.{k} = {led.get(k)} (closed form {v})")
                moved = lambda side: sum(led[f"{k}_{side}_elems"] for k in ("fwd_kv", "replay_kv", "grad", "a2a_fwd",
                                                                             "a2a_bwd"))
                check(led["send_bytes"] == 8 * moved("send") and led["recv_bytes"] == 8 * moved("recv"),
                      f"rank {r}: send_bytes and recv_bytes count everything ({led['send_bytes']}, {led['recv_bytes']})")
                t = rr["time"]
                check(0 < t.get("a2a_wait_s", 0) <= t["wait_s"] + 1e-12, f"rank {r}: 0 < a2a_wait_s <= wait_s ({t})")
                a2a = [s for s in steps if s["rank"] == r and s.get("phase") == "all-to-all"]
                check(len(a2a) == 4 and all(s["src"] == -1 for s in a2a), f"rank {r}: two all-to-alls per pass")
                a2a_elems = sum(led[k] for k in ("a2a_fwd_send_elems", "a2a_fwd_recv_elems", "a2a_bwd_send_elems",
                                                 "a2a_bwd_recv_elems"))
                check(sum(s["bytes"] for s in a2a) == 8 * a2a_elems, f"rank {r}: the all-to-all steps' bytes")
    # allgather: G, given or chosen, in the summary and the report; no ring traffic to report
    for given in (None, 1):
        with tempfile.TemporaryDirectory() as d:
            extra = ["--kv-head-group", given] if given else []
            p = ringattn(2, "run", "--seq", 16, "--heads", 4, "--kv-heads", 4, "--head-dim", 8, "--strategy",
                         "allgather", *extra, "--report", f"{d}/r.json")
            cfg = json.load(open(f"{d}/r.json"))["config"] if p.returncode == 0 else {}
            G = cfg.get("kv_head_group")
            check(p.returncode == 0 and isinstance(G, int) and 4 % G == 0 and (given is None or G == given)
                  and p.stdout.splitlines()[0].endswith(f"strategy allgather G={G}") and cfg.get("traffic") is None
                  and "memory per rank (largest): all-gather buffers" in p.stdout and "all-to-all" not in p.stdout,
                  f"allgather --kv-head-group {given}: exit {p.returncode}, config.kv_head_group {G}, "
                  f"traffic {cfg.get('traffic')!r}, summary {p.stdout.splitlines()[:1]}")


def test_seed_outputs_independent_of_n():
    with tempfile.TemporaryDirectory() as d:
        outs = []
        for n in (1, 2, 3):
            out = f"{d}/n{n}"
            p = ringattn(n, "run", "--seq", 41, "--batch", 2, "--heads", 4, "--kv-heads", 2, "--head-dim", 8,
                         "--dtype", "f64", "--causal", "--seed", 5, "--out", out)
            check(p.returncode == 0, f"N={n} exit 0 ({p.stderr.strip()})")
            outs.append(out)
            check(not [f for f in os.listdir(out) if f.startswith(".")], f"N={n} leaves no temporary files")
        for f in ("q", "k", "v", "dout"):
            same = all(open(f"{o}/{f}.npy", "rb").read() == open(f"{outs[0]}/{f}.npy", "rb").read() for o in outs)
            check(same, f"{f}.npy identical bytes for N=1,2,3")
        for f in ("o", "lse", "dq", "dk", "dv"):
            ref = np.load(f"{outs[0]}/{f}.npy")
            check(ref.dtype == np.float64, f"{f}.npy is float64")
            for o in outs[1:]:
                x = np.load(f"{o}/{f}.npy")
                err = np.max(np.abs(x - ref)) / np.max(np.abs(ref))
                check(x.shape == ref.shape and err <= 1e-12, f"{f} {o[-2:]} vs N=1: {err:.2e} <= 1e-12")


def test_overflowed_scores_are_nan():
    """Finite f64 inputs whose products overflow to -inf: the causal row 0 sees key 0 alone, with a
    score of -inf, so its softmax is NaN (O and its gradients NaN, LSE -inf), as torch's; --check
    agrees with the reference and every other row is finite."""
    B, S, H, D = 1, 24, 2, 8
    rng = np.random.default_rng(3)
    t = {n: rng.standard_normal((B, S, H, D)) for n in ("q", "k", "v", "dout")}
    t["q"] = np.abs(t["q"]) + 0.5
    t["k"][:, 0] = -(np.abs(t["k"][:, 0]) + 0.5) * 1e200
    t["q"] *= 1e200
    with tempfile.TemporaryDirectory() as d:
        for n, x in t.items():
            np.save(f"{d}/{n}.npy", x)
        p = ringattn(2, "run", "--inputs", d, "--causal", "--check", "--out", f"{d}/out")
        check(p.returncode == 0 and "PASSED" in p.stdout, f"--check passes (exit {p.returncode}: {p.stderr.strip()[-300:]})")
        if p.returncode != 0:
            return
        o, lse, dq = (np.load(f"{d}/out/{n}.npy") for n in ("o", "lse", "dq"))
        check(np.isnan(o[:, 0]).all() and np.isfinite(o[:, 1:]).all(), "O: NaN in row 0 alone")
        check((lse[:, :, 0] == -np.inf).all() and np.isfinite(lse[:, :, 1:]).all(), "LSE: -inf in row 0 alone")
        check(np.isnan(dq[:, 0]).all(), "dq: NaN in row 0")
        # a finite sink in head 1 takes row 0's whole weight there (O = 0, LSE = the sink)
        np.save(f"{d}/sinks.npy", np.array([-np.inf, 0.5]))
        p = ringattn(2, "run", "--inputs", d, "--causal", "--check", "--sinks", f"{d}/sinks.npy", "--out", f"{d}/out2")
        check(p.returncode == 0 and "PASSED" in p.stdout, f"with sinks -inf, 0.5: --check passes (exit {p.returncode})")
        if p.returncode == 0:
            o, lse = np.load(f"{d}/out2/o.npy"), np.load(f"{d}/out2/lse.npy")
            check(np.isnan(o[:, 0, 0]).all() and (o[:, 0, 1] == 0).all(), "sinks: row 0 NaN in head 0, 0 in head 1")
            check(lse[0, 0, 0] == -np.inf and lse[0, 1, 0] == 0.5, "sinks: LSE -inf in head 0, the sink in head 1")
    # a score that overflows to +inf (q0 = k0 = 1e200 in two components, which the other queries
    # leave at 0): row 0's softmax is NaN
    t = {n: rng.standard_normal((B, S, H, D)) for n in ("q", "k", "v", "dout")}
    t["q"][:, :, :, :2] = 0.0
    t["q"][:, 0, :, :2] = t["k"][:, 0, :, :2] = 1e200
    with tempfile.TemporaryDirectory() as d:
        for n, x in t.items():
            np.save(f"{d}/{n}.npy", x)
        p = ringattn(2, "run", "--inputs", d, "--causal", "--check", "--out", f"{d}/out")
        check(p.returncode == 0 and "PASSED" in p.stdout, f"+inf score: --check passes (exit {p.returncode})")
        if p.returncode == 0:
            check(np.isnan(np.load(f"{d}/out/o.npy")[:, 0]).all(), "+inf score: O NaN in row 0")
    # products of both signs that overflow meet in a NaN score: row 5's among finite scores, and
    # row 0's alone (it sees key 0 alone): both rows' softmax is NaN, and LSE too (torch.logsumexp
    # of a NaN)
    S = 64  # row 0's piece has 16 keys: more than one vector of float64 lanes
    t = {n: rng.standard_normal((B, S, H, D)) for n in ("q", "k", "v", "dout")}
    t["q"][:, :, :, :2] = 0.0
    for r in (0, 5):
        t["q"][:, r, :, :2] = 1e200
    t["k"][:, 0, :, 0], t["k"][:, 0, :, 1] = 1e200, -1e200
    with tempfile.TemporaryDirectory() as d:
        for n, x in t.items():
            np.save(f"{d}/{n}.npy", x)
        p = ringattn(2, "run", "--inputs", d, "--causal", "--check", "--out", f"{d}/out")
        check(p.returncode == 0 and "PASSED" in p.stdout, f"NaN score: --check passes (exit {p.returncode}: "
              f"{p.stdout.strip()[-300:]})")
        if p.returncode == 0:
            o, lse = np.load(f"{d}/out/o.npy"), np.load(f"{d}/out/lse.npy")
            rows = [i for i in range(S) if np.isnan(o[:, i]).any()]
            check(rows == [0, 5] and np.isnan(o[:, [0, 5]]).all(), f"NaN score: O NaN in rows 0 and 5 alone ({rows})")
            check(np.isnan(lse[:, :, [0, 5]]).all() and np.isfinite(np.delete(lse, [0, 5], axis=2)).all(),
                  "NaN score: LSE NaN in rows 0 and 5 alone")


def test_check_failure_exits_1():
    p = ringattn(2, "run", "--seq", 24, "--heads", 2, "--head-dim", 8, "--dtype", "f64", "--check",
                 "--debug-drop-grad-step", 1, "--traffic", "full")
    check(p.returncode == 1, f"a dropped gradient return makes --check exit 1 (got {p.returncode})")
    check("FAILED" in p.stdout, "summary says FAILED")


def test_bad_input_exits_2():
    with tempfile.TemporaryDirectory() as d:
        base = ["run", "--seq", 16, "--heads", 2, "--head-dim", 4]
        trunc = f"{d}/trunc"
        os.makedirs(trunc)
        for name, shape in (("q", (1, 16, 2, 4)), ("k", (1, 16, 2, 4)), ("v", (1, 16, 2, 4)), ("dout", (1, 16, 2, 4))):
            np.save(f"{trunc}/{name}.npy", np.zeros(shape, np.float32))
        with open(f"{trunc}/k.npy", "r+b") as f:
            f.truncate(100)
        afile = f"{d}/afile"
        open(afile, "w").close()
        np.save(f"{trunc}/sinks0.npy", np.zeros((0,), np.float32))  # in trunc/: d must end as it began
        cases = {
            "partition of wrong length": base + ["--partition", "8,8,0"],
            "partition of wrong sum": base + ["--partition", "8,9"],
            "negative partition": base + ["--partition", "17,-1"],
            "H not a multiple of HKV": base + ["--kv-heads", 3],
            "unknown layout": base + ["--layout", "diagonal"],
            "unknown dtype": base + ["--dtype", "int8"],
            "unknown option": base + ["--frobnicate"],
            "zero sequence": ["run", "--seq", 0],
            "window zero": base + ["--window", 0],
            "doc lens wrong sum": base + ["--doc-lens", "5,5"],
            "missing inputs dir": ["run", "--inputs", f"{d}/nope"],
            "truncated npy": ["run", "--inputs", trunc],
            "out is a file": base + ["--out", afile],
            "precision bf16 with f32 storage": base + ["--precision", "bf16"],
            "unknown precision": base + ["--dtype", "bf16", "--precision", "fp8"],
            "precision bf16 with --layer": ["run", "--layer", "--model-dim", 8, "--seq", 16, "--heads", 2,
                                            "--head-dim", 4, "--dtype", "bf16", "--precision", "bf16"],
            "precision for decode": ["decode", "--precision", "bf16"],
            "list option given twice": base + ["--partition", "8,8", "--partition", "8,8"],
            "flag with a value that is not a truth": base + ["--no-backward=maybe"],
            "integer with two signs": base + ["--seed", "+-5"],
            "sinks file of no values": base + ["--sinks", f"{trunc}/sinks0.npy"],
            "softcap whose base-2 value overflows float32": base + ["--softcap", "2.4e38"],
            "scale whose base-2 value overflows float32": base + ["--scale", "2.4e38"],
            "doc lens summing past 2^63": base + ["--causal", "--doc-lens", f"{2**63 - 1},{2**63 - 1},18"],
            "seq of 2^63 - 1": ["run", "--seq", 2**63 - 1, "--heads", 1, "--head-dim", 1, "--no-backward"],
        }
        # an empty path is an error, never "not given" (a shell variable that expanded to nothing)
        for opt in ("--inputs", "--out", "--report", "--trace", "--sinks"):
            cases[f"run {opt} ''"] = base + [opt, ""]
        for opt in ("--out", "--report"):
            cases[f"decode {opt} ''"] = ["decode", opt, ""]
        for opt in ("--inputs", "--report"):
            cases[f"lab {opt} ''"] = ["lab", opt, ""]
        for what, args in cases.items():
            p = ringattn(2, *args, timeout=60)
            # mpirun adds its own epilogue about the non-zero exit; ours is the ringattn line
            lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
            check(p.returncode == 2, f"{what}: exit 2 (got {p.returncode})")
            check(len(lines) == 1 and lines[0].startswith("ringattn: error:"),
                  f"{what}: one error line: {lines[:3]}")
        # zigzag on one rank: two chunks of ceil(S / 2) are more than S = 2^63 - 1 (and overflowed)
        p = ringattn(1, "run", "--seq", 2**63 - 1, "--heads", 1, "--head-dim", 1, "--causal", "--no-backward",
                     timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
        check(p.returncode == 2 and len(lines) == 1 and "--seq" in lines[0],
              f"causal S = 2^63 - 1 on one rank: exit 2 naming --seq ({p.returncode}: {lines[:2]})")
        check(sorted(os.listdir(d)) == ["afile", "trunc"], "no files left behind")


def test_balance_and_window():
    """The balance requirement, by counts (not time) on N=4: causal S=4096, H=2, D=32.

    The imbalance is max/mean of work.flops, which counts the work actually done. The worked example's block
    model 2N/(N+1) = 1.6 computes the diagonal block whole; computing only the visible pairs gives
    the triangle (2N-1)/N = 1.75. Partial tiles are computed as trimmed strips, so the measured
    value lies between the two, near the triangle."""
    N, S = 4, 4096
    common = ["--seq", S, "--heads", 2, "--head-dim", 32, "--dtype", "f32"]
    with tempfile.TemporaryDirectory() as d:
        def report(name, *extra):
            path = f"{d}/{name}.json"
            p = ringattn(N, "run", *common, *extra, "--report", path)
            check(p.returncode == 0, f"{name}: exit 0 ({p.stderr.strip()[-300:]})")
            return json.load(open(path)) if p.returncode == 0 else None

        def flops(r):
            return [rr["work"]["flops"] for rr in r["ranks"]]

        for layout in ("contiguous", "striped", "zigzag"):
            c, nc = report(f"{layout}_causal", "--layout", layout, "--causal"), report(f"{layout}_full", "--layout", layout)
            if not (c and nc):
                continue
            f = flops(c)
            imb = max(f) / (sum(f) / N)
            got = c["imbalance"]["flops_max_over_mean"]
            check(abs(got - imb) <= 1e-9 * imb, f"{layout}: report's imbalance {got:.4f} is max/mean of work.flops")
            if layout == "contiguous":
                check(2 * N / (N + 1) <= imb <= (2 * N - 1) / N, f"contiguous: imbalance {imb:.3f} within "
                      f"[2N/(N+1), (2N-1)/N] = [1.6, 1.75]")
            else:
                check(imb <= 1.05, f"{layout}: imbalance {imb:.3f} <= 1.05")
            ratio = sum(f) / sum(flops(nc))
            check(ratio <= 0.56, f"{layout}: causal flops {ratio:.4f} x the non-causal total <= 0.56")
        full = report("causal_ring", "--causal", "--traffic", "full")
        win = report("window64", "--causal", "--window", 64)
        if full and win:
            recv = lambda r: sum(rr["ledger"]["recv_bytes"] for rr in r["ranks"])
            check(recv(win) <= 0.4 * recv(full), f"--window 64: {recv(win)} bytes received <= 40% of the full "
                  f"causal ring's {recv(full)}")


def test_defaults_and_summary():
    """What a run does without being told, and what its summary says."""
    small = ["run", "--seq", 64, "--heads", 2, "--head-dim", 8]
    with tempfile.TemporaryDirectory() as d:
        def config(n, *extra):
            p = ringattn(n, *small, *extra, "--report", f"{d}/r.json")
            check(p.returncode == 0, f"{' '.join(map(str, extra))}: exit 0 ({p.stderr.strip()[-200:]})")
            return (json.load(open(f"{d}/r.json"))["config"] if p.returncode == 0 else {}), p.stdout
        for extra, layout in ((["--causal"], "zigzag"), (["--causal", "--window", 8], "contiguous"),
                              ([], "contiguous"), (["--causal", "--partition", "30,34"], "contiguous")):
            cfg, out = config(2, *extra)
            check(cfg.get("layout") == layout, f"layout auto with {extra}: {cfg.get('layout')} (expected {layout})")
            check(f"layout {layout}" in out, f"the summary names layout {layout}")
        cfg, _ = config(2)
        check(isinstance(cfg.get("timeout"), float) and cfg["timeout"] >= 300, f"the default watchdog is on: "
              f"{cfg.get('timeout')} s")
        cfg, _ = config(2, "--timeout", 0)
        check(cfg.get("timeout") == 0, "--timeout 0 turns it off")
        _, out = config(2, "--no-backward")
        loss = next((l.split("loss ")[1].split()[0] for l in out.splitlines() if "loss " in l), "0")
        check(loss not in ("0", "-") and float(loss) != 0, f"--no-backward reports the loss of its outputs: {loss}")
        _, out = config(2)
        check("block model" not in out, "no causal block model for a non-causal run")
        _, out = config(1, "--causal")
        check("block model" not in out, "no causal block model at N=1")
        _, out = config(2, "--causal", "--layout", "contiguous")
        check("block model" in out, "the causal block model for a causal run on contiguous shards at N=2")
        _, out = config(2, "--causal")
        check("block model" not in out, "no contiguous-shards block model for zigzag shards (auto, causal)")
    # integers are decimal however written (CLI11 alone reads "010" as 8 and refuses "08")
    for text, seq in (("010", 10), ("08", 8), ("+12", 12)):
        p = ringattn(1, "run", "--seq", text, "--heads", 1, "--head-dim", 8, "--iters", 1, "--warmup", 0)
        check(p.returncode == 0 and f" S={seq} " in p.stdout, f"--seq {text} runs S={seq} ({p.stdout[:120]}"
              f"{p.stderr.strip()[-120:]})")
    # a reference that vanishes (one key per row: dQ = 0) is judged against the output's magnitude
    p = ringattn(2, "run", "--seq", 1, "--heads", 2, "--head-dim", 8, "--check")
    check(p.returncode == 0 and "PASSED" in p.stdout, f"S=1: dq vanishes and the check passes ({p.stdout[-200:]})")


def test_simd_target():
    """RINGATTN_SIMD selects the kernels' SIMD target: the report and the summary name the target that
    ran, and the run still passes --check; a target the build or the CPU lacks is exit 2 on every rank."""
    small = ["run", "--seq", 80, "--heads", 2, "--kv-heads", 1, "--head-dim", 20, "--causal", "--check"]
    p = ringattn(2, *small, extra_env={"RINGATTN_SIMD": "NOSUCH"})
    # ringattn's lines: Open MPI 5's TCP transport may print words of its own first
    lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
    err = lines[0] if lines else ""
    check(p.returncode == 2 and len(lines) == 1 and "RINGATTN_SIMD=NOSUCH: not a SIMD target of this build" in err,
          f"an unknown target: exit 2 and one line ({p.returncode}: {lines[:2]})")
    built = err.split("expected one of ")[-1].rstrip(")").split(", ") if "expected one of " in err else []
    check("EMU128" in built, f"the build has the portable target EMU128 among {built}")
    runnable = []
    with tempfile.TemporaryDirectory() as d:
        def simd_of(extra_env):
            p = ringattn(2, *small, "--report", f"{d}/r.json", extra_env=extra_env)
            if p.returncode != 0:
                return p, None, None
            return p, json.load(open(f"{d}/r.json")), p.stdout
        for t in built:
            p, rep, out = simd_of({"RINGATTN_SIMD": t})
            if rep is None:
                check(p.returncode == 2 and f"this CPU cannot run {t}" in p.stderr,
                      f"{t}: not runnable here, exit 2 ({p.returncode}: {p.stderr.strip()[:200]})")
                continue
            runnable.append(t)
            check(rep["config"]["simd"] == t, f"RINGATTN_SIMD={t}: config.simd {rep['config']['simd']}")
            check(f"kernels {t}" in out.splitlines()[0], f"the summary names {t}: {out.splitlines()[0]}")
            check(rep["check"]["passed"] is True, f"{t}: --check passes ({rep['check']['max_rel_err']})")
        check("EMU128" in runnable, f"EMU128 runs everywhere: runnable {runnable}")
        _, rep, _ = simd_of({})
        best = rep["config"]["simd"] if rep else None
        check(bool(runnable) and best == runnable[0], f"without RINGATTN_SIMD the best target runs: {best} "
              f"(runnable, best first: {runnable})")


def test_bf16_bytes():
    """A bf16 run moves K/V at 2 bytes and gradient returns at 4: recv_bytes = 2 x (forward + replay
    K/V elements) + 4 x gradient elements on every rank, the forward's K/V bytes are what
    `plan --bytes 2` counts, and its memory budget is at most 0.8x the f32 run's."""
    shape = ["--seq", 64, "--heads", 4, "--kv-heads", 2, "--head-dim", 16]
    with tempfile.TemporaryDirectory() as d:
        reps = {}
        for dt in ("bf16", "f32"):
            p = ringattn(4, "run", *shape, "--dtype", dt, "--check", "--report", f"{d}/{dt}.json")
            check(p.returncode == 0, f"{dt} run at N=4 passes --check (exit {p.returncode}: {p.stderr[-300:]})")
            reps[dt] = json.load(open(f"{d}/{dt}.json")) if p.returncode == 0 else None
        if not all(reps.values()):
            return
        plan = json.loads(run([ARGS.binary, "plan", "--json", "--ranks", 4, "--bytes", 2, *shape]).stdout)
        for r in reps["bf16"]["ranks"]:
            led = r["ledger"]
            kv = led["fwd_kv_recv_elems"] + led["replay_kv_recv_elems"]
            want = 2 * kv + 4 * led["grad_recv_elems"]
            check(led["recv_bytes"] == want, f"rank {r['rank']}: recv_bytes {led['recv_bytes']} == 2*{kv} + "
                  f"4*{led['grad_recv_elems']} = {want}")
            sent = 2 * (led["fwd_kv_send_elems"] + led["replay_kv_send_elems"]) + 4 * led["grad_send_elems"]
            check(led["send_bytes"] == sent, f"rank {r['rank']}: send_bytes {led['send_bytes']} == {sent}")
            check(2 * led["fwd_kv_recv_elems"] == plan["recv_bytes"],
                  f"rank {r['rank']}: forward K/V bytes {2 * led['fwd_kv_recv_elems']} == plan --bytes 2's "
                  f"{plan['recv_bytes']}")
        check(reps["bf16"]["config"]["dtype"] == "bf16", f"config.dtype {reps['bf16']['config']['dtype']}")
        # precision bf16: the same bytes, named in the report, and within --check's tolerance
        p = ringattn(4, "run", *shape, "--dtype", "bf16", "--precision", "bf16", "--causal", "--check", "--report",
                     f"{d}/prec.json")
        check(p.returncode == 0, f"--precision bf16 at N=4 passes --check (exit {p.returncode}: {p.stderr[-300:]})")
        if p.returncode == 0:
            check(json.load(open(f"{d}/prec.json"))["config"]["precision"] == "bf16", "config.precision bf16")
        # The memory: at a shape where the shards, not the fixed tile scratch, are what a rank holds.
        big = ["--seq", 4096, "--heads", 4, "--kv-heads", 2, "--head-dim", 64, "--causal", "--iters", 1, "--warmup", 0]
        for dt in ("bf16", "f32"):
            p = ringattn(2, "run", *big, "--dtype", dt, "--report", f"{d}/{dt}.json")
            check(p.returncode == 0, f"{dt} run at S=4096, N=2 (exit {p.returncode}: {p.stderr[-300:]})")
            reps[dt] = json.load(open(f"{d}/{dt}.json")) if p.returncode == 0 else None
        if not all(reps.values()):
            return
        for a, b in zip(reps["bf16"]["ranks"], reps["f32"]["ranks"]):
            ratio = a["memory"]["budget_bytes"] / b["memory"]["budget_bytes"]
            check(ratio <= 0.8, f"rank {a['rank']}: bf16 budget {a['memory']['budget_bytes']} is {ratio:.3f} of "
                  f"f32's {b['memory']['budget_bytes']} (at most 0.8)")


def test_help_defaults():
    """Every default `run --help` states is the value the job uses: the help is read, not trusted."""
    import re
    p = run([ARGS.binary, "run", "--help"])
    check(p.returncode == 0, f"run --help: exit 0 ({p.returncode})")
    stated = {m.group(1): m.group(2) for m in re.finditer(r"^\s*(--[a-z-]+)\b[^(\n]*\(default:? ([^),;]+)",
                                                                p.stdout, re.M)}
    print(stated)
    for opt in ("--seq", "--batch", "--heads", "--head-dim", "--dtype", "--layout", "--seed", "--warmup", "--iters",
                "--tile-q", "--tile-k", "--tile-strip"):
        check(opt in stated, f"{opt} states its default")
    with tempfile.TemporaryDirectory() as d:
        p = ringattn(1, "run", "--no-backward", "--report", f"{d}/r.json")
        check(p.returncode == 0, f"a run with every default: exit 0 ({p.stderr.strip()[-200:]})")
        cfg = json.load(open(f"{d}/r.json"))["config"] if p.returncode == 0 else {}
        used = {"--seq": cfg.get("seq"), "--batch": cfg.get("batch"), "--heads": cfg.get("heads"),
                "--head-dim": cfg.get("head_dim"), "--dtype": cfg.get("dtype"), "--seed": cfg.get("seed"),
                "--warmup": cfg.get("warmup"), "--iters": cfg.get("iters")}
        for opt, value in used.items():
            check(stated.get(opt, "").split()[0] == str(value), f"{opt}: help says {stated.get(opt)}, the job used {value}")
        check(cfg.get("kv_heads") == cfg.get("heads"), f"--kv-heads defaults to H: {cfg.get('kv_heads')}")
        check(cfg.get("layout") == "contiguous" and stated.get("--layout", "").startswith("auto"),
              f"--layout auto: contiguous without a causal mask ({cfg.get('layout')})")
        check(abs(cfg.get("scale", 0) - cfg.get("head_dim", 1) ** -0.5) < 1e-15, "--scale defaults to 1/sqrt(D)")
        check(cfg.get("traffic") == "aware", f"--traffic defaults to aware ({cfg.get('traffic')})")
        # Tiles: 0 means the SIMD target's own, which the report names, and giving them explicitly
        # changes nothing. Strips are 32 rows unless given (0: none).
        tiles = [cfg.get("tile_q"), cfg.get("tile_k"), cfg.get("tile_strip")]
        for opt in ("--tile-q", "--tile-k"):
            check(stated.get(opt, "").startswith("0: the SIMD target's own"), f"{opt}: {stated.get(opt)}")
        check(stated.get("--tile-strip", "").split()[0] == str(tiles[2]),
              f"--tile-strip: help says {stated.get('--tile-strip')}, the job used {tiles[2]}")
        check(all(isinstance(t, int) and t > 0 for t in tiles), f"the target's tiles are reported: {tiles}")
        p = ringattn(1, "run", "--no-backward", "--tile-q", tiles[0], "--tile-k", tiles[1], "--tile-strip", tiles[2],
                     "--report", f"{d}/r2.json")
        cfg2 = json.load(open(f"{d}/r2.json"))["config"] if p.returncode == 0 else {}
        check([cfg2.get("tile_q"), cfg2.get("tile_k"), cfg2.get("tile_strip")] == tiles,
              f"the reported tiles given explicitly are the same tiles: {cfg2.get('tile_q')} {cfg2.get('tile_k')}")


if __name__ == "__main__":
    sys.exit(main(globals()))
