"""Scoped loads and stores (local and on a peer) and remote atomics (add, compare-and-swap).

    GPUS=2 bash launch.sh examples/distributed/primitives/example_ld_st_atomic.py

torch equivalent, on rank r (nxt = r+1, prv = r-1):
    data_on_nxt[r] = (r+1) * epoch; flag_on_nxt[r] = epoch        # T.st relaxed, then T.st release
    out[0] = data[prv]  after waiting for flag[prv] == epoch        # T.wait_until (acquire), T.ld acquire
    out[1] = data_on_nxt[r]                                         # T.ld(src_pe=nxt)
    total_on_rank0 += r + 1                                         # T.atom_add(dst_pe=0)
    slot_on_rank0[r]: cas(0 -> r+1) succeeds once, then fails      # T.atom_cas(dst_pe=0)
"""
import tilescale
import tilescale.language as T
from tilescale import testing


@tilescale.jit
def ld_st_atomic_kernel(world_size: int):
    @T.prim_func
    def ld_st_atomic(data: T.Tensor((world_size,), "float32"), flag: T.Tensor((world_size,), "uint64"),
                     total: T.Tensor((1,), "int64"), slot: T.Tensor((world_size,), "int32"),
                     out: T.Tensor((2,), "float32"), cas_old: T.Tensor((2,), "int32"), local: T.Tensor((1,), "int32"),
                     epoch: T.uint64):
        with T.Kernel(1, threads=32):
            tx = T.get_thread_binding()
            me = T.get_rank()
            nxt = (me + 1) % world_size
            prv = (me + world_size - 1) % world_size
            if tx == 0:
                T.st(data[me], T.cast(me + 1, "float32") * T.cast(epoch, "float32"), scope="sys", sem="relaxed",
                     dst_pe=nxt)
                T.st(flag[me], epoch, scope="sys", sem="release", dst_pe=nxt)
                T.wait_until(flag[prv], cmp="eq", value=epoch)
                out[0] = T.ld(data[prv], scope="sys", sem="acquire")
                out[1] = T.ld(data[me], scope="sys", sem="acquire", src_pe=nxt)
                T.atom_add(total[0], T.cast(me + 1, "int64"), scope="sys", sem="relaxed", dst_pe=0)
                cas_old[0] = T.atom_cas(slot[me], 0, me + 1, scope="sys", sem="acq_rel", dst_pe=0)
                cas_old[1] = T.atom_cas(slot[me], 0, 77, scope="sys", sem="acq_rel", dst_pe=0)
                T.st(local[0], 5, scope="gpu", sem="release")
                old = T.atom_add(local[0], 2, scope="gpu")               # 5 -> 7, returns 5
                local[0] = old + T.ld(local[0], scope="gpu", sem="volatile")  # 5 + 7

    return ld_st_atomic


def jobs(world_size):
    return [(ld_st_atomic_kernel, (world_size,))]


def run(info) -> None:
    import torch

    rank, W = info.rank, info.world_size
    k = ld_st_atomic_kernel(W)
    data = tilescale.symm.zeros((W,), dtype=torch.float32)
    flag = tilescale.symm.zeros((W,), dtype=torch.uint64)
    total = tilescale.symm.zeros((1,), dtype=torch.int64)
    slot = tilescale.symm.zeros((W,), dtype=torch.int32)
    out = torch.full((2,), float("nan"), device="cuda")
    cas_old = torch.full((2,), -1, dtype=torch.int32, device="cuda")
    local = torch.zeros(1, dtype=torch.int32, device="cuda")
    k(data, flag, total, slot, out, cas_old, local, 1)
    torch.cuda.synchronize()
    tilescale.barrier()
    torch.cuda.synchronize()
    prv = (rank - 1) % W
    assert out.tolist() == [float(prv + 1), float(rank + 1)], f"[rank {rank}] ld/st: out={out.tolist()}"
    assert cas_old.tolist() == [0, rank + 1], f"[rank {rank}] atom_cas returned {cas_old.tolist()}"
    assert local.item() == 5 + 7, f"[rank {rank}] local atom_add/ld: {local.item()}"
    if rank == 0:
        assert total.item() == W * (W + 1) // 2, f"atom_add total {total.item()} != {W * (W + 1) // 2}"
        assert slot.tolist() == list(range(1, W + 1)), f"atom_cas slots {slot.tolist()}"
    print(f"[rank {rank}] OK: st/ld (relaxed, release/acquire, volatile; local and remote), atom_add, atom_cas",
          flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: [fn.build(*a) for fn, a in jobs(ws)])
