"""The timing the PyTorch baselines share (torch_attention.py, sdpa_attention.py): forward and
backward timed apart, medians over the iterations after one warm-up, printed as one JSON object.

scripts/bench.py vs-sdpa runs sdpa_attention.py from its text on stdin, in a chroot where this
file is not on the path: bench.py puts this file's text in front, as the module bench_timing.
"""
import json
import statistics
import time


def time_forward_backward(forward, inputs, dout, iters):
    """Median seconds of o = forward() and of o.backward(dout) over `iters` iterations after one
    warm-up, the gradients of `inputs` cleared before each."""
    fwd, bwd = [], []
    for it in range(iters + 1):
        for t in inputs:
            t.grad = None
        t0 = time.perf_counter()
        o = forward()
        t1 = time.perf_counter()
        o.backward(dout)
        t2 = time.perf_counter()
        if it > 0:  # the first iteration warms up
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
        del o
    return statistics.median(fwd), statistics.median(bwd)


def print_result(forward_s, backward_s, B, S, H, D, causal, **extra):
    """The JSON line scripts/bench.py reads: the seconds, attention's flops (causal: half; the
    backward 2.5 times the forward's) and `extra`."""
    flops = 4.0 * B * S * S * H * D * (0.5 if causal else 1.0)
    print(json.dumps({"forward_s": forward_s, "backward_s": backward_s, "flops_forward": flops,
                      "flops_backward": 2.5 * flops, **extra}))
