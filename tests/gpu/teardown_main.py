"""Teardown on N ranks, run by tests/test_gpu_teardown.py through launch.sh: how a job ends.

    GPUS=2 bash launch.sh tests/gpu/teardown_main.py MODE

Every rank allocates symmetric tensors, runs a ring of put+signal+wait kernels (a collective: each
rank's kernel spins until the previous rank's signal arrives), checks the result against torch, prints
``[rank R] RUNNING pid=P`` and then, by MODE:

* ``normal``: a few more rounds, prints ``[rank R] OK: normal exit``; example_main finalises;
* ``atexit``: the same without example_main and without finalize: the at-exit hook frees everything;
* ``raise_all``: every rank raises RuntimeError (a bad input every rank sees);
* ``raise_one``: rank 1 raises; the other ranks go on calling the ring, whose kernels now wait forever
  for rank 1 (the job must still end: torchrun stops them once rank 1 has exited);
* ``raise_one_bare``: the same without example_main (a user script with an uncaught exception);
* ``loop``: rounds until killed (the Ctrl-C and SIGHUP tests), at most 300 s;
* ``never_barrier``: rank 0 never joins the next tilescale.barrier() (it sleeps); the others' barrier gives
  up after TILESCALE_WAIT_TIMEOUT_S and every rank is stopped;
* ``caught_exit``: rank 1 catches an error and leaves normally (SystemExit(0): example_main finalises, a
  collective teardown the others never join); the others wait in their ring kernels until the bound;
* ``kill9``: rank 1 kills itself with SIGKILL (nothing of it runs after);
* ``ag_skip``: AG+GEMM calls, of which rank 1 skips one: the other ranks' last call waits on a copy stream for
  rank 1's ``ready`` flag, which never comes (a stream wait, bounded by the watchdog:
  tilescale/runtime/stream_waits.py);
* ``ag_loop``: AG+GEMM calls until stopped, at most 300 s (the test SIGSTOPs rank 1 mid-call).
"""
import os
import sys
import time

import torch

import tilescale
import tilescale.language as T
from tilescale import testing
from tilescale.env import settings

N = 1 << 16
MODES = ("normal", "atexit", "raise_all", "raise_one", "raise_one_bare", "loop", "never_barrier", "caught_exit",
         "kill9", "ag_skip", "ag_loop")


@tilescale.jit
def ring_kernel(n: int, world_size: int):
    @T.prim_func
    def ring(src: T.Tensor((n,), "float32"), recv: T.Tensor((n,), "float32"), sig: T.Tensor((1,), "uint64"),
             epoch: T.uint64):
        with T.Kernel(1, threads=256):
            nxt = (T.get_rank() + 1) % world_size
            T.put_signal_block(src, recv, sig[0], value=epoch, dst_pe=nxt)
            T.wait_until(sig[0], cmp="ge", value=epoch)   # ge: the previous rank may be a round ahead

    return ring


def shard(rank: int, rnd: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + rnd)
    return torch.randn(N, generator=g)


class Ring:
    def __init__(self, info):
        self.info = info
        self.recv = tilescale.symm.empty((N,), dtype=torch.float32)
        self.sig = tilescale.symm.zeros((1,), dtype=torch.uint64)
        self.spare = [tilescale.symm.zeros((1 << 20,), dtype=torch.float32) for _ in range(3)]  # freed at exit
        self.kernel = ring_kernel(N, info.world_size)
        self.kernel.prepare()
        self.epoch = 0

    def round(self, src) -> None:
        self.epoch += 1
        self.kernel(src, self.recv, self.sig, self.epoch)

    def checked_round(self, rnd: int) -> None:
        r, W = self.info.rank, self.info.world_size
        self.recv.fill_(float("nan"))
        tilescale.barrier()                       # nobody puts before every rank poisoned its buffer
        self.round(shard(r, rnd).cuda())
        tilescale.synchronize()
        testing.check_close(f"ring round {rnd}", self.recv.cpu(), shard((r - 1) % W, rnd), r)
        tilescale.barrier()


def ag_gemm_fault(info, mode: str) -> None:
    """``ag_skip`` / ``ag_loop`` (module docstring), once every rank built the op and made two good calls."""
    r, W = info.rank, info.world_size
    M, N, K = 256 * W, 256, 256
    op = tilescale.ops.AGGemm(M, N, K, torch.bfloat16)
    a = torch.randn(M // W, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        op(a, b)
    tilescale.synchronize()
    tilescale.barrier()
    tilescale.synchronize()
    print(f"[rank {r}] AGGEMM pid={os.getpid()}", flush=True)
    if mode == "ag_skip":
        for i in range(6):
            if not (r == 1 and i == 3):
                op(a, b)
        tilescale.synchronize()      # the ranks that made the call rank 1 skipped: stopped within the bound
        print(f"[rank {r}] calls issued and synchronized", flush=True)
        if r == 1:   # rank 1 stays up (a slow rank, not a failed one) past the others' bound: their stream waits give
            # up first and the launcher then stops it (its finalize, bounded alike, would otherwise race them: on
            # ranks sharing a GPU it reached its bound first and the job ended on its error, not theirs)
            time.sleep(4 * settings.wait_timeout_s)
        return
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for _ in range(10):
            op(a, b)
        tilescale.synchronize()
    print(f"[rank {r}] UNEXPECTED: still running after 300 s", flush=True)


def work(info, mode: str) -> None:
    r = info.rank
    ring = Ring(info)
    src = shard(r, 0).cuda()
    ring.checked_round(1)
    for _ in range(50):
        ring.round(src)
    ring.checked_round(2)
    print(f"[rank {r}] RUNNING pid={os.getpid()}", flush=True)
    if mode.startswith("ag_"):
        ag_gemm_fault(info, mode)
        return
    if mode in ("normal", "atexit"):
        for _ in range(50):
            ring.round(src)
        ring.checked_round(3)
        print(f"[rank {r}] OK: {mode} exit", flush=True)
        return
    if mode == "raise_all" or (mode.startswith("raise_one") and r == 1):
        time.sleep(0.5)
        raise RuntimeError(f"teardown_main: intentional failure on rank {r}")
    if mode == "never_barrier":
        if r == 0:
            time.sleep(120)                      # stopped long before: another rank's barrier gives up
            print(f"[rank {r}] UNEXPECTED: not stopped while skipping a barrier", flush=True)
            return
        tilescale.barrier()
        tilescale.synchronize()                  # raises WaitTimeoutError after the bound
        print(f"[rank {r}] UNEXPECTED: a barrier without rank 0 completed", flush=True)
        return
    if mode == "caught_exit" and r == 1:
        try:
            raise ValueError("teardown_main: an error rank 1 catches")
        except ValueError as e:
            print(f"[rank {r}] caught {e}; leaving normally", flush=True)
        raise SystemExit(0)
    if mode == "kill9" and r == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), 9)
    deadline = time.monotonic() + 300             # loop / raise_one / caught_exit / kill9: the ranks that go on
    while time.monotonic() < deadline:
        for _ in range(20):
            ring.round(src)
        torch.cuda.synchronize()
    print(f"[rank {r}] UNEXPECTED: still running after 300 s", flush=True)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "normal"
    if mode not in MODES:
        raise SystemExit(f"teardown_main.py: mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode in ("atexit", "raise_one_bare") and not _compile_only():
        info = tilescale.init_distributed()
        work(info, mode)                          # no finalize: left to tilescale's at-exit hook
        return
    testing.example_main(lambda info: work(info, mode), lambda ws: print(ring_kernel.build(N, ws).library))


def _compile_only() -> bool:
    from tilescale.env import settings

    return settings.compile_only


if __name__ == "__main__":
    main()
