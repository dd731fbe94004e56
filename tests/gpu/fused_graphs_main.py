"""CUDA graphs of the fused ops on N ranks: AG+GEMM (``AGGemm``) and GEMM+RS (``GemmRS``) captured in one graph
with torch.cuda.graph, then replayed many times (FUSED_REPLAYS, default 300), each replay with new inputs copied
into the static inputs and the outputs poisoned (NaN) first, eager calls of the same ops in between, every
result checked against torch on data rebuilt from every rank's seed (no communication). Rank r's inputs of
replay i are ``base[r] * a_i + b_i`` in bf16 (a_i, b_i from a host RNG seeded by i, the same on every rank),
so the reference gathers exactly the operands the ranks used and only the GEMMs' rounding differs: relative
error (max |difference| / max |reference|) within 2e-2. Under TILESCALE_NODE_SIZE the peers of other
"nodes" are reached with NVSHMEM gets and signals, captured the same way. Prints
'[rank R] OK: fused graphs ...'. Run by tests/test_graphs_gpu.py.

    GPUS=2 bash launch.sh tests/gpu/fused_graphs_main.py
"""
import os
import random

import tilescale

TOL = 2e-2
ROWS, K, N = 256, 256, 512      # per rank: AG+GEMM gathers W x ROWS rows; GEMM+RS reduces (W x ROWS, N)


def coeffs(i: int):
    rng = random.Random(i)
    return rng.uniform(0.5, 2.0), rng.uniform(-1, 1)


class Worst:
    """The largest relative error seen, kept on the GPU (NaN wins: an output that was not written)."""

    def __init__(self, dev):
        import torch

        self.v = torch.zeros((), device=dev)
        self.n = 0

    def add(self, got, want):
        import torch

        err = (got.float() - want).abs().max() / want.abs().max()
        torch.maximum(self.v, torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err), out=self.v)
        self.n += 1

    def check(self, what, rank):
        v = float(self.v)
        if not v <= TOL:
            raise AssertionError(f"[rank {rank}] {what}: largest relative error {v} over {self.n} results "
                                 f"(tolerance {TOL})")


def main():
    import torch

    info = tilescale.init_distributed()
    rank, W = info.rank, info.world_size
    dev = torch.device("cuda", torch.cuda.current_device())
    bf = torch.bfloat16
    replays = int(os.environ.get("FUSED_REPLAYS", "300"))

    def seeded(shape, seed, scale=1.0):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, generator=g) * scale).to(dev, bf)

    a_bases = torch.stack([seeded((ROWS, K), 100 + r) for r in range(W)])           # AG+GEMM's shards
    b = seeded((K, N), 7, K ** -0.5)
    x_bases = torch.stack([seeded((W * ROWS, K), 200 + r) for r in range(W)])       # GEMM+RS's inputs
    w_all = torch.stack([seeded((K, N), 300 + r, K ** -0.5) for r in range(W)])

    def inputs(i):
        a, c = coeffs(i)
        return (a_bases * a + c), (x_bases * a + c)        # bf16, as every rank computes its own

    def refs(i):
        a_all, x_all = inputs(i)
        ag_ref = a_all.reshape(W * ROWS, K).float() @ b.float()
        rs_ref = torch.einsum("rmk,rkn->mn", x_all.float(), w_all.float()).view(W, ROWS, N)[rank]
        return ag_ref, rs_ref

    ag = tilescale.ops.AGGemm(W * ROWS, N, K, bf)
    rs = tilescale.ops.GemmRS(W * ROWS, N, K, bf)
    a_in = torch.empty(ROWS, K, device=dev, dtype=bf)          # the static inputs
    x_in = torch.empty(W * ROWS, K, device=dev, dtype=bf)
    c_out = torch.empty(W * ROWS, N, device=dev, dtype=bf)

    def fill(i):
        a_all, x_all = inputs(i)
        a_in.copy_(a_all[rank])
        x_in.copy_(x_all[rank])

    def step():
        ag(a_in, b, out=c_out)
        return rs(x_in, w_all[rank])

    worst = Worst(dev)
    for i in range(3):                                   # warm-up, eager
        fill(10_000 + i)
        y = step()
        for got, want in zip((c_out, y), refs(10_000 + i), strict=True):
            worst.add(got, want)
    worst.check("eager warm-up", rank)
    torch.cuda.synchronize()
    tilescale.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_out = step()
    assert ag.captured and rs.captured
    eager = 0
    for i in range(replays):
        fill(i)
        c_out.fill_(float("nan"))
        y_out.fill_(float("nan"))
        graph.replay()
        ag_ref, rs_ref = refs(i)
        worst.add(c_out, ag_ref)
        worst.add(y_out, rs_ref)
        if i % 25 == 12:                                # eager calls between replays
            fill(50_000 + i)
            y = step()
            for got, want in zip((c_out, y), refs(50_000 + i), strict=True):
                worst.add(got, want)
            eager += 1
        if i % 100 == 99:
            worst.check(f"replay {i + 1}", rank)
    torch.cuda.synchronize()
    worst.check("replays", rank)
    print(f"[rank {rank}] OK: fused graphs: AG+GEMM and GEMM+RS captured, replayed {replays} times with new inputs "
          f"and poisoned outputs, {eager} eager steps between, {worst.n} results within {TOL} of torch "
          f"(world size {W}, node size {os.environ.get('TILESCALE_NODE_SIZE', 'real')})", flush=True)
    tilescale.finalize()


if __name__ == "__main__":
    main()
