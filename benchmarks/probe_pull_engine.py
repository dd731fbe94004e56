"""Does a pull through a peer's mapping (torch ``copy_`` from ``symm.peer_tensor``) run on a copy engine or on SMs?

    GPUS=4 bash launch.sh benchmarks/probe_pull_engine.py

16 MiB pulled from / pushed to each peer by copy_ (one stream, one peer after another; three streams at once; in
one copy or four), every rank at once, aligned by an all-reduce; the median of 5 of the slowest stream.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tilescale  # noqa: E402


def run(info):
    import torch
    import torch.distributed as dist

    from tilescale import symm

    W, r = info.world_size, info.rank
    rows, K = 1024, 8192
    buf = symm.empty((W * rows, K), dtype=torch.bfloat16)
    buf.normal_()
    torch.cuda.synchronize()
    tilescale.barrier()
    dst = torch.empty(W * rows, K, dtype=torch.bfloat16, device="cuda")
    peers = [(r + j) % W for j in range(1, W)]
    views = {p: symm.peer_tensor(buf, p) for p in peers}
    streams = [torch.cuda.Stream(priority=-1) for _ in peers]
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731

    res = {}
    src = torch.randn(rows, K, dtype=torch.bfloat16, device="cuda")
    tok = torch.zeros(1, device="cuda")

    def pattern(kind, parallel, chunks=1, peers=peers):
        """ms of moving 3 x 16 MiB (pull from / push to every peer), all ranks aligned by an all-reduce."""
        main = torch.cuda.current_stream()
        dist.all_reduce(tok)
        a = ev()
        a.record(main)
        ends = []
        for i, p in enumerate(peers):
            s = streams[i if parallel else 0]
            s.wait_event(a)
            for ch in range(chunks):
                lo, hi = ch * rows // chunks, (ch + 1) * rows // chunks
                with torch.cuda.stream(s):
                    if kind == "pull":
                        dst[p * rows + lo:p * rows + hi].copy_(views[p][p * rows + lo:p * rows + hi], non_blocking=True)
                    else:
                        views[p][r * rows + lo:r * rows + hi].copy_(src[lo:hi], non_blocking=True)
            e = ev()
            e.record(s)
            ends.append(e)
        torch.cuda.synchronize()
        return max(a.elapsed_time(e) for e in ends) * 1e3

    for kind in ("pull", "push"):
        for par in (False, True):
            for chunks in (1, 4):
                pattern(kind, par, chunks)
                vals = sorted(pattern(kind, par, chunks) for _ in range(5))
                res[f"A {kind} {'par' if par else 'ser'} x{chunks}"] = vals[2]
        vals = sorted(pattern(kind, False, 1, peers[:1]) for _ in range(5))
        res[f"A {kind} one peer 16MiB"] = vals[2]
    line = ", ".join(f"{k}: {v:.0f}" for k, v in res.items())
    tilescale.testing.say(f"[rank {r}] {line}")


if __name__ == "__main__":
    tilescale.testing.example_main(run, lambda W: None)
