"""The bad-input matrix on N ranks: each case must raise a clear error on every rank, without a hang, and
good calls must still work after all of them. Every rank prints '[rank R] OK: <case>: ...' for each case
that behaved, and '[rank R] OK: bad-input matrix, N cases' at the end. Run by tests/test_gpu_runtime.py."""
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


CASES = []


def expect(rank, case, exc_type, fn, *needles):
    CASES.append(case)
    try:
        fn()
    except exc_type as e:
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        if missing:
            raise AssertionError(f"[rank {rank}] {case}: message lacks {missing}: {msg}") from e
        testing.say(f"[rank {rank}] OK: {case}: {type(e).__name__}: {msg.splitlines()[0][:160]}")
        return
    raise AssertionError(f"[rank {rank}] {case}: no {getattr(exc_type, '__name__', exc_type)} raised")


def shard_x(rank, dev):  # the inputs of rank `rank`, reproducible on every rank (references without NCCL)
    import torch

    return torch.randn(256, 64, generator=torch.Generator().manual_seed(100 + rank)).to(torch.bfloat16).to(dev)


def shard_a(rank, dev):
    import torch

    return torch.randn(256, 256, generator=torch.Generator().manual_seed(200 + rank)).to(torch.bfloat16).to(dev)


def op_matrix(r, W):
    """Construction-time and call-time checks of the ops (tilescale/ops/checks.py): every rank raises the
    same clear error (agreed across ranks before anyone waits), or, where only one rank's arguments are
    bad, that rank its error and the others a CollectiveMismatchError naming it."""
    import torch

    ops = tilescale.ops
    OAE, OTE, CME = errors.OpArgumentError, errors.OpArgumentTypeError, errors.CollectiveMismatchError
    every = f"[failed on rank(s) {', '.join(map(str, range(W)))} of {W}; this is rank {r}]"
    bf, dev = torch.bfloat16, torch.device("cuda", torch.cuda.current_device())

    # construction time
    expect(r, "AllGather int shape", OTE, lambda: ops.AllGather(5, bf), "AllGather: shape: got 5, expected a "
           "sequence of ints", every)
    expect(r, "AllGather float shape", OTE, lambda: ops.AllGather((2.5, 64), bf), "AllGather: shape: got (2.5, 64)",
           "size 0 is float 2.5", every)
    expect(r, "AllGather zero rows", OAE, lambda: ops.AllGather((0, 64), bf), "AllGather: shape: got (0, 64)", every)
    expect(r, "AGGemm int8", OAE, lambda: ops.AGGemm(256 * W, 512, 256, torch.int8), "AGGemm: dtype: got torch.int8",
           "torch.bfloat16, torch.float16", every)
    expect(r, "AGGemm float K", OTE, lambda: ops.AGGemm(256 * W, 512, 256.0, bf), "AGGemm: K: got 256.0", every)
    expect(r, "GemmRS float32", OAE, lambda: ops.GemmRS(256 * W, 512, 256, torch.float32),
           "GemmRS: dtype: got torch.float32", every)
    expect(r, "GemmRS K=0", OAE, lambda: ops.GemmRS(256 * W, 512, 0, bf), "GemmRS: K_local: got 0", every)
    expect(r, "AllReduce algo", OAE, lambda: ops.AllReduce((4096,), bf, algo="ring"), "AllReduce: algo: got 'ring'",
           every)
    expect(r, "ReduceScatter rows", OAE, lambda: ops.ReduceScatter((W * 64 + 1,), bf),
           "ReduceScatter: shape", f"divisible by the world size {W}", every)
    expect(r, "AllToAll float shape", OTE, lambda: ops.AllToAll((W * 8, 2.0), bf), "AllToAll: shape: got", every)
    expect(r, "Broadcast src", OAE, lambda: ops.Broadcast((64,), bf, W), "Broadcast: src: got", every)
    expect(r, "symm.empty float size", OTE, lambda: tilescale.symm.empty((2.5,), dtype=torch.float32),
           "symm.empty: shape: got (2.5,)")
    expect(r, "symm.empty negative size", OAE, lambda: tilescale.symm.empty((4, -1), dtype=torch.float32),
           "symm.empty: shape: got (4, -1), expected non-negative sizes")

    # call time: ops built with good arguments, called with bad ones
    ag = ops.AllGather((256, 64), bf)
    agg = ops.AGGemm(256 * W, 512, 256, bf)
    grs = ops.GemmRS(256 * W, 512, 256, bf)
    ar = ops.AllReduce((4096,), bf)
    rs = ops.ReduceScatter((W * 1024,), bf)
    a2a = ops.AllToAll((W * 64, 32), bf)
    bc = ops.Broadcast((4096,), bf, 0)
    x, a = shard_x(r, dev), shard_a(r, dev)
    b = torch.randn(256, 512, generator=torch.Generator().manual_seed(1234)).to(bf).to(dev)
    expect(r, "AllGather x shape", OAE, lambda: ag(torch.zeros(256, 65, dtype=bf, device=dev)),
           "AllGather: x: got a bfloat16 tensor of shape (256, 65)", "expected a bfloat16 tensor of shape (256, 64)",
           every)
    expect(r, "AllGather x dtype", OAE, lambda: ag(x.float()), "AllGather: x: got a float32 tensor", every)
    expect(r, "AllGather x on the CPU", OAE, lambda: ag(x.cpu()), "AllGather: x:", "on cpu", f"on {dev}", every)
    expect(r, "AllGather out shape", OAE, lambda: ag(x, out=torch.empty(W * 256, 32, dtype=bf, device=dev)),
           "AllGather: out: got a bfloat16 tensor of shape", f"expected a bfloat16 tensor of shape ({W * 256}, 64)",
           every)
    expect(r, "AllGather out dtype", OAE, lambda: ag(x, out=torch.empty(W * 256, 64, device=dev)),
           "AllGather: out: got a float32 tensor", every)
    expect(r, "AGGemm out shape", OAE, lambda: agg(a, b, out=torch.empty(256 * W, 256, dtype=bf, device=dev)),
           "AGGemm: out: got a bfloat16 tensor of shape", f"expected a contiguous, 16-byte aligned bfloat16 tensor of "
           f"shape ({256 * W}, 512) on {dev}", every)
    expect(r, "AGGemm b not contiguous", OAE, lambda: agg(a, b.t().contiguous().t()), "AGGemm: b:", "not contiguous",
           every)
    expect(r, "AGGemm b dtype", OAE, lambda: agg(a, b.half()), "AGGemm: b: got a float16 tensor", every)
    expect(r, "AGGemm out misaligned", OAE,
           lambda: agg(a, b, out=torch.empty(256 * W * 512 + 1, dtype=bf, device=dev)[1:].view(256 * W, 512)),
           "AGGemm: out:", "not 16-byte aligned", every)
    xr = torch.randn(256 * W, 256, device=dev).to(bf)
    expect(r, "GemmRS out shape", OAE, lambda: grs(xr, b, out=torch.empty(256 * W, 512, dtype=bf, device=dev)),
           "GemmRS: out: got a bfloat16 tensor of shape", "expected a contiguous", every)
    expect(r, "GemmRS x not contiguous", OAE, lambda: grs(xr.t().contiguous().t(), b), "GemmRS: x:", "not contiguous",
           every)
    expect(r, "AllReduce x dtype", OAE, lambda: ar(torch.zeros(4096, device=dev)), "AllReduce: x: got a float32", every)
    expect(r, "AllReduce x on the CPU", OAE, lambda: ar(torch.zeros(4096, dtype=bf)), "AllReduce: x:", "on cpu", every)
    expect(r, "ReduceScatter out shape", OAE,
           lambda: rs(torch.zeros(W * 1024, dtype=bf, device=dev), out=torch.empty(W * 1024, dtype=bf, device=dev)),
           "ReduceScatter: out:", "expected a bfloat16 tensor of shape (1024,)", every)
    expect(r, "AllToAll x shape", OAE, lambda: a2a(torch.zeros(W * 64, 16, dtype=bf, device=dev)), "AllToAll: x:",
           every)
    expect(r, "Broadcast x dtype", OAE, lambda: bc(torch.zeros(4096, dtype=torch.float16, device=dev)),
           "Broadcast: x: got a float16", every)
    # the torch-like functions
    expect(r, "all_gather on the CPU", OAE, lambda: ops.all_gather(x.cpu()), "all_gather: x:", "on cpu", every)
    expect(r, "all_gather_into_tensor output shape", OAE,
           lambda: ops.all_gather_into_tensor(torch.empty(256, 64, dtype=bf, device=dev), x),
           "all_gather_into_tensor: output:", f"shape ({W * 256}, 64)", every)
    expect(r, "ag_gemm on the CPU", OAE, lambda: ops.ag_gemm(a.cpu(), b.cpu()), "ag_gemm: a_local:", "on cpu", every)
    expect(r, "gemm_rs int dtype", OAE, lambda: ops.gemm_rs(xr.int(), b.int()), "gemm_rs: x: got a int32", every)
    expect(r, "all_reduce int dtype", OAE, lambda: ops.all_reduce(torch.zeros(64, dtype=torch.int32, device=dev)),
           "all_reduce: tensor: got torch.int32", every)
    expect(r, "broadcast src", OAE, lambda: ops.broadcast(torch.zeros(64, device=dev), W), "broadcast: src: got",
           every)
    # only rank 1 passes a bad `out`: it raises its error, every other rank a CollectiveMismatchError naming it
    # (the signature is new on every rank, so every rank agrees before launching)
    good_out = torch.empty(W * 256, 64, dtype=bf, device=dev)
    bad_out = torch.empty(W * 256, 64, dtype=torch.float16, device=dev)
    expect(r, "AllGather out bad on rank 1 only", OAE if r == 1 else CME,
           lambda: ag(x, out=bad_out if r == 1 else good_out),
           *(("AllGather: out: got a float16", "failed on rank(s) 1 of") if r == 1 else
             ("AllGather: invalid arguments on rank(s) 1: rank 1: AllGather: out: got a float16", f"this is rank {r}")))
    return ag, agg, ar, x, a, b


def good_calls(r, W, ag, agg, ar, x, a, b):
    """After the matrix nothing is lost: the ops built before it still give the right results, also when
    the stream changes between two calls (ordered, not a race)."""
    import torch

    ref = torch.cat([shard_x(p, x.device) for p in range(W)])
    testing.check_close("AllGather after the matrix", ag(x).clone(), ref, r)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):            # a change of stream: ordered after the previous call
        got = ag(x).clone()
    torch.cuda.current_stream().wait_stream(side)
    testing.check_close("AllGather on another stream", got, ref, r)
    out = torch.empty(W * 256, 64, dtype=x.dtype, device=x.device)
    testing.check_close("AllGather out= after the matrix", ag(x, out=out), ref, r)
    t = torch.full((4096,), float(r + 1), dtype=torch.bfloat16, device=x.device)
    testing.check_close("AllReduce after the matrix", ar(t), torch.full_like(t, W * (W + 1) / 2), r)
    a_full = torch.cat([shard_a(p, a.device) for p in range(W)])
    want = (a_full.float() @ b.float()).to(a.dtype)
    testing.check_close("AGGemm after the matrix", agg(a, b), want, r, atol=0.5, rtol=0.05)
    testing.say(f"[rank {r}] OK: good calls after the matrix")


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
               lambda: tilescale.compile(put_kernel.get_tir(1024, W), target={"kind": "cuda", "arch": other},  # noqa: B023  (called at once, in this iteration)
                                         world_size=W),
               other, f"{cap[0]}.{cap[1]}", device_arch(cap), "target=", "TILESCALE_TARGET")
    built = op_matrix(r, W)
    k(src, x)  # a good call still works after all of the above
    good_calls(r, W, *built)
    tilescale.synchronize()
    testing.say(f"[rank {r}] OK: bad-input matrix, {len(CASES)} cases")


if __name__ == "__main__":
    testing.example_main(run, lambda ws: None)
