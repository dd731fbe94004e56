"""Timing of distributed ops: CUDA events per rank, the slowest rank reported; tables and JSON."""
import json
import os
import statistics


def time_op(fn, warmup: int = 5, iters: int = 20, repeats: int = 3) -> float:
    """Microseconds per call of `fn` (median over repeats of the mean over `iters`), max over ranks.
    Ranks start each repeat together (a barrier) so that skew does not count."""
    import torch

    from tilescale import staged_collectives

    dist = staged_collectives.for_cuda()   # NCCL; gloo on host copies when ranks share a GPU

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        res.append(s.elapsed_time(e) * 1e3 / iters)
    t = torch.tensor([statistics.median(res)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):g} {unit}"
    return f"{n} B"


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=False)) + " |")


def write_json(path: str | None, payload: dict) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(payload, f, indent=1)


def environment() -> dict:
    import torch

    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
