"""Ordering and completion: fence, quiet, and barriers among ranks at thread, warp, block and grid scope.

    GPUS=2 bash launch.sh examples/distributed/primitives/example_sync.py

torch equivalent, on rank r: out = tile that rank r-1 put into r's `recv` (readable after the barrier).
Grid scope: every block of the kernel takes part (the kernel is launched cooperatively, so all its
blocks are co-resident); block 0 runs the NVSHMEM barrier between two grid syncs.
"""
import tilescale
import tilescale.language as T
from tilescale import testing


@tilescale.jit
def grid_barrier_kernel(n: int, blocks: int, world_size: int):
    chunk = n // blocks

    @T.prim_func
    def grid_barrier(src: T.Tensor((n,), "float32"), recv: T.Tensor((world_size, n), "float32"),
                     out: T.Tensor((n,), "float32")):
        with T.Kernel(blocks, threads=128) as b:
            me = T.get_rank()
            nxt = (me + 1) % world_size
            prv = (me + world_size - 1) % world_size
            T.put_block_nbi(src[b * chunk:(b + 1) * chunk], recv[me, b * chunk:(b + 1) * chunk], dst_pe=nxt)
            T.fence()
            T.quiet()
            T.barrier_all(scope="grid")
            T.copy(recv[prv, b * chunk:(b + 1) * chunk], out[b * chunk:(b + 1) * chunk])

    return grid_barrier


@tilescale.jit
def scoped_barrier_kernel(n: int, world_size: int):
    @T.prim_func
    def scoped_barrier(src: T.Tensor((n,), "float32"), recv: T.Tensor((3, world_size, n), "float32"),
                       out: T.Tensor((3, n), "float32")):
        with T.Kernel(1, threads=64):
            tx = T.get_thread_binding()
            me = T.get_rank()
            nxt = (me + 1) % world_size
            prv = (me + world_size - 1) % world_size
            T.put_block(src, recv[0, me, :], dst_pe=nxt)
            T.barrier_all(scope="block")
            T.copy(recv[0, prv, :], out[0, :])
            if tx < 32:
                T.put_warp(src, recv[1, me, :], dst_pe=nxt)
                T.barrier_all(scope="warp")
            T.sync_threads()
            T.copy(recv[1, prv, :], out[1, :])
            if tx == 0:
                T.put_thread(src, recv[2, me, :], dst_pe=nxt)
                T.barrier_all(scope="thread")
            T.sync_threads()
            T.copy(recv[2, prv, :], out[2, :])
            T.sync_all(scope="block")

    return scoped_barrier


def jobs(world_size):
    return [(grid_barrier_kernel, (8192, 16, world_size)), (scoped_barrier_kernel, (1024, world_size))]


def run(info) -> None:
    import torch

    rank, W = info.rank, info.world_size
    seed = lambda r: torch.Generator(device="cuda").manual_seed(31 + r)  # noqa: E731
    g = grid_barrier_kernel(8192, 16, W)
    recv = tilescale.symm.zeros((W, 8192), dtype=torch.float32)
    src = torch.randn(8192, device="cuda", generator=seed(rank))
    out = torch.full_like(src, float("nan"))
    g(src, recv, out)
    torch.cuda.synchronize()
    testing.check_close("grid barrier", out, torch.randn(8192, device="cuda", generator=seed((rank - 1) % W)), rank)
    s = scoped_barrier_kernel(1024, W)
    recv3 = tilescale.symm.zeros((3, W, 1024), dtype=torch.float32)
    src = torch.randn(1024, device="cuda", generator=seed(rank))
    out3 = torch.full((3, 1024), float("nan"), device="cuda")
    s(src, recv3, out3)
    torch.cuda.synchronize()
    want = torch.randn(1024, device="cuda", generator=seed((rank - 1) % W))
    for i, scope in enumerate(("block", "warp", "thread")):
        testing.check_close(f"{scope}-scope barrier", out3[i], want, rank)
    print(f"[rank {rank}] OK: fence, quiet, barrier_all at grid/block/warp/thread scope, sync_all", flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: [fn.build(*a) for fn, a in jobs(ws)])
