"""Injected hang: rank 0 waits for a signal nobody sets. With TILESCALE_WAIT_TIMEOUT_S the wait gives up,
rank 0 reports rank/block/signal/expected/observed and raises WaitTimeoutError; the other ranks, idle on
the host, are stopped by their watchdogs with a message naming rank 0. Run by tests/test_gpu_runtime.py."""
import tilescale
import tilescale.language as T
from tilescale import testing


@tilescale.jit
def never_signalled(world_size: int):
    @T.prim_func
    def hang(sig: T.Tensor((1,), "uint64")):
        # every thread of 528 blocks of 512 waits (all a 132-SM GPU holds at once): they give up together, one writes
        # the record, none stops the kernel before it is complete (a full GEMM grid giving up at once left no
        # record when every thread polled the record in host memory)
        with T.Kernel(528, threads=512):
            T.wait_until(sig[0], cmp="eq", value=12345)

    return hang


def run(info):
    import time

    import torch

    sig = tilescale.symm.zeros((1,), dtype=torch.uint64)
    k = never_signalled(info.world_size).prepare()
    if info.rank == 0:
        k(sig)
        try:
            tilescale.synchronize()
        except tilescale.errors.WaitTimeoutError as e:
            print(f"[rank 0] RAISED WaitTimeoutError: {e}", flush=True)
            time.sleep(5)  # let the watchdogs of the other ranks see it
            raise SystemExit(3) from None
    else:
        # Wait on the host, not in a device barrier (that is bounded too and would time out on its own, before
        # rank 0's wait does): only the watchdog, told by rank 0, can end this.
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:
            time.sleep(0.05)
        torch.cuda.synchronize()
    print(f"[rank {info.rank}] UNEXPECTED: no timeout", flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: None)
