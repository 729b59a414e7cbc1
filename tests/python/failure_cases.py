#!/usr/bin/python3
"""Scenarios of the binding's failure model, each run under mpirun by failure_test.py (which
gives every run a time limit and checks how it ended).

    PYTHONPATH=build/python mpirun -np N python3 tests/python/failure_cases.py SCENARIO

threads          two threads, each on its own duplicate of COMM_WORLD, call attention (forward and
                 backward) at the same time, a few times, starting in opposite orders on
                 neighbouring ranks; exits 0 when both finish everywhere.
raise-between    the last rank raises after the forward (uncaught); the others go on to the
                 backward and must be ended by the watchdog (timeout=5).
skip-backward    the last rank skips the backward and calls attention again; the others' backward
                 must be ended by the watchdog (timeout=5).
absent           the last rank never calls attention (it sleeps); the others' call must be ended by
                 the watchdog of its setup (timeout=5).
raise-outside    the last rank raises outside ringattn, before the call, while the others call
                 attention with the default watchdog: under `python -m mpi4py` the whole job ends
                 at once.
killed           the last rank is killed (SIGKILL) between the forward and the backward, while the
                 others go on with the default watchdog: mpirun ends the whole job at once.
cache-absent     a KVCache (timeout=5) after its prefill: the last rank never calls decode (it
                 sleeps); the others' decode must be ended by the watchdog of its agreement.
"""

import os
import signal
import sys
import threading
import time

import torch
from mpi4py import MPI

import ringattn

COMM = MPI.COMM_WORLD
RANK, N = COMM.rank, COMM.size
LAST = RANK == N - 1
S = 24


def shard(comm, seed, causal=True):
    g = torch.Generator().manual_seed(seed)
    pos = torch.from_numpy(ringattn.positions(S, comm.size, comm.rank, causal=causal))
    return [torch.randn(2, S, 4, 8, generator=g, dtype=torch.float64)[:, pos].requires_grad_(True)
            for _ in range(3)]


def say(text):
    print(f"rank {RANK}: {text}", flush=True)


def threads():
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        say(f"SKIP: MPI gives thread level {MPI.Query_thread()}, not THREAD_MULTIPLE (set mpi4py.rc.thread_level "
            "= 'multiple' before importing MPI)")
        return 0
    comms = [COMM.Dup(), COMM.Dup()]
    done = [0, 0]

    def work(i):
        for step in range(4):
            q, k, v = shard(comms[i], seed=10 * i + step)
            # The two threads start in opposite orders on neighbouring ranks: each rank's first
            # thread waits in a collective for a peer whose first thread is on the other one.
            if (i + RANK) % 2:
                time.sleep(0.3)
            o = ringattn.attention(q, k, v, seq_len=S, causal=True, comm=comms[i], timeout=20)
            o.sum().backward()
            assert torch.isfinite(q.grad).all()
            done[i] += 1

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for c in comms:
        c.Free()
    say(f"threads finished {done[0]} and {done[1]} calls")
    return 0 if done == [4, 4] else 1


def raise_between():
    q, k, v = shard(COMM, seed=1)
    o = ringattn.attention(q, k, v, seq_len=S, causal=True, timeout=5)
    if LAST:
        raise RuntimeError("a failure of this rank's own, between the forward and the backward")
    o.sum().backward()
    say("backward returned (expected the watchdog to end the job)")
    return 0


def skip_backward():
    q, k, v = shard(COMM, seed=2)
    o = ringattn.attention(q, k, v, seq_len=S, causal=True, timeout=5)
    if LAST:
        o = ringattn.attention(q, k, v, seq_len=S, causal=True, timeout=5)
    o.sum().backward()
    say("backward returned (expected the watchdog to end the job)")
    return 0


def absent():
    q, k, v = shard(COMM, seed=3)
    if LAST:
        time.sleep(120)
        return 0
    ringattn.attention(q, k, v, seq_len=S, causal=True, timeout=5)
    say("attention returned without the last rank (expected the watchdog to end the job)")
    return 0


def raise_outside():
    q, k, v = shard(COMM, seed=4)
    if LAST:
        raise RuntimeError("a failure of this rank's own, outside ringattn")
    ringattn.attention(q, k, v, seq_len=S, causal=True)
    say("attention returned without the last rank")
    return 0


def killed():
    q, k, v = shard(COMM, seed=5)
    o = ringattn.attention(q, k, v, seq_len=S, causal=True)
    if LAST:
        os.kill(os.getpid(), signal.SIGKILL)
    o.sum().backward()
    say("backward returned without the last rank")
    return 0


def cache_absent():
    c = ringattn.KVCache(1, 2, 1, 4, dtype=torch.float64, capacity=20, timeout=5)
    p = c.positions(6)
    x, y = torch.randn(1, len(p), 2, 4, dtype=torch.float64), torch.randn(1, len(p), 1, 4, dtype=torch.float64)
    c.prefill(x, y, y, prompt_len=6)
    if LAST:
        time.sleep(120)
        return 0
    one = torch.ones(1, 1, 1, 4, dtype=torch.float64)
    c.decode(torch.ones(1, 1, 2, 4, dtype=torch.float64), one, one)
    say("decode returned without the last rank (expected the watchdog to end the job)")
    return 0


SCENARIOS = {"threads": threads, "raise-between": raise_between, "skip-backward": skip_backward,
             "absent": absent, "raise-outside": raise_outside, "killed": killed, "cache-absent": cache_absent}

if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(SCENARIOS[sys.argv[1]]())
