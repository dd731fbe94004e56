"""put/get of tiles at block, warp and thread granularity, blocking and non-blocking, 2-D regions.

    GPUS=2 bash launch.sh examples/distributed/primitives/example_put_get.py

torch equivalent, on every rank r (nxt = r+1, prv = r-1 around the ring):
    recv_on_nxt[r] = src              # put: r writes its tile into nxt's symmetric `recv`
    back = recv_on_nxt[r]             # get: r reads it back from nxt
Each column band of the tile goes through a different op (put_block, put_warp, put_thread,
put_block_nbi + quiet; get_* likewise); a block-scope barrier separates the puts from the gets.
"""
import tilescale
import tilescale.language as T
from tilescale import testing


@tilescale.jit
def put_get_kernel(rows: int, cols: int, world_size: int, dtype: str = "float32"):
    c = cols // 4

    @T.prim_func
    def put_get(src: T.Tensor((rows, cols), dtype), recv: T.Tensor((world_size, rows, cols), dtype),
                back: T.Tensor((rows, cols), dtype)):
        with T.Kernel(1, threads=128):
            tx = T.get_thread_binding()
            me = T.get_rank()
            nxt = (me + 1) % world_size
            S = T.alloc_shared((rows, c), dtype)
            T.copy(src[0:rows, 0:c], S)
            T.put_block(S, recv[me, 0:rows, 0:c], dst_pe=nxt)                       # shared -> remote, 2-D
            if tx < 32:
                T.put_warp(src[0:rows, c:2 * c], recv[me, 0:rows, c:2 * c], dst_pe=nxt)
            if tx == 0:
                T.put_thread(src[0:rows, 2 * c:3 * c], recv[me, 0:rows, 2 * c:3 * c], dst_pe=nxt)
            T.put_block_nbi(src[0:rows, 3 * c:cols], recv[me, 0:rows, 3 * c:cols], dst_pe=nxt)
            T.quiet()
            T.barrier_all(scope="block")                                              # all puts landed
            T.get_block(recv[me, 0:rows, 0:c], back[0:rows, 0:c], src_pe=nxt)
            if tx < 32:
                T.get_warp(recv[me, 0:rows, c:2 * c], back[0:rows, c:2 * c], src_pe=nxt)
            if tx == 0:
                T.get_thread(recv[me, 0:rows, 2 * c:3 * c], back[0:rows, 2 * c:3 * c], src_pe=nxt)
            T.get_block_nbi(recv[me, 0:rows, 3 * c:cols], back[0:rows, 3 * c:cols], src_pe=nxt)
            T.quiet()

    return put_get


def jobs(world_size):
    return [(put_get_kernel, (32, 256, world_size))]


def run(info) -> None:
    import torch

    rank, W = info.rank, info.world_size
    k = put_get_kernel(32, 256, W)
    recv = tilescale.symm.zeros((W, 32, 256), dtype=torch.float32)
    src = torch.randn(32, 256, device="cuda", generator=torch.Generator(device="cuda").manual_seed(rank))
    back = torch.full_like(src, float("nan"))
    k(src, recv, back)
    torch.cuda.synchronize()
    tilescale.barrier()
    torch.cuda.synchronize()
    prv = (rank - 1) % W
    want = torch.randn(32, 256, device="cuda", generator=torch.Generator(device="cuda").manual_seed(prv))
    testing.check_close("put (tile from rank-1)", recv[prv], want, rank)
    testing.check_close("get (own tile read back from rank+1)", back, src, rank)
    print(f"[rank {rank}] OK: put/get block/warp/thread/nbi on 2-D tiles", flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: [fn.build(*a) for fn, a in jobs(ws)])
