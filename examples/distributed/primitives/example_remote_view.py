"""Peer views with tilelang's own T.copy, and the device-side identity ops.

    GPUS=2 bash launch.sh examples/distributed/primitives/example_remote_view.py

torch equivalent, on rank r (nxt = r+1, prv = r-1):
    peer(dst, nxt)[r] = src          # tile stores straight into the next rank's buffer (T.copy, vectorised)
    pulled = peer(dst, nxt)[r]       # ... and tile loads of it back from the next rank, after a barrier
    ident = [rank, world_size]
"""
import tilescale
import tilescale.language as T
from tilescale import testing


@tilescale.jit
def remote_copy_kernel(M: int, N: int, world_size: int, bm: int = 64, bn: int = 128):
    @T.prim_func
    def remote_copy(src: T.Tensor((M, N), "float16"), dst: T.Tensor((world_size, M, N), "float16"),
                    ident: T.Tensor((2,), "int32")):
        with T.Kernel(N // bn, M // bm, threads=128) as (bx, by):
            me = T.get_rank()
            nxt = (me + 1) % world_size
            S = T.alloc_shared((bm, bn), "float16")
            T.copy(src[by * bm, bx * bn], S)
            rdst = T.remote(dst, pe=nxt)
            T.copy(S, rdst[me, by * bm, bx * bn])
            if bx == 0:
                if by == 0:
                    if T.get_thread_binding() == 0:
                        ident[0] = me
                        ident[1] = T.get_num_ranks()

    return remote_copy


@tilescale.jit
def remote_pull_kernel(M: int, N: int, world_size: int, bm: int = 64, bn: int = 128):
    @T.prim_func
    def remote_pull(dst: T.Tensor((world_size, M, N), "float16"), pulled: T.Tensor((M, N), "float16")):
        with T.Kernel(N // bn, M // bm, threads=128) as (bx, by):
            me = T.get_rank()
            nxt = (me + 1) % world_size
            S = T.alloc_shared((bm, bn), "float16")
            rsrc = T.remote(dst, pe=nxt)
            T.copy(rsrc[me, by * bm, bx * bn], S)
            T.copy(S, pulled[by * bm, bx * bn])

    return remote_pull


def jobs(world_size):
    return [(remote_copy_kernel, (256, 512, world_size)), (remote_pull_kernel, (256, 512, world_size))]


def run(info) -> None:
    import torch

    rank, W = info.rank, info.world_size
    seed = lambda r: torch.Generator(device="cuda").manual_seed(5 + r)  # noqa: E731
    dst = tilescale.symm.zeros((W, 256, 512), dtype=torch.float16)
    src = torch.randn(256, 512, device="cuda", generator=seed(rank)).half()
    ident = torch.full((2,), -1, dtype=torch.int32, device="cuda")
    remote_copy_kernel(256, 512, W)(src, dst, ident)
    torch.cuda.synchronize()
    tilescale.barrier()
    torch.cuda.synchronize()
    prv = (rank - 1) % W
    testing.check_close("T.copy into a peer view", dst[prv], torch.randn(256, 512, device="cuda",
                                                                          generator=seed(prv)).half(), rank)
    assert ident.tolist() == [rank, W], f"[rank {rank}] get_rank/get_num_ranks gave {ident.tolist()}"
    pulled = torch.full((256, 512), float("nan"), device="cuda").half()
    remote_pull_kernel(256, 512, W)(dst, pulled)
    torch.cuda.synchronize()
    testing.check_close("T.copy from a peer view", pulled, src, rank)
    print(f"[rank {rank}] OK: T.remote peer views with T.copy (store and load), get_rank/get_num_ranks", flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: [fn.build(*a) for fn, a in jobs(ws)])
