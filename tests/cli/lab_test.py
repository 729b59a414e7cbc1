#!/usr/bin/python3
"""End-to-end checks of `ringattn lab`, the two-rank, five-position worked example, one named test per invocation.

    lab_test.py NAME --binary PATH [--mpirun EXE]

Each test runs real mpirun jobs and exits 0 when every assertion holds, 1 otherwise.
The expected numbers are the worked example's (five positions, D=2, float64, causal, rank 0 owns 0,1 and
rank 1 owns 2,3,4): K and V of one position are 4 elements of 8 B.
"""
import json
import math
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, main, run  # noqa: E402

ARGS = None  # set by harness.main

# The worked example's fixed tensors, [S, D] (B = H = HKV = 1).
EXAMPLE_Q = [[0.9, -0.3], [0.2, 0.8], [-0.5, 0.4], [0.7, 0.6], [-0.1, -0.9]]
EXAMPLE_K = [[0.5, 0.1], [-0.4, 0.7], [0.3, -0.6], [0.8, 0.2], [-0.2, -0.5]]
EXAMPLE_V = [[1.0, 0.0], [0.0, 1.0], [0.5, -0.5], [-1.0, 0.5], [0.2, 0.8]]
# The worked example's ledger (rank 0, rank 1): elements that moved, per pass and direction, and memory.
EXAMPLE_LEDGER = [
    {"fwd_kv_send_elems": 8, "replay_kv_send_elems": 8, "grad_send_elems": 12,
     "fwd_kv_recv_elems": 12, "replay_kv_recv_elems": 12, "grad_recv_elems": 8,
     "send_bytes": 224, "recv_bytes": 256,
     "resident_qkv_elems": 12, "remote_block_elems": 12, "online_state_elems": 8},
    {"fwd_kv_send_elems": 12, "replay_kv_send_elems": 12, "grad_send_elems": 8,
     "fwd_kv_recv_elems": 8, "replay_kv_recv_elems": 8, "grad_recv_elems": 12,
     "send_bytes": 256, "recv_bytes": 224,
     "resident_qkv_elems": 18, "remote_block_elems": 8, "online_state_elems": 12},
]
EXACT = 1e-14  # five positions of O(1) values: a few ulps of f64
TABLES = ["ringattn lab: the two-rank, five-position worked example", "events (in step order",
          "final outputs and gradients per position", "ledger per rank"]
RUN_CONFIG_KEYS = ["seq", "batch", "heads", "kv_heads", "head_dim", "dtype", "causal", "window", "doc_lens", "layout",
                   "partition", "scale", "seed", "inputs", "out", "check", "report", "warmup", "iters", "trace",
                   "timeout", "traffic"]


def ringattn(n, *args, timeout=120):
    return run([ARGS.mpirun, "-np", n, ARGS.binary, *args], timeout=timeout)


def lab(n, *args):
    """Runs lab with --report; returns (process, report or None)."""
    with tempfile.TemporaryDirectory() as d:
        p = ringattn(n, "lab", *args, "--report", f"{d}/r.json")
        rep = json.load(open(f"{d}/r.json")) if os.path.exists(f"{d}/r.json") else None
    print(p.stdout)
    return p, rep


def check_exact(rep, what):
    errs = rep["check"]["max_rel_err"]
    for k in ("o", "lse", "dq", "dk", "dv"):
        check(errs[k] is not None and errs[k] <= EXACT, f"{what}: max rel err {k} = {errs[k]} <= {EXACT}")
    check(rep["check"]["passed"] is True, f"{what}: check.passed")


def table(stdout, title):
    """The rows of the table printed under the line starting with `title`, as dicts by column name
    (columns start where their header names start; the line of dashes follows the header)."""
    lines = stdout.splitlines()
    at = next((n for n, line in enumerate(lines) if line.startswith(title)), None)
    if at is None or at + 2 >= len(lines):
        return []
    cols = [(m.group(), m.start()) for m in re.finditer(r"\S+(?: \S+)*", lines[at + 1])]
    rows = []
    for line in lines[at + 3:]:
        if not line.strip():
            break
        rows.append({name: line[start:(cols[c + 1][1] if c + 1 < len(cols) else None)].strip()
                     for c, (name, start) in enumerate(cols)})
    return rows


def vector(cell):
    return [float(x) for x in cell.strip("[]").split(",")]


def forward_rows(stdout):
    """The forward rows of the event table: (rank, step, object, head, position, m, l, a/l or None)."""
    out, lead = [], {}
    for row in table(stdout, "events (in step order"):
        if row["#"]:
            lead = row
        if lead.get("pass") != "fwd" or not re.fullmatch(r"(b\d+ )?(h\d+ )?q\d+", row["row"]):
            continue  # not a forward row, or a rank without query rows
        label = row["row"].split()
        head = next((int(t[1:]) for t in label if t.startswith("h")), 0)
        prefix = row["prefix output a/l / dV"]
        out.append((int(lead["rank"][1:]), int(lead["step"]), lead["object"], head, int(label[-1][1:]),
                    float(row["running max m / dK"]), float(row["exp-sum l"]),
                    None if prefix == "(no key yet)" else vector(prefix)))
    return out


PRINTED = 1e-6  # the table prints 6 decimals


def check_running_state(what, stdout, q, k, v, partition, causal=True):
    """Every forward row of the event table against the softmax over the keys folded so far, computed
    here: after step t rank r has folded the blocks of ranks r, r-1, ..., r-t (mod N); m = max_j S_ij,
    l = sum_j exp(S_ij - m) in natural units (S_ij = q_i . k_j / sqrt(D)), a/l the prefix output.
    q [S, H, D] or [S, D]; k, v [S, HKV, D] or [S, D] (B = 1)."""
    q, k, v = ([[x] if isinstance(x[0], float) else x for x in t] for t in (q, k, v))
    N, S, H, D = len(partition), len(q), len(q[0]), len(q[0][0])
    group = H // len(k[0])
    first = [sum(partition[:r]) for r in range(N)]
    rows = forward_rows(stdout)
    check(len(rows) == N * S * H, f"{what}: {N * S * H} forward rows in the event table (got {len(rows)})")
    bad = []
    for rank, step, obj, h, i, m, l, prefix in rows:
        owner = (rank - step) % N
        if not obj.startswith(f"K/V of r{owner} "):
            bad.append(f"r{rank} step {step}: block '{obj}' (expected r{owner}'s)")
        blocks = [(rank - s) % N for s in range(step + 1)]
        keys = [j for o in blocks for j in range(first[o], first[o] + partition[o]) if not causal or j <= i]
        scores = [sum(a * b for a, b in zip(q[i][h], k[j][h // group])) / math.sqrt(D) for j in keys]
        want_m = max(scores, default=-math.inf)
        p = [math.exp(x - want_m) for x in scores]
        want_l = sum(p)
        want_o = [sum(pj * v[j][h // group][d] for pj, j in zip(p, keys)) / want_l for d in range(D)] if keys else None
        if keys:
            ok = abs(m - want_m) <= PRINTED and abs(l - want_l) <= PRINTED and prefix is not None and all(
                abs(x - y) <= PRINTED for x, y in zip(prefix, want_o))
        else:  # no key yet: the initial state
            ok = m == -math.inf and l == 0 and prefix is None
        if not ok:
            bad.append(f"r{rank} step {step} h{h} q{i}: m, l, a/l = {m}, {l}, {prefix} "
                       f"(expected {want_m:+.6f}, {want_l:+.6f}, {want_o})")
    check(rows and not bad, f"{what}: running max m, exp-sum l and a/l of every forward row are the softmax's own "
                            f"in natural units over the keys folded so far {bad[:4]}")


def test_worked_example():
    p, rep = lab(2)
    check(p.returncode == 0, f"exit 0 (got {p.returncode}: {p.stderr.strip()})")
    inputs = table(p.stdout, "inputs (global positions")
    check([(vector(r["q"]), vector(r["k"]), vector(r["v"])) for r in inputs]
          == list(zip(EXAMPLE_Q, EXAMPLE_K, EXAMPLE_V)), "the inputs table shows the worked example's fixed tensors")
    # The first rows by hand, S_ij = q_i . k_j / sqrt(2): q0.k0 = 0.9*0.5 - 0.3*0.1 = 0.42; q1.k0 = 0.2*0.5 + 0.8*0.1
    # = 0.18, q1.k1 = -0.2*0.4 + 0.8*0.7 = 0.48; q2.k2 = -0.5*0.3 - 0.4*0.6 = -0.39; q2.k0 = -0.21, q2.k1 = 0.48.
    # A running max in log2 units would be log2 e times m (+0.428459 for q0 after k0).
    e030, e069, e087 = (math.exp(-x / math.sqrt(2)) for x in (0.30, 0.69, 0.87))
    by_hand = {  # (rank, step, position): m = max_j S_ij, l = sum_j exp(S_ij - m), a/l
        (0, 0, 0): (0.42 / math.sqrt(2), 1.0, [1.0, 0.0]),  # q0 after k0: m = +0.296985
        (0, 0, 1): (0.48 / math.sqrt(2), 1 + e030, [e030 / (1 + e030), 1 / (1 + e030)]),  # q1 after k0, k1
        (1, 0, 2): (-0.39 / math.sqrt(2), 1.0, [0.5, -0.5]),  # q2 after its own k2
        (1, 1, 2): (0.48 / math.sqrt(2), 1 + e069 + e087,  # q2 after k0, k1 too
                    [(e069 + 0.5 * e087) / (1 + e069 + e087), (1 - 0.5 * e087) / (1 + e069 + e087)]),
    }
    check(abs(by_hand[(0, 0, 0)][0] - 0.296985) <= PRINTED, "q0 after k0: m = 0.42/sqrt(2) = +0.296985")
    got = {(r[0], r[1], r[4]): r[5:] for r in forward_rows(p.stdout)}
    for key, (m, l, o) in by_hand.items():
        g = got.get(key)
        check(g is not None and abs(g[0] - m) <= PRINTED and abs(g[1] - l) <= PRINTED and g[2] is not None
              and all(abs(x - y) <= PRINTED for x, y in zip(g[2], o)),
              f"r{key[0]} step {key[1]} q{key[2]}: m, l, a/l = {g} (by hand {m:+.6f}, {l:+.6f}, {o})")
    check_running_state("worked example", p.stdout, EXAMPLE_Q, EXAMPLE_K, EXAMPLE_V, [2, 3])
    for t in TABLES:
        check(t in p.stdout, f"table '{t}' printed")
    check(rep is not None, "report written")
    if rep is None:
        return
    for k in ("config", "loss", "time", "check", "ranks"):
        check(k in rep, f"top-level field {k}")
    for k in RUN_CONFIG_KEYS:
        check(k in rep["config"], f"config.{k}")
    check(rep["config"]["partition"] == [2, 3] and rep["config"]["causal"] is True
          and rep["config"]["traffic"] == "full", "config: partition 2,3, causal, traffic full")
    check_exact(rep, "worked example")
    check(len(rep["ranks"]) == 2, "one entry per rank")
    for r, want in enumerate(EXAMPLE_LEDGER):
        rr = rep["ranks"][r]
        check(rr["rank"] == r and rr["positions"] == [2, 3][r], f"rank {r} positions")
        for k, v in want.items():
            check(rr["ledger"].get(k) == v, f"rank {r} ledger.{k} = {rr['ledger'].get(k)} (worked example: {v})")
        for k in ("forward_s", "backward_s", "compute_s", "wait_s"):
            check(isinstance(rr["time"].get(k), float) and rr["time"][k] >= 0, f"rank {r} time.{k}")
        check(rr["work"]["tile_pairs"] > 0, f"rank {r} did work")
    # Every event of the worked example's protocol: 4 forward reads, 4 replays, 2 returns sent and 2 received.
    section = p.stdout.split("events (in step order")[-1].split("final outputs")[0]
    events = [l for l in section.splitlines() if l[:6].strip().isdigit()]
    check(len(events) == 12, f"12 events in the table (got {len(events)})")
    check(sum("return dK/dV" in l for l in events) == 2 and sum("receive dK/dV" in l for l in events) == 2,
          "two gradient returns sent and received")




def test_skip_empty_saves_bytes():
    p, rep = lab(2, "--skip-empty")
    check(p.returncode == 0, f"exit 0 (got {p.returncode}: {p.stderr.strip()})")
    check(rep is not None, "report written")
    if rep is None:
        return
    check(rep["config"]["traffic"] == "skip-empty", "config.traffic skip-empty")
    check_exact(rep, "skip-empty")
    full = sum(w["send_bytes"] for w in EXAMPLE_LEDGER)
    sent = sum(r["ledger"]["send_bytes"] for r in rep["ranks"])
    # Under causal, rank 0's queries see none of rank 1's keys: its 12-element return is all zero.
    check(full - sent == 96, f"96 B saved versus full ({full} - {sent} = {full - sent})")
    check(rep["ranks"][0]["ledger"]["grad_send_elems"] == 0, "rank 0 returns nothing")
    check(rep["ranks"][1]["ledger"]["grad_send_elems"] == 8, "rank 1 still returns its 8 elements")
    check("96 B saved" in p.stdout, "the saving is printed")
    check_running_state("skip-empty", p.stdout, EXAMPLE_Q, EXAMPLE_K, EXAMPLE_V, [2, 3])


def test_wrong_rank_count_exits_2():
    for n, args, what in ((3, [], "N=3 with the worked example's two owners"),
                          (1, [], "N=1 with the worked example's two owners"),
                          (2, ["--partition", "1,1,3"], "three sizes on two ranks"),
                          (2, ["--partition", "1,3"], "sizes summing to 4, not S=5"),
                          (2, ["--partition", "2", "--partition", "3"], "a list given twice"),
                          (2, ["--no-causal=abc"], "a flag's value that is not a truth")):
        p = ringattn(n, "lab", *args)
        lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
        check(p.returncode == 2, f"{what}: exit 2 (got {p.returncode})")
        check(len(lines) == 1 and lines[0].startswith("ringattn: error:"), f"{what}: one error line: {lines[:3]}")
        check("events" not in p.stdout, f"{what}: no table printed")


def test_explore_options():
    p, causal = lab(2)  # the worked example as it stands, what the options are compared with
    check(p.returncode == 0 and causal is not None, f"worked example: exit 0 ({p.stderr.strip()})")
    if causal is not None:
        check_exact(causal, "worked example")
        check(causal["config"]["causal"] is True, "worked example: config.causal true")
    check_running_state("worked example", p.stdout, EXAMPLE_Q, EXAMPLE_K, EXAMPLE_V, [2, 3])
    p, rep = lab(2, "--no-causal")
    check(p.returncode == 0 and rep is not None, f"--no-causal: exit 0 ({p.stderr.strip()})")
    check_running_state("--no-causal", p.stdout, EXAMPLE_Q, EXAMPLE_K, EXAMPLE_V, [2, 3], causal=False)
    if rep is None or causal is None:
        return
    check_exact(rep, "--no-causal")
    check(rep["config"]["causal"] is False, "--no-causal: config.causal false")
    check(abs(rep["loss"] - causal["loss"]) > 1e-6, "--no-causal changes the loss")
    # The full protocol moves every block whatever the mask.
    for r, want in enumerate(EXAMPLE_LEDGER):
        check(rep["ranks"][r]["ledger"]["send_bytes"] == want["send_bytes"],
              f"--no-causal: rank {r} bytes as the worked example")
    for part, n in (("3,2", 2), ("0,5", 2), ("2,0,3", 3), ("5", 1)):
        p, rep = lab(n, "--partition", part)
        check(p.returncode == 0 and rep is not None, f"--partition {part} on N={n}: exit 0 ({p.stderr.strip()})")
        sizes = [int(x) for x in part.split(",")]
        check_running_state(f"--partition {part}", p.stdout, EXAMPLE_Q, EXAMPLE_K, EXAMPLE_V, sizes)
        if rep is not None:
            check_exact(rep, f"--partition {part}")
            check([r["positions"] for r in rep["ranks"]] == sizes, f"--partition {part}: positions per rank")


def test_inputs_match_numpy():
    import numpy as np
    rng = np.random.default_rng(3)
    B, S, H, HKV, D = 1, 7, 2, 1, 3
    t = {"q": rng.standard_normal((B, S, H, D)), "k": rng.standard_normal((B, S, HKV, D)),
         "v": rng.standard_normal((B, S, HKV, D)), "dout": rng.standard_normal((B, S, H, D))}
    # Independent float64 reference of the loss sum(dout * O), causal, GQA by repeat_interleave.
    k = np.repeat(t["k"], H // HKV, axis=2)
    v = np.repeat(t["v"], H // HKV, axis=2)
    s = np.einsum("bihd,bjhd->bhij", t["q"], k) / np.sqrt(D)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", p, v)
    loss = float(np.sum(t["dout"] * o))
    with tempfile.TemporaryDirectory() as d:
        for name, x in t.items():
            np.save(f"{d}/{name}.npy", x)
        proc, rep = lab(2, "--inputs", d, "--partition", "3,4")
    check(proc.returncode == 0 and rep is not None, f"--inputs: exit 0 ({proc.stderr.strip()})")
    check_running_state("--inputs", proc.stdout, t["q"][0].tolist(), t["k"][0].tolist(), t["v"][0].tolist(), [3, 4])
    if rep is None:
        return
    check_exact(rep, "--inputs")
    check(abs(rep["loss"] - loss) <= 1e-12 * max(1.0, abs(loss)), f"loss {rep['loss']} = numpy {loss}")
    check(rep["config"]["heads"] == H and rep["config"]["kv_heads"] == HKV and rep["config"]["seq"] == S,
          "shape from the files")


def test_layer():
    """`lab --layer`: the layer around the worked example's ring, checked against numpy autograd-free math:
    q, k, v = X Wq, X Wk, X Wv; causal attention; Y = O Wo; the backward by hand; and the
    weight gradients summed (not averaged) over the two ranks, identical on both."""
    import numpy as np
    proc, rep = lab(2, "--layer")
    check(proc.returncode == 0 and rep is not None, f"--layer: exit 0 ({proc.stderr.strip()})")
    if rep is None:
        return
    for title in TABLES + ["layer weights", "layer per position", "weight gradients: each rank's partial"]:
        check(title in proc.stdout, f"prints '{title}'")
    # the backward of the ring is in the event table too (replays and gradient returns), as without --layer
    for event in ("attend block", "replay block", "return dK/dV", "receive dK/dV"):
        check(event in proc.stdout, f"the event table shows '{event}'")
    ly = rep.get("layer", {})
    check(rep["config"].get("layer") is True and ly.get("model_dim") == 2, "config says layer, M=2")
    i = {k: np.array(v, dtype=np.float64) for k, v in ly.get("inputs", {}).items()}
    if set(i) != {"x", "wq", "wk", "wv", "wo", "dy"}:
        check(False, f"report carries the layer's inputs ({sorted(i)})")
        return
    S, M, D = 5, 2, 2
    x, dy = i["x"].reshape(S, M), i["dy"].reshape(S, M)
    wq, wk, wv, wo = (i[k].reshape(2, 2) for k in ("wq", "wk", "wv", "wo"))
    q, k, v = x @ wq, x @ wk, x @ wv
    check_running_state("--layer", proc.stdout, q.tolist(), k.tolist(), v.tolist(), [2, 3])
    s = q @ k.T / np.sqrt(D)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    y = o @ wo
    do = dy @ wo.T
    dp = do @ v.T
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(D)
    dq, dk, dv = ds @ k, ds.T @ q, p.T @ do
    want = {"y": y, "dx": dq @ wq.T + dk @ wk.T + dv @ wv.T, "dwq": x.T @ dq, "dwk": x.T @ dk, "dwv": x.T @ dv,
            "dwo": o.T @ dy}
    out = ly.get("outputs", {})
    for name, w in want.items():
        got = np.array(out.get(name, []), dtype=np.float64)
        ok = got.size == w.size and np.max(np.abs(got - w.ravel())) <= EXACT * max(1.0, np.max(np.abs(w)))
        check(ok, f"{name} matches numpy (max |diff| "
                  f"{np.max(np.abs(got - w.ravel())) if got.size == w.size else 'shape mismatch'})")
    # averaging instead of summing would give half: make sure the numbers could tell
    check(np.max(np.abs(want["dwq"])) > 10 * EXACT, "dWq is not ~0 (a halved sum would be caught)")
    check(ly.get("same_bits_on_every_rank") is True, "summed weight gradients are the same bits on both ranks")
    check(rep["check"]["passed"] is True, "the lab's own check passed")
    # all-reduce ledger: reduce-scatter then all-gather of dWo (4 elems) and [dWq|dWk|dWv] (12).
    # With N=2 a rank sends the other's segment (n - own), then its own summed segment: n each.
    want_send = 4 + 12
    for r, rr in enumerate(rep["ranks"]):
        led = rr["ledger"]
        check(led.get("allreduce_send_elems") == want_send and led.get("allreduce_recv_elems") == want_send,
              f"rank {r}: all-reduce sent/received {led.get('allreduce_send_elems')}/"
              f"{led.get('allreduce_recv_elems')} elems = {want_send}")
        check(led["send_bytes"] == EXAMPLE_LEDGER[r]["send_bytes"], f"rank {r}: ring bytes are the worked example's")
    p2 = ringattn(2, "lab", "--layer", "--inputs", "/nonexistent")
    check(p2.returncode == 2 and "--inputs" in p2.stderr, "--layer with --inputs: exit 2 naming --inputs")


if __name__ == "__main__":
    sys.exit(main(globals()))
