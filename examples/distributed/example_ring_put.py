"""Ring put: each rank puts a tile to the next rank with NVSHMEM inside a @tilescale.jit kernel,
then signals; the receiver waits for the signal and the result is checked against torch on every rank.

    GPUS=4 bash launch.sh examples/distributed/example_ring_put.py            # inlined build mode
    GPUS=4 bash launch.sh examples/distributed/example_ring_put.py --mode rdc # the seed's -rdc=true mode

torch equivalent (what every rank must end up with):
    recv[rank - 1] = tile of rank (rank - 1)          # dist.send/recv around a ring

Signal protocol, per launch with epoch e (1, 2, ...):
    1. rank r puts its tile into row r of `recv` on rank r+1, then sets sig[r] = e there (ordered
       after the data: put_signal);
    2. rank r waits until its own sig[r-1] == e, then reads recv[r-1] (coherent: after the wait).
"""

import argparse

import tilescale
import tilescale.language as T
from tilescale import testing


@tilescale.jit
def ring_put_kernel(rows: int, cols: int, world_size: int, dtype: str = "float32", threads: int = 256):
    @T.prim_func
    def ring_put(src: T.Tensor((rows, cols), dtype), recv: T.Tensor((world_size, rows, cols), dtype),
                 sig: T.Tensor((world_size,), "uint64"), out: T.Tensor((rows, cols), dtype), epoch: T.uint64):
        with T.Kernel(1, threads=threads):
            me = T.get_rank()
            nxt = (me + 1) % world_size
            prv = (me + world_size - 1) % world_size
            T.put_signal_block(src, recv[me, :, :], sig[me], value=epoch, dst_pe=nxt)
            T.wait_until(sig[prv], cmp="eq", value=epoch)
            T.copy(recv[prv, :, :], out)  # what arrived, read after the wait

    return ring_put


def run(info, rows: int = 64, cols: int = 256, mode: str = "auto", iters: int = 3) -> None:
    import torch

    rank, world = info.rank, info.world_size
    k = ring_put_kernel.get_tir(rows, cols, world)
    kernel = tilescale.compile(k, build_mode=None if mode == "auto" else mode, world_size=world)
    recv = tilescale.symm.zeros((world, rows, cols), dtype=torch.float32)
    sig = tilescale.symm.zeros((world,), dtype=torch.uint64)
    out = torch.full((rows, cols), float("nan"), device="cuda")
    for epoch in range(1, iters + 1):
        g = torch.Generator(device="cuda").manual_seed(1000 * epoch + rank)
        src = torch.randn(rows, cols, device="cuda", generator=g)
        out.fill_(float("nan"))
        kernel(src, recv, sig, out, epoch)
        torch.cuda.synchronize()
        prev = (rank - 1) % world
        want = torch.randn(rows, cols, device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(1000 * epoch + prev))
        testing.check_close(f"ring epoch {epoch}: out", out, want, rank)
        testing.check_close(f"ring epoch {epoch}: recv[{prev}]", recv[prev], want, rank)
        tilescale.barrier()
    print(f"[rank {rank}] OK: ring put of {rows}x{cols} float32 from rank {(rank - 1) % world}, "
          f"{iters} epochs, mode {kernel.build_mode}", flush=True)


def build(world_size: int, mode: str = "auto") -> None:
    if mode == "auto":
        tilescale.build_all([(ring_put_kernel, (64, 256, world_size))])
    else:
        tilescale.build(ring_put_kernel.get_tir(64, 256, world_size), build_mode=mode)


# ----------------------------------------------------------------------------- collected as tests
def test_ring_put_compiles_for_sm90():
    import subprocess

    r = tilescale.build(ring_put_kernel.get_tir(64, 256, 4), target={"kind": "cuda", "arch": "sm_90a"})
    assert r.spec.distributed and r.spec.name == "cython"
    assert "nvshmem_my_pe()" in r.source and "tilescale::put_signal<2>" in r.source
    needed = subprocess.run(["readelf", "-d", r.library], stdout=subprocess.PIPE, text=True).stdout
    assert "libnvshmem_host.so.3" in needed


try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None

if pytest is not None:
    @pytest.mark.multigpu
    @pytest.mark.parametrize("nranks,mode", [(2, "inlined"), (4, "inlined"), (2, "rdc"), (4, "rdc")])
    def test_ring_put_on_gpus(nranks, mode):
        testing.skip_unless_ranks(nranks)
        proc = testing.launch(__file__, nranks, "--mode", mode, timeout=400)
        testing.assert_all_ranks_ok(proc, nranks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["auto", "inlined", "rdc"], default="auto")
    a = ap.parse_args()
    testing.example_main(lambda info: run(info, mode=a.mode), lambda ws: build(ws, a.mode))
