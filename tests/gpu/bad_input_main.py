"""The bad-input matrix on N ranks: each case must raise a clear error on every rank, without a hang.
Every rank prints '[rank R] OK: <case>' for each case that behaved. Run by tests/test_gpu_runtime.py."""
import tilescale
import tilescale.language as T
from tilescale import errors, testing


@tilescale.jit
def put_kernel(n: int, world_size: int):
    @T.prim_func
    def put(src: T.Tensor((n,), "float32"), dst: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=128):
            T.put_block(src, dst, dst_pe=(T.get_rank() + 1) % world_size)

    return put


def expect(rank, case, exc_type, fn, *needles):
    try:
        fn()
    except exc_type as e:
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        if missing:
            raise AssertionError(f"[rank {rank}] {case}: message lacks {missing}: {msg}") from e
        print(f"[rank {rank}] OK: {case}: {type(e).__name__}: {msg.splitlines()[0][:160]}", flush=True)
        return
    raise AssertionError(f"[rank {rank}] {case}: no {exc_type.__name__} raised")


def run(info):
    import torch

    r, W = info.rank, info.world_size
    expect(r, "init_distributed twice", errors.AlreadyInitializedError, tilescale.init_distributed, "already")
    expect(r, "different sizes on different ranks", errors.SymmetricMismatchError,
           lambda: tilescale.symm.empty((1024 + r,), dtype=torch.float32), "rank 0", "rank 1")
    k = put_kernel(1024, W)
    src = torch.randn(1024, device="cuda")
    not_symm = torch.empty(1024, device="cuda")
    expect(r, "non-symmetric tensor to a remote op", errors.NotSymmetricError, lambda: k(src, not_symm),
           "dst", "symmetric heap", "tilescale.symm.empty")
    x = tilescale.symm.empty((1024,), dtype=torch.float32)
    expect(r, "peer index out of range", ValueError, lambda: tilescale.get_remote_ptr(x, W), "pe", str(W))
    wrong = put_kernel(1024, W + 1)
    expect(r, "world size differs from the kernel's", errors.WorldSizeMismatchError, lambda: wrong(src, x),
           f"world_size={W + 1}", f"{W} ranks")
    expect(r, "symmetric heap exhausted", errors.SymmetricHeapExhaustedError,
           lambda: tilescale.symm.empty((1 << 40,), dtype=torch.uint8), "NVSHMEM_SYMMETRIC_SIZE")
    y = tilescale.symm.empty((16,), dtype=torch.float32)
    tilescale.symm.free(y)
    expect(r, "freeing twice", errors.NotSymmetricError, lambda: tilescale.symm.free(y), "freed twice")
    # a collective called with different shapes / dtypes on different ranks (checked before allocating)
    expect(r, "AllGather shape differs across ranks", errors.CollectiveMismatchError,
           lambda: tilescale.ops.AllGather((256, 64 + 64 * r), torch.bfloat16), "AllGather", "shape",
           "rank 0: (256, 64)", "rank 1: (256, 128)")
    expect(r, "AllGather dtype differs across ranks", errors.CollectiveMismatchError,
           lambda: tilescale.ops.AllGather((256, 64), torch.float32 if r else torch.bfloat16), "AllGather",
           "dtype", "torch.bfloat16", "torch.float32")
    expect(r, "AGGemm shape differs across ranks", errors.CollectiveMismatchError,
           lambda: tilescale.ops.AGGemm(256 * W, 512, 256 * (1 + r), torch.bfloat16), "AGGemm", "argument(s) K",
           "rank 0: 256", "rank 1: 512")
    expect(r, "AGGemm dtype differs across ranks", errors.CollectiveMismatchError,
           lambda: tilescale.ops.AGGemm(256 * W, 512, 256, torch.float16 if r else torch.bfloat16), "AGGemm",
           "dtype", "torch.float16", "torch.bfloat16")
    # a kernel compiled for another GPU architecture: refused before it is built or loaded
    from tilescale.compiler import ArchMismatchError, code_runs_on, device_arch

    cap = torch.cuda.get_device_capability()
    for other in [a for a in ("sm_80", "sm_100a", "sm_90a") if not code_runs_on(a, cap)][:2]:
        expect(r, f"kernel built for {other}", ArchMismatchError,
               lambda: tilescale.compile(put_kernel.get_tir(1024, W), target={"kind": "cuda", "arch": other},
                                         world_size=W),
               other, f"{cap[0]}.{cap[1]}", device_arch(cap), "target=", "TILESCALE_TARGET")
    k(src, x)  # a good call still works after all of the above
    tilescale.synchronize()
    print(f"[rank {r}] OK: bad-input matrix", flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: None)
