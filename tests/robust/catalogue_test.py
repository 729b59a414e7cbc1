#!/usr/bin/python3
"""Catalogue of malformed inputs and options for `ringattn run`.

    catalogue_test.py --binary PATH [--mpirun EXE] [--jobs 2] [--only NAME ...] [--list]

Every case builds its own files in a fresh directory, runs `mpirun -q -np N ringattn run ...`
and asserts that
  - the job exits 2 (bad input or usage),
  - ringattn wrote exactly one line to stderr, starting "ringattn: error:", that names the file
    or option at fault (each case lists the words the line must contain),
  - the case directory is exactly as before the run: nothing in --out (which every case that can
    passes, pre-created and empty), no partial or temporary file anywhere,
  - it finished within 30 s (the process group is killed past that, and the case fails).
Each rank's address space is capped (RLIMIT_AS, 4 GiB; --address-space-gib) so a size check that
is missing shows up as a failed allocation instead of taking the machine's memory.
Exits 0 when every case passes, 1 otherwise.
"""
import argparse
import concurrent.futures
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import env, quiet_mpirun  # noqa: E402

CASE_TIMEOUT_S = 30
RANK_ADDRESS_SPACE = 4 << 30

# The shape every valid input set has: B=1, S=16, H=2, HKV=2, D=4 (q, dout [B,S,H,D]; k, v [B,S,HKV,D]).
B, S, H, HKV, D = 1, 16, 2, 2, 4
SMALL = ["--seq", S, "--heads", H, "--head-dim", D]


# --- file builders -------------------------------------------------------------------------------

def npy_bytes(descr, shape, fortran=False, data=b"", version=1):
    """A .npy file as numpy writes it, but with any descr/shape/order we like."""
    shape_txt = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", shape_txt)
    return raw_npy(d, data, version)


def raw_npy(dict_text, data=b"", version=1):
    """Magic, version, header length, `dict_text` padded to 64 bytes with '\\n', then data."""
    prefix = 8 + (2 if version == 1 else 4)
    pad = 64 - (prefix + len(dict_text) + 1) % 64
    header = (dict_text + " " * pad + "\n").encode("latin1")
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header + data


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def valid_inputs(d, dtype=np.float32, seed=0):
    """q k v dout for the SMALL shape in d/in; returns the directory."""
    rng = np.random.default_rng(seed)
    inp = os.path.join(d, "in")
    os.makedirs(inp)
    for name, shape in (("q", (B, S, H, D)), ("k", (B, S, HKV, D)), ("v", (B, S, HKV, D)), ("dout", (B, S, H, D))):
        np.save(os.path.join(inp, name + ".npy"), rng.standard_normal(shape).astype(dtype))
    return inp


def inputs_with(mutate, dtype=np.float32):
    """A setup: valid inputs, then mutate(inputs_dir). The case passes --inputs {in}."""
    def setup(d):
        mutate(valid_inputs(d, dtype))
    return setup


def replace(name, data):
    return inputs_with(lambda inp: write(os.path.join(inp, name), data))


def edit_bytes(name, fn):
    def mutate(inp):
        p = os.path.join(inp, name)
        with open(p, "rb") as f:
            b = f.read()
        write(p, fn(b))
    return inputs_with(mutate)


def set_value(name, index, value, dtype=np.float32):
    def mutate(inp):
        p = os.path.join(inp, name)
        x = np.load(p)
        x[index] = value
        np.save(p, x)
    return inputs_with(mutate, dtype)


def resave(name, fn):
    def mutate(inp):
        p = os.path.join(inp, name)
        np.save(p, fn(np.load(p)))
    return inputs_with(mutate)


def remove(name):
    return inputs_with(lambda inp: os.remove(os.path.join(inp, name)))


def make_special(name, make):
    """Replace the file by what make(path) creates there (a directory, a FIFO)."""
    def mutate(inp):
        os.remove(os.path.join(inp, name))
        make(os.path.join(inp, name))
    return inputs_with(mutate)


def ones(**shapes):
    """Valid inputs, then the named files replaced by f32 ones of the given shapes."""
    def mutate(inp):
        for name, shape in shapes.items():
            np.save(os.path.join(inp, name + ".npy"), np.ones(shape, np.float32))
    return inputs_with(mutate)


def a_file(d):
    write(os.path.join(d, "afile"), b"not a directory\n")


def huge_sparse_inputs(d):
    """Inputs whose headers and sizes agree on B=1 S=2**26 H=64 HKV=8 D=128 f32: q and dout are
    2 TiB each, k and v 256 GiB, all sparse on disk (holes read as zeros). Valid files, but a
    rank's shard cannot be held in memory."""
    inp = os.path.join(d, "in")
    os.makedirs(inp)
    for name, heads in (("q", 64), ("k", 8), ("v", 8), ("dout", 64)):
        shape = (1, 1 << 26, heads, 128)
        header = npy_bytes("<f4", shape)
        with open(os.path.join(inp, name + ".npy"), "wb") as f:
            f.write(header)
            f.truncate(len(header) + 4 * int(np.prod(shape, dtype=np.int64)))


# --- the catalogue -------------------------------------------------------------------------------

class Case:
    def __init__(self, name, args, words, setup=None, np_=2, out=True):
        self.name, self.args, self.setup, self.np, self.out = name, args, setup, np_, out
        self.words = words  # the error line must contain each entry (a tuple: any one of it)


INPUTS = ["--inputs", "{in}"]
QKV_HEADER = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 16, 2, 4), }"

CASES = [
    # npy files: missing or truncated
    Case("npy_missing_file", INPUTS, ["k.npy"], remove("k.npy")),
    Case("inputs_dir_missing", ["--inputs", "{d}/nowhere"], ["nowhere"]),
    Case("inputs_is_a_file", ["--inputs", "{d}/afile"], ["afile"], a_file),
    Case("npy_is_a_directory", INPUTS, ["v.npy"], make_special("v.npy", os.mkdir)),
    # open() of a FIFO blocks until a writer comes: the reader must not hang on one
    Case("npy_is_a_fifo", INPUTS, ["k.npy"], make_special("k.npy", os.mkfifo)),
    Case("npy_empty_file", INPUTS, ["q.npy"], replace("q.npy", b"")),
    Case("npy_truncated_in_header", INPUTS, ["q.npy"], edit_bytes("q.npy", lambda b: b[:40])),
    Case("npy_truncated_data", INPUTS, ["k.npy", "truncated"], edit_bytes("k.npy", lambda b: b[:200])),
    Case("npy_trailing_bytes", INPUTS, ["v.npy", "trailing"], edit_bytes("v.npy", lambda b: b + b"\0" * 8)),
    # bad magic or header
    Case("npy_bad_magic", INPUTS, ["q.npy", "magic"], edit_bytes("q.npy", lambda b: b"\x93NUMPZ" + b[6:])),
    Case("npy_not_npy_at_all", INPUTS, ["dout.npy"], replace("dout.npy", b"q,k,v\n1,2,3\n" * 40)),
    Case("npy_header_not_a_dict", INPUTS, ["q.npy"],
         replace("q.npy", raw_npy(QKV_HEADER.replace("}", "]"), b"\0" * 512))),
    Case("npy_header_length_past_end", INPUTS, ["k.npy", "header length"],
         edit_bytes("k.npy", lambda b: b[:8] + struct.pack("<H", 0xFFFF) + b[10:])),
    Case("npy_bad_version", INPUTS, ["q.npy", "version"], edit_bytes("q.npy", lambda b: b[:6] + b"\x07\x00" + b[8:])),
    Case("npy_header_missing_shape", INPUTS, ["v.npy", "shape"],
         replace("v.npy", raw_npy("{'descr': '<f4', 'fortran_order': False, }", b"\0" * 512))),
    # unsupported dtype or order
    Case("npy_dtype_i4", INPUTS, ["q.npy", "<i4"], resave("q.npy", lambda x: x.astype("<i4"))),
    Case("npy_dtype_big_endian_f8", INPUTS, ["k.npy", ">f8"], resave("k.npy", lambda x: x.astype(">f8"))),
    Case("npy_dtype_bool", INPUTS, ["v.npy", "|b1"], resave("v.npy", lambda x: x > 0)),
    Case("npy_dtype_complex", INPUTS, ["dout.npy", "<c8"], resave("dout.npy", lambda x: x.astype("<c8"))),
    Case("npy_dtype_u2", INPUTS, ["k.npy", "<u2"], resave("k.npy", lambda x: x.astype("<u2"))),
    Case("npy_fortran_order", INPUTS, ["q.npy", "ortran"], resave("q.npy", np.asfortranarray)),
    # wrong rank of tensor
    Case("npy_wrong_rank_3d", INPUTS, ["q.npy", "dimensions"], resave("q.npy", lambda x: x.reshape(B, S, H * D))),
    Case("npy_wrong_rank_5d", INPUTS, ["k.npy"], resave("k.npy", lambda x: x.reshape(B, S, HKV, D, 1))),
    # shapes
    Case("shape_mismatch_between_files", INPUTS, ["k.npy", "shape"], resave("k.npy", lambda x: x[:, :15])),
    Case("head_dim_mismatch_between_files", INPUTS, ["dout.npy"], resave("dout.npy", lambda x: x[..., :3])),
    Case("dtype_mismatch_between_files", INPUTS, ["v.npy"], resave("v.npy", lambda x: x.astype("<f8"))),
    Case("heads_not_multiple_of_kv_heads_files", INPUTS, [("q.npy", "k.npy")],
         ones(q=(B, S, 3, D), dout=(B, S, 3, D))),
    Case("heads_not_multiple_of_kv_heads_option", ["--seq", 16, "--heads", 4, "--kv-heads", 3], ["--kv-heads"]),
    Case("zero_seq_option", ["--seq", 0], ["--seq"]),
    Case("zero_head_dim_option", ["--head-dim", 0], ["--head-dim"]),
    Case("zero_heads_option", ["--seq", 16, "--heads", 0], ["--heads"]),
    Case("zero_seq_file", INPUTS, [("q.npy", "k.npy")],
         ones(q=(B, 0, H, D), k=(B, 0, HKV, D), v=(B, 0, HKV, D), dout=(B, 0, H, D))),
    Case("absurd_header_on_small_file", INPUTS, ["q.npy"], replace("q.npy", npy_bytes("<f4", (1, 2**40, 64, 128),
                                                                                       data=b"\0" * 4096))),
    Case("sparse_files_beyond_memory", INPUTS, [("q.npy", "S=67108864")], huge_sparse_inputs),
    Case("absurd_seq_option", ["--seq", 10**15], [("--seq", "S=1000000000000000")]),
    Case("seq_beyond_memory_option", ["--seq", 2 * 10**9, "--heads", 1, "--head-dim", 1], [("--seq", "S=2000000000")]),
    Case("shape_option_overflows", ["--seq", 2**40, "--heads", 2**30, "--head-dim", 2**30],
         [("--seq", "--heads", "--head-dim", "S=")]),
    Case("seq_option_contradicts_files", INPUTS + ["--seq", 32], ["--seq"], inputs_with(lambda inp: None)),
    # another --dtype than the files' is a conversion on load, not an error; 16-bit files still
    # must all be alike
    Case("dtype_f2_and_f4_files_mixed", INPUTS + ["--dtype", "bf16"], ["k.npy", "<f2"],
         resave("k.npy", lambda x: x.astype("<f2"))),
    Case("rope_with_bf16", SMALL + ["--dtype", "bf16", "--rope", "10000"], ["--rope", "bf16"]),
    Case("layer_with_f16", ["--layer", "--seq", 16, "--model-dim", 8, "--dtype", "f16"], ["--layer", "f16"]),
    Case("nan_in_f16_file", INPUTS, ["q.npy", "[0, 2, 0, 1]"], set_value("q.npy", (0, 2, 0, 1), np.nan, np.float16)),
    # non-finite values, naming the tensor and the index
    Case("nan_in_q", INPUTS, ["q.npy", "[0, 3, 1, 2]"], set_value("q.npy", (0, 3, 1, 2), np.nan)),
    # position 12 is on rank 1 only (contiguous 8+8): rank 0 never sees it, every rank must agree
    Case("inf_in_v_on_rank1_only", INPUTS, ["v.npy", "[0, 12, 0, 1]"], set_value("v.npy", (0, 12, 0, 1), np.inf)),
    # striped over 3 ranks: position 5 is rank 2's
    Case("neg_inf_in_dout_on_rank2_striped", INPUTS + ["--layout", "striped"], ["dout.npy", "[0, 5, 1, 0]"],
         set_value("dout.npy", (0, 5, 1, 0), -np.inf), np_=3),
    # a finite value the storage type cannot hold is out of range, not "non-finite" (70000 > 65504)
    Case("f32_value_beyond_f16", INPUTS + ["--dtype", "f16"], ["k.npy", "value 70000 at index [0, 12, 1, 3]",
                                                              "out of f16's range", "65504"],
         set_value("k.npy", (0, 12, 1, 3), 70000.0)),
    Case("nan_in_k_f64", INPUTS, ["k.npy", "[0, 15, 1, 3]"], set_value("k.npy", (0, 15, 1, 3), np.nan, np.float64)),
    # options
    Case("partition_wrong_length", SMALL + ["--partition", "8,8,0"], ["--partition"]),
    Case("partition_negative", SMALL + ["--partition", "17,-1"], ["--partition"]),
    Case("partition_wrong_sum", SMALL + ["--partition", "8,9"], ["--partition"]),
    Case("partition_with_striped_layout", SMALL + ["--partition", "8,8", "--layout", "striped"], ["--partition"]),
    Case("doc_lens_wrong_sum", SMALL + ["--doc-lens", "5,5"], ["--doc-lens"]),
    Case("doc_lens_negative", SMALL + ["--doc-lens", "20,-4"], ["--doc-lens"]),
    Case("unknown_layout", SMALL + ["--layout", "diagonal"], ["--layout", "diagonal"]),
    # strategies: the rule broken, named, and what to use instead
    Case("unknown_strategy", SMALL + ["--strategy", "tree"], ["--strategy", "tree", "ring, ulysses, usp or allgather"]),
    Case("ulysses_heads_not_multiple_of_ranks", ["--seq", 16, "--heads", 3, "--head-dim", 4, "--strategy", "ulysses"],
         ["--strategy ulysses", "H % N == 0", "usp", "ring"]),
    Case("usp_degree_not_dividing_ranks",
         ["--seq", 16, "--heads", 6, "--head-dim", 4, "--strategy", "usp", "--ulysses-degree", 3],
         ["--ulysses-degree", "N % U == 0"], np_=4),
    Case("usp_heads_not_multiple_of_degree",
         ["--seq", 16, "--heads", 3, "--head-dim", 4, "--strategy", "usp", "--ulysses-degree", 2],
         ["--ulysses-degree", "H % U == 0", "ring"]),
    Case("ulysses_degree_without_usp", SMALL + ["--ulysses-degree", 2], ["--ulysses-degree", "--strategy usp"]),
    Case("ulysses_degree_with_ulysses", SMALL + ["--strategy", "ulysses", "--ulysses-degree", 2],
         ["--ulysses-degree", "--strategy usp"]),
    Case("usp_without_degree", SMALL + ["--strategy", "usp"], ["--strategy usp", "--ulysses-degree"]),
    Case("ulysses_degree_zero", SMALL + ["--strategy", "usp", "--ulysses-degree", 0], ["--ulysses-degree"]),
    # a ring traffic plan where no ring moves K/V blocks is refused, not ignored
    Case("traffic_with_allgather", SMALL + ["--causal", "--strategy", "allgather", "--traffic", "full"],
         ["--traffic", "--strategy ring or usp", "allgather"]),
    Case("traffic_with_ulysses", SMALL + ["--causal", "--strategy", "ulysses", "--traffic", "skip-empty"],
         ["--traffic", "--strategy ring or usp", "ulysses"]),
    Case("layer_ulysses_heads_not_multiple_of_ranks",
         ["--layer", "--model-dim", 8, "--seq", 16, "--heads", 3, "--head-dim", 4, "--strategy", "ulysses"],
         ["--strategy ulysses", "H % N == 0"]),
    Case("unknown_dtype", SMALL + ["--dtype", "fp8"], ["--dtype", "fp8"]),
    Case("unknown_option", SMALL + ["--frobnicate"], ["--frobnicate"]),
    Case("non_numeric_seq", ["--seq", "lots"], ["--seq"]),
    Case("window_zero", SMALL + ["--window", 0], ["--window"]),
    Case("iters_zero", SMALL + ["--iters", 0], ["--iters"]),
    Case("timeout_negative", SMALL + ["--timeout", -1], ["--timeout"]),
    Case("out_is_a_file", SMALL + ["--out", "{d}/afile"], ["--out"], a_file, out=False),
    Case("out_under_a_file", SMALL + ["--out", "{d}/afile/sub"], ["--out"], a_file, out=False),
    # /proc exists and passes access(W_OK) for root, yet no file can be created in it
    Case("out_is_proc", SMALL + ["--out", "/proc"], ["--out"], out=False),
    Case("out_under_proc", SMALL + ["--out", "/proc/ringattn-robust-test"], ["--out"], out=False),
    Case("report_under_a_file", SMALL + ["--report", "{d}/afile/r.json"], ["--report", "afile is not a directory"],
         a_file),
    Case("report_deep_under_a_file", SMALL + ["--report", "{d}/afile/x/r.json"],
         ["--report", "afile is not a directory"], a_file),
    Case("report_in_proc", SMALL + ["--report", "/proc/ringattn-robust-test.json"], ["--report"]),
    Case("trace_in_proc", SMALL + ["--trace", "/proc/ringattn-robust-test.jsonl"], ["--trace"]),
    # values that make no sense, found before anything runs
    Case("timeout_nan", SMALL + ["--timeout", "nan"], ["--timeout"]),
    Case("scale_overflows_f32", SMALL + ["--scale", "1e39"], ["--scale"]),
    Case("seq_beyond_64_bits", ["--seq", "99999999999999999999"], ["--seq"]),
    Case("seed_beyond_64_bits", SMALL + ["--seed", str(2**64)], ["--seed"]),
    Case("option_given_twice", SMALL + ["--seq", 32], ["--seq", "2 times"]),
    # a list option too (CLI11 would join the two lists into one)
    Case("list_option_given_twice", SMALL + ["--doc-lens", 8, "--doc-lens", 8], ["--doc-lens", "2 times"]),
    Case("list_item_not_an_integer", SMALL + ["--partition", "8,x"], ["--partition", "'x'"]),
    Case("non_numeric_scale", SMALL + ["--scale", "abc"], ["ringattn: error: --scale: 'abc' is not a number"]),
    Case("flag_value_not_a_truth", SMALL + ["--causal=abc"], ["ringattn: error: --causal: 'abc' is not true or false"]),
    # output paths, all checked before any compute
    Case("report_is_a_directory", SMALL + ["--report", "{d}"], ["--report", "directory"]),
    Case("trace_is_a_directory", SMALL + ["--trace", "{d}"], ["--trace", "directory"]),
    Case("report_name_too_long", SMALL + ["--report", "{d}/" + "r" * 256], ["--report", "characters"]),
    Case("report_is_an_input", INPUTS + ["--report", "{in}/q.npy"], ["--report", "q.npy"], inputs_with(lambda inp: None)),
    Case("report_is_the_trace", SMALL + ["--report", "{d}/x.json", "--trace", "{d}/x.json"], ["--report", "--trace"]),
    Case("out_missing_parent", SMALL + ["--out", "{d}/nope/out"], ["--out", "parent"], out=False),
    Case("out_name_too_long", SMALL + ["--out", "{d}/" + "o" * 300], ["--out", "300 characters"], out=False),
    Case("out_path_too_long", SMALL + ["--out", "{d}/" + "/".join(["d" * 200] * 22)], ["--out", "characters"], out=False),
    Case("trace_with_layer", ["--layer", "--model-dim", 8, "--seq", 16, "--trace", "{d}/t.jsonl"], ["--trace"]),
    # memory counted before anything is allocated: the layer's weights too
    Case("layer_weights_beyond_memory", ["--layer", "--model-dim", 10**7, "--seq", 64], ["--model-dim"]),
]


# --- running -------------------------------------------------------------------------------------

def snapshot(d):
    """Every entry under d (hidden ones too) with its size, so any new or changed file shows."""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs:
            out[os.path.relpath(os.path.join(root, n), d) + "/"] = None
        for n in files:
            p = os.path.join(root, n)
            out[os.path.relpath(p, d)] = os.lstat(p).st_size
    return out


def start_session(limit):
    def fn():
        os.setsid()
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return fn


def run_case(case, root, args):
    d = os.path.join(root, case.name)
    os.makedirs(d)
    if case.setup:
        try:
            case.setup(d)
        except Exception as e:  # e.g. a filesystem without sparse files
            return case, [f"could not set the case up: {e!r}"], 0.0, "", None, ""
    argv = ["run"] + [str(a).replace("{in}", os.path.join(d, "in")).replace("{d}", d) for a in case.args]
    if case.out:
        os.makedirs(os.path.join(d, "out"))
        argv += ["--out", os.path.join(d, "out")]
    before = snapshot(d)
    cmd = [*quiet_mpirun(args.mpirun), "-np", str(case.np), args.binary, *argv]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=start_session(args.address_space_gib << 30))
    timed_out = False
    try:
        stdout, stderr = p.communicate(timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
    elapsed = time.monotonic() - t0

    problems = []
    if timed_out:
        problems.append(f"still running after {CASE_TIMEOUT_S} s (killed)")
    if p.returncode != 2:
        problems.append(f"exit {p.returncode}, expected 2")
    # ringattn's own lines: its "ringattn: ..." messages and spdlog's "[hh:mm:ss.mmm] [rN] [level]" lines
    ours = [l for l in stderr.splitlines() if l.startswith("ringattn") or "] [r" in l]
    if len(ours) != 1 or not ours[0].startswith("ringattn: error:"):
        problems.append(f"expected one 'ringattn: error:' line on stderr, got {len(ours)}: {ours[:4]}")
    elif len(ours[0]) > 400:
        problems.append("the error line is over 400 characters")
    line = ours[0] if ours else ""
    for w in case.words:
        alternatives = w if isinstance(w, tuple) else (w,)
        if ours and not any(a in line for a in alternatives):
            problems.append(f"error line does not name {' or '.join(alternatives)}")
    after = snapshot(d)
    if after != before:
        new = sorted(set(after) - set(before))
        changed = sorted(k for k in set(after) & set(before) if after[k] != before[k])
        gone = sorted(set(before) - set(after))
        problems.append(f"case directory changed: new {new} changed {changed} removed {gone}")
    return case, problems, elapsed, line, p.returncode, stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once")
    ap.add_argument("--only", nargs="*", help="run only these cases")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--address-space-gib", type=int, default=RANK_ADDRESS_SPACE >> 30,
                    help="RLIMIT_AS of mpirun and the ranks; 0 = none (an ASan build needs none, and then "
                         "skip the cases that allocate beyond memory)")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or c.name in args.only]
    if args.list:
        print("\n".join(c.name for c in cases))
        return 0
    if not args.binary:
        ap.error("--binary is required")
    failed = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ringattn-catalogue-") as root:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for case, problems, elapsed, line, rc, stderr in pool.map(lambda c: run_case(c, root, args), cases):
                print(f"{'ok  ' if not problems else 'FAIL'} {case.name:42s} {elapsed:5.1f} s  exit {rc}  {line}")
                for pr in problems:
                    print(f"       - {pr}")
                if problems:
                    failed.append(case.name)
                    if stderr.strip():
                        print("       stderr: " + "\n               ".join(stderr.strip().splitlines()[-6:]))
    print(f"catalogue: {len(cases) - len(failed)}/{len(cases)} cases passed in {time.monotonic() - t0:.1f} s")
    if failed:
        print("failed: " + " ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
