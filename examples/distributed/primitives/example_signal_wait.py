"""Signals and waits: put_signal, signal_op set/add, wait_until with every comparison, and a stress test
of signal/wait ordering (a producer writes then signals; the consumer waits then reads; 10,000 rounds).

    GPUS=2 bash launch.sh examples/distributed/primitives/example_signal_wait.py

torch equivalent of the first kernel, on rank r (prv = r-1, nxt = r+1):
    out = tile of rank prv;  counter == world_size * epoch  (every rank added 1 on every rank)
Stress protocol, round i (0..rounds-1), every rank is producer (to nxt) and consumer (from prv):
    1. producer waits until nxt acknowledged round i-1 (ack >= i), writes row i of its table (+rank)
       into nxt's `box`, and sets `full = i + 1` on nxt (put_signal: data before signal);
    2. consumer waits until `full >= i + 1`, compares `box` with prv's row i (plain loads: the wait's
       acquire makes them coherent), counts mismatches, then sets `ack = i + 1` on prv.
"""
import tilescale
import tilescale.language as T
from tilescale import testing


@tilescale.jit
def signals_kernel(n: int, world_size: int):
    @T.prim_func
    def signals(src: T.Tensor((n,), "float32"), dst: T.Tensor((world_size, n), "float32"),
                flag: T.Tensor((world_size,), "uint64"), count: T.Tensor((1,), "uint64"),
                out: T.Tensor((n,), "float32"), epoch: T.uint64):
        with T.Kernel(1, threads=128):
            tx = T.get_thread_binding()
            me = T.get_rank()
            nxt = (me + 1) % world_size
            prv = (me + world_size - 1) % world_size
            if tx == 0:
                for p in T.serial(world_size):
                    T.signal_add(count[0], 1, dst_pe=p)
            T.put_signal_block(src, dst[me, :], flag[me], value=epoch, sig_op="set", dst_pe=nxt)
            T.wait_until(flag[prv], cmp="eq", value=epoch)
            total = epoch * world_size
            T.wait_until(count[0], cmp="ge", value=total)
            T.wait_eq(count[0], total)
            T.wait_gt(count[0], total - 1)
            T.wait_ne(count[0], 0)
            T.wait_le(count[0], total)
            T.wait_lt(count[0], total + 1)
            T.copy(dst[prv, :], out)

    return signals


@tilescale.jit
def stress_kernel(n: int, rounds: int, table_rows: int, world_size: int):
    @T.prim_func
    def stress(table: T.Tensor((table_rows, n), "float32"), box: T.Tensor((n,), "float32"),
               full: T.Tensor((1,), "uint64"), ack: T.Tensor((1,), "uint64"), errors: T.Tensor((1,), "int32"),
               base: T.uint64):
        with T.Kernel(1, threads=256):
            me = T.get_rank()
            nxt = (me + 1) % world_size
            prv = (me + world_size - 1) % world_size
            S = T.alloc_shared((n,), "float32")
            for i in T.serial(rounds):
                T.wait_until(ack[0], cmp="ge", value=base + i)                # nxt consumed round i-1
                for j in T.Parallel(n):
                    S[j] = table[i % table_rows, j] + T.cast(me, "float32")
                T.put_signal_block(S, box, full[0], value=base + i + 1, dst_pe=nxt)
                T.wait_until(full[0], cmp="ge", value=base + i + 1)           # prv's round i arrived
                for j in T.Parallel(n):
                    if box[j] != table[i % table_rows, j] + T.cast(prv, "float32"):
                        T.atomic_add(errors[0], 1)
                T.sync_threads()
                if T.get_thread_binding() == 0:
                    T.signal_set(ack[0], base + i + 1, dst_pe=prv)

    return stress


def stress_rounds(shared_gpu: bool) -> int:
    """Rounds of the stress test: 10,000; 1,000 when ranks share a GPU (each round hands the GPU from one
    rank's process to the next one's, a time slice each: slow, and the protocol is the same)."""
    return 1000 if shared_gpu else 10000


def jobs(world_size, shared_gpu: bool | None = None):
    """The kernels run() builds (`shared_gpu`: default, this job's mode once tilescale is initialised)."""
    if shared_gpu is None:
        from tilescale import runtime

        shared_gpu = runtime.shares_gpu()
    return [(signals_kernel, (1024, world_size)), (stress_kernel, (2048, stress_rounds(shared_gpu), 64, world_size))]


def run(info, rounds: int | None = None) -> None:
    import torch

    rank, W = info.rank, info.world_size
    if rounds is None:
        rounds = stress_rounds(info.shared_gpu)
    k = signals_kernel(1024, W)
    dst = tilescale.symm.zeros((W, 1024), dtype=torch.float32)
    flag = tilescale.symm.zeros((W,), dtype=torch.uint64)
    count = tilescale.symm.zeros((1,), dtype=torch.uint64)
    out = torch.empty(1024, device="cuda")
    for epoch in (1, 2):
        src = torch.randn(1024, device="cuda", generator=torch.Generator(device="cuda").manual_seed(10 * epoch + rank))
        out.fill_(float("nan"))
        k(src, dst, flag, count, out, epoch)
        torch.cuda.synchronize()
        want = torch.randn(1024, device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(10 * epoch + (rank - 1) % W))
        testing.check_close(f"put_signal data, epoch {epoch}", out, want, rank)
        assert count.item() == W * epoch, f"[rank {rank}] signal_add count {count.item()} != {W * epoch}"
        tilescale.barrier()
    s = stress_kernel(2048, rounds, 64, W)
    table = torch.randn(64, 2048, device="cuda", generator=torch.Generator(device="cuda").manual_seed(99))
    box = tilescale.symm.zeros((2048,), dtype=torch.float32)
    full = tilescale.symm.zeros((1,), dtype=torch.uint64)
    ack = tilescale.symm.zeros((1,), dtype=torch.uint64)
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t[0].record()
    s(table, box, full, ack, errors, 0)
    t[1].record()
    torch.cuda.synchronize()
    # This rank's kernel ends once it consumed round rounds-1; its own last `ack` comes from nxt when nxt has
    # consumed this rank's last round, which may be later: every kernel has ended (and every signal landed)
    # after the barrier.
    tilescale.barrier()
    tilescale.synchronize()
    assert errors.item() == 0, f"[rank {rank}] stress: {errors.item()} stale or wrong elements in {rounds} rounds"
    assert full.item() == rounds and ack.item() == rounds, f"[rank {rank}] stress: full={full.item()} ack={ack.item()}"
    print(f"[rank {rank}] OK: signals (set/add, 6 comparisons) and {rounds} producer/consumer rounds without a stale "
          f"read ({t[0].elapsed_time(t[1]) / rounds * 1e3:.2f} us per round)", flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: [fn.build(*a) for fn, a in jobs(ws)])
