"""The argument checks of the ops and collectives (tilescale/ops/checks.py) on a machine without a GPU:
the helpers' messages, construction-time checks of every op (and symm.empty), call-time checks (before
anything is launched), the agreement of check results across ranks (a fake runtime plays the other ranks),
signature caching (an agreed signature is not exchanged again) and the stream rule. The same checks on
real GPUs and ranks: tests/gpu/bad_input_main.py."""
import types

import pytest

torch = pytest.importorskip("torch")

from tilescale import errors, runtime, symm  # noqa: E402
from tilescale.errors import CollectiveMismatchError, OpArgumentError, OpArgumentTypeError  # noqa: E402
from tilescale.ops import all_to_all, allgather, allreduce, base, checks, reduce_scatter, reduce_to_root, vectors  # noqa: E402
from tilescale.ops import allgather_gemm as ag_gemm  # noqa: E402
from tilescale.ops import allgather_hierarchical as ag_hier  # noqa: E402
from tilescale.ops import broadcast_from_root as broadcast  # noqa: E402
from tilescale.ops import gemm_reduce_scatter as gemm_rs  # noqa: E402
from tilescale.ops import reduce_scatter_hierarchical as rs_hier  # noqa: E402

CPU = torch.device("cpu")


class FakeRuntime:
    """Rank `rank` of `world_size`; ``others(obj)`` is what every other rank contributes to an all_gather
    (default: the same as this rank). Records what was exchanged."""

    def __init__(self, world_size=2, rank=0, others=None):
        self.info = runtime.DistInfo(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size)
        self.others = others or (lambda obj: obj)
        self.exchanged = []

    def all_gather_object(self, obj):
        self.exchanged.append(obj)
        return [obj if r == self.info.rank else self.others(obj) for r in range(self.info.world_size)]

    def agree(self, what, value):
        vals = self.all_gather_object(value)
        if any(v != vals[0] for v in vals):
            raise errors.SymmetricMismatchError(f"{what}: ranks disagree: {vals}")


@pytest.fixture
def fake(monkeypatch):
    def use(**kw):
        rt = FakeRuntime(**kw)
        monkeypatch.setattr(runtime, "current", lambda: rt)
        monkeypatch.setattr(symm, "current", lambda: rt)
        monkeypatch.setattr(vectors, "sm_count", lambda: 132)
        return rt

    return use


# ------------------------------------------------------------------------------------------ helpers
def test_errors_are_value_errors_and_type_errors():
    assert issubclass(OpArgumentError, ValueError) and issubclass(OpArgumentError, errors.TileScaleError)
    assert issubclass(OpArgumentTypeError, TypeError) and issubclass(OpArgumentTypeError, OpArgumentError)


def test_as_int():
    assert checks.as_int("Op", "n", 3) == 3 and checks.as_int("Op", "n", None, allow_none=True) is None
    import numpy as np

    assert checks.as_int("Op", "n", np.int64(4)) == 4
    with pytest.raises(OpArgumentTypeError, match=r"^Op: n: got 2\.5, expected an int >= 1$"):
        checks.as_int("Op", "n", 2.5)
    with pytest.raises(OpArgumentTypeError, match=r"Op: n: got True, expected an int"):
        checks.as_int("Op", "n", True)
    with pytest.raises(OpArgumentTypeError, match=r"Op: n: got '4'"):
        checks.as_int("Op", "n", "4")
    with pytest.raises(OpArgumentError, match=r"Op: n: got 0, expected an int >= 1"):
        checks.as_int("Op", "n", 0)
    with pytest.raises(OpArgumentError, match=r"Op: n: got 9, expected an int in \[0, 8\]"):
        checks.as_int("Op", "n", 9, lo=0, hi=8)


def test_as_shape():
    assert checks.as_shape("Op", "shape", [2, 3]) == (2, 3)
    assert checks.as_shape("Op", "shape", torch.Size([4])) == (4,)
    assert checks.as_shape("Op", "shape", 5, allow_int=True) == (5,)
    with pytest.raises(OpArgumentTypeError, match=r"Op: shape: got 5, expected a sequence of ints"):
        checks.as_shape("Op", "shape", 5)
    with pytest.raises(OpArgumentTypeError, match=r"Op: shape: got \(2\.5, 4\), expected a sequence of ints "
                                                  r"\(size 0 is float 2\.5\)"):
        checks.as_shape("Op", "shape", (2.5, 4))
    with pytest.raises(OpArgumentTypeError, match=r"size 1 is bool True"):
        checks.as_shape("Op", "shape", (2, True))
    with pytest.raises(OpArgumentTypeError, match=r"Op: shape: got 'ab', expected a sequence of ints"):
        checks.as_shape("Op", "shape", "ab")
    with pytest.raises(OpArgumentError, match=r"Op: shape: got \(4, -1\), expected sizes >= 0"):
        checks.as_shape("Op", "shape", (4, -1))
    with pytest.raises(OpArgumentError, match=r"Op: shape: got \(4, 0\), expected sizes >= 1"):
        checks.as_shape("Op", "shape", (4, 0), lo=1)
    with pytest.raises(OpArgumentError, match=r"Op: shape: got \(\), expected at least 1 dimension"):
        checks.as_shape("Op", "shape", (), min_dims=1)


def test_as_dtype_and_choice():
    assert checks.as_dtype("Op", "dtype", torch.float16, checks.GEMM_DTYPES) is torch.float16
    with pytest.raises(OpArgumentTypeError, match=r"Op: dtype: got 'bf16', expected a torch.dtype"):
        checks.as_dtype("Op", "dtype", "bf16")
    with pytest.raises(OpArgumentError, match=r"Op: dtype: got torch.int8, expected one of torch.bfloat16, "
                                              r"torch.float16 \(why\)$"):
        checks.as_dtype("Op", "dtype", torch.int8, checks.GEMM_DTYPES, note=" (why)")
    assert checks.as_choice("Op", "algo", "b", ("a", "b")) == "b"
    with pytest.raises(OpArgumentError, match=r"Op: algo: got 'c', expected one of 'a', 'b'"):
        checks.as_choice("Op", "algo", "c", ("a", "b"))


def test_check_tensor_messages():
    t = torch.zeros(8, 4)
    checks.check_tensor("Op", "x", t, shape=(8, 4), dtype=torch.float32, device=CPU, contiguous=True, aligned=True)
    with pytest.raises(OpArgumentError, match=r"^Op: out: got a float32 tensor of shape \(8, 4\) on cpu, expected a "
                                              r"contiguous, 16-byte aligned bfloat16 tensor of shape \(8, 2\) on cpu$"):
        checks.check_tensor("Op", "out", t, shape=(8, 2), dtype=torch.bfloat16, device=CPU, contiguous=True,
                            aligned=True)
    with pytest.raises(OpArgumentError, match=r"got a float32 tensor of shape \(4, 8\) on cpu with strides \(1, 4\) "
                                              r"\(not contiguous\), expected a contiguous float32 tensor"):
        checks.check_tensor("Op", "b", t.t(), shape=(4, 8), dtype=torch.float32, device=CPU, contiguous=True)
    checks.check_tensor("Op", "b", t.t(), shape=(4, 8), dtype=torch.float32, device=CPU)   # strides: not asked
    with pytest.raises(OpArgumentError, match=r"at address 0x[0-9a-f]+ \(not 16-byte aligned\), expected a "
                                              r"contiguous, 16-byte aligned"):
        checks.check_tensor("Op", "b", t.view(-1)[1:5], shape=(4,), dtype=torch.float32, device=CPU,
                            contiguous=True, aligned=True)
    with pytest.raises(OpArgumentError, match=r"got a float32 tensor of shape \(8, 4\) on cpu, expected a float32 "
                                              r"tensor of shape \(8, 4\) on cuda:3"):
        checks.check_tensor("Op", "x", t, shape=(8, 4), dtype=torch.float32, device=torch.device("cuda", 3))
    with pytest.raises(OpArgumentTypeError, match=r"Op: x: got list \[1, 2\], expected a CUDA tensor"):
        checks.check_tensor("Op", "x", [1, 2], device=CPU)
    with pytest.raises(OpArgumentTypeError, match=r"Op: x: got None"):
        checks.check_tensor("Op", "x", None, device=CPU)
    with pytest.raises(OpArgumentError, match=r"expected a CUDA tensor of dtype torch.bfloat16 / torch.float16"):
        checks.check_tensor("Op", "x", t, dtypes=checks.GEMM_DTYPES, device=CPU)
    with pytest.raises(OpArgumentError, match=r"with at least 2 dimension"):
        checks.check_tensor("Op", "x", t.view(-1), min_dims=2, device=CPU)


def test_signature_covers_what_the_checks_read():
    t = torch.zeros(8, 4)
    assert checks.signature(t) == (torch.Tensor, torch.float32, torch.Size([8, 4]), CPU)
    assert checks.signature(t) != checks.signature(t.half())
    assert checks.signature(t, True) != checks.signature(t.t().contiguous().t(), True)   # contiguity
    assert checks.signature(t.view(-1)[1:5], True)[-1] == 4                              # address mod 16
    assert checks.signature([1]) == (list,) and checks.signature(None) == (type(None),)


# ------------------------------------------------------------------------------------ agreement
def test_agree_ok_and_failures(fake):
    rt = fake(world_size=3, rank=0)
    checks.agree("Op", None)
    assert rt.exchanged == [None]
    with pytest.raises(OpArgumentError, match=r"Op: x: bad \[failed on rank\(s\) 0, 1, 2 of 3; this is rank 0\]"):
        checks.agree("Op", OpArgumentError("Op: x: bad"))
    # this rank's arguments are fine, rank 1's and 2's are not: this rank raises too, naming them
    fake(world_size=3, rank=0, others=lambda obj: "Op: out: got something else")
    with pytest.raises(CollectiveMismatchError, match=r"Op: invalid arguments on rank\(s\) 1, 2: rank 1: Op: out: "
                                                      r"got something else; rank 2: .*this is rank 0"):
        checks.agree("Op", None)


def test_agree_without_runtime_raises_locally(monkeypatch):
    def none():
        raise errors.NotInitializedError("no runtime")

    monkeypatch.setattr(runtime, "current", none)
    checks.agree("Op", None)
    with pytest.raises(OpArgumentError, match="^Op: x: bad$"):
        checks.agree("Op", OpArgumentError("Op: x: bad"))


def test_call_check_caches_agreed_signatures(fake):
    rt = fake(world_size=2)
    cc = checks.CallCheck("Op")
    seen = []

    def validate(v):
        seen.append(v)
        if v < 0:
            raise OpArgumentError(f"Op: v: got {v}, expected >= 0")

    cc(("a",), validate, 1)
    cc(("a",), validate, 1)              # agreed before: no check, no exchange
    assert seen == [1] and cc.exchanges == 1 and len(rt.exchanged) == 1
    cc(("b",), validate, 2)              # a new signature: checked and agreed once
    assert seen == [1, 2] and len(rt.exchanged) == 2
    for _ in range(2):                   # a failing signature is never remembered: checked every time
        with pytest.raises(OpArgumentError, match=r"Op: v: got -1"):
            cc(("c",), validate, -1)
    assert len(rt.exchanged) == 4 and ("c",) not in cc.agreed
    cc(([1],), validate, 3)              # unhashable: checked and agreed each time
    cc(([1],), validate, 3)
    assert len(rt.exchanged) == 6
    # a ValueError of a shared helper becomes the op's argument error
    with pytest.raises(OpArgumentError, match=r"^Op: plain \[failed"):
        cc(("d",), lambda: (_ for _ in ()).throw(ValueError("plain")))


def test_call_check_raises_on_the_good_rank_too(fake):
    fake(world_size=2, rank=1, others=lambda obj: "Op: x: got a float32 tensor, expected bfloat16")
    cc = checks.CallCheck("Op")
    with pytest.raises(CollectiveMismatchError, match=r"invalid arguments on rank\(s\) 0: rank 0: Op: x: got"):
        cc(("k",), lambda: None)
    assert ("k",) not in cc.agreed


def test_require_same_on_all_ranks_carries_the_verdict(fake):
    rt = fake(world_size=2)
    checks.require_same_on_all_ranks("Op", None, shape=(4,), dtype=torch.bfloat16)
    assert rt.exchanged[-1] == {"shape": (4,), "dtype": "torch.bfloat16"}
    with pytest.raises(OpArgumentError, match=r"Op: shape: bad \[failed on rank\(s\) 0, 1"):
        checks.require_same_on_all_ranks("Op", OpArgumentError("Op: shape: bad"), shape=(4.5,))
    # the arguments agree, but another rank found them invalid (a check that depends on its GPU)
    fake(world_size=2, others=lambda obj: {**obj, "__error__": "Op: blocks: got 200, expected at most 66"})
    with pytest.raises(CollectiveMismatchError, match=r"invalid arguments on rank\(s\) 1: rank 1: Op: blocks"):
        checks.require_same_on_all_ranks("Op", None, blocks=200)
    # differing arguments are reported first, whatever the verdicts
    fake(world_size=2, others=lambda obj: {**obj, "shape": (5,)})
    with pytest.raises(CollectiveMismatchError, match=r"argument\(s\) shape differ"):
        checks.require_same_on_all_ranks("Op", OpArgumentError("Op: dtype: bad"), shape=(4,))
    assert checks._canon(object()) == "<object object>"      # no per-rank addresses in the exchange


# ---------------------------------------------------------------------------- construction checks
CONSTRUCTION = [
    ("AllGather int shape", lambda: allgather.AllGather(5, torch.bfloat16), OpArgumentTypeError,
     r"AllGather: shape: got 5, expected a sequence of ints"),
    ("AllGather float shape", lambda: allgather.AllGather((2.5, 4), torch.bfloat16), OpArgumentTypeError,
     r"AllGather: shape: got \(2\.5, 4\), expected a sequence of ints \(size 0 is float 2\.5\)"),
    ("AllGather zero rows", lambda: allgather.AllGather((0, 4), torch.bfloat16), OpArgumentError,
     r"AllGather: shape: got \(0, 4\), expected a non-empty shard shape"),
    ("AllGather dtype", lambda: allgather.AllGather((8,), torch.bool), OpArgumentError,
     r"AllGather: dtype: got torch.bool, expected one of torch.bfloat16"),
    ("AllGather dtype str", lambda: allgather.AllGather((8,), "bfloat16"), OpArgumentTypeError,
     r"AllGather: dtype: got 'bfloat16', expected a torch.dtype"),
    ("AllGather blocks", lambda: allgather.AllGather((8,), torch.float16, blocks_per_peer=0), OpArgumentError,
     r"AllGather: blocks_per_peer: got 0"),
    ("AllGather threads", lambda: allgather.AllGather((8,), torch.float16, threads=48), OpArgumentError,
     r"AllGather: threads: got 48, expected a multiple of 32"),
    ("AGGemm int8", lambda: ag_gemm.AGGemm(4096, 2048, 1024, torch.int8), OpArgumentError,
     r"AGGemm: dtype: got torch.int8, expected one of torch.bfloat16, torch.float16"),
    ("AGGemm float M", lambda: ag_gemm.AGGemm(4096.0, 2048, 1024, torch.bfloat16), OpArgumentTypeError,
     r"AGGemm: M: got 4096\.0, expected an int >= 1"),
    ("AGGemm K=0", lambda: ag_gemm.AGGemm(4096, 2048, 0, torch.bfloat16), OpArgumentError,
     r"AGGemm: K: got 0, expected an int >= 1"),
    ("AGGemm M multiple", lambda: ag_gemm.AGGemm(4096 + 1, 2048, 1024, torch.bfloat16), OpArgumentError,
     r"AGGemm: M: got 4097, expected a multiple of world_size = 2"),
    ("AGGemm config", lambda: ag_gemm.AGGemm(4096, 2048, 1024, torch.bfloat16, config="fast"), OpArgumentTypeError,
     r"AGGemm: config: got 'fast', expected a tilescale.ops.gemm.GemmConfig"),
    ("AGGemm chunks", lambda: ag_gemm.AGGemm(4096, 2048, 1024, torch.bfloat16, chunks=-1), OpArgumentError,
     r"AGGemm: chunks: got -1"),
    ("AGGemm profile", lambda: ag_gemm.AGGemm(4096, 2048, 1024, torch.bfloat16, profile="yes"), OpArgumentTypeError,
     r"AGGemm: profile: got 'yes', expected a bool"),
    ("AGGemm fused", lambda: ag_gemm.AGGemm(4096, 2048, 1024, torch.bfloat16, fused="no"), OpArgumentTypeError,
     r"AGGemm: fused: got 'no', expected a bool \(or None: the committed table"),
    ("GemmRS fp32", lambda: gemm_rs.GemmRS(4096, 2048, 1024, torch.float32), OpArgumentError,
     r"GemmRS: dtype: got torch.float32, expected one of torch.bfloat16, torch.float16"),
    ("GemmRS K=0", lambda: gemm_rs.GemmRS(4096, 2048, 0, torch.bfloat16), OpArgumentError,
     r"GemmRS: K_local: got 0, expected an int >= 1"),
    ("GemmRS negative N", lambda: gemm_rs.GemmRS(4096, -2048, 1024, torch.bfloat16), OpArgumentError,
     r"GemmRS: N: got -2048, expected an int >= 1"),
    ("GemmRS reduce_blocks", lambda: gemm_rs.GemmRS(4096, 2048, 1024, torch.bfloat16, reduce_blocks=132),
     OpArgumentError, r"GemmRS: reduce_blocks: got 132, expected fewer than the 132 SMs"),
    ("GemmRS path", lambda: gemm_rs.GemmRS(4096, 2048, 1024, torch.bfloat16, path="fast"),
     OpArgumentError,
     r"GemmRS: path: got 'fast', expected one of \('push', 'pull'\) or None \(the job's best: 'push'\)"),
    ("AllReduce float shape", lambda: allreduce.AllReduce((2.5,), torch.bfloat16), OpArgumentTypeError,
     r"AllReduce: shape: got \(2\.5,\), expected a sequence of ints"),
    ("AllReduce dtype", lambda: allreduce.AllReduce((8,), torch.int32), OpArgumentError,
     r"AllReduce: dtype: got torch.int32"),
    ("AllReduce algo", lambda: allreduce.AllReduce((8,), torch.float32, algo=2), OpArgumentTypeError,
     r"AllReduce: algo: got 2, expected one of 'auto'"),
    ("ReduceScatter negative", lambda: reduce_scatter.ReduceScatter((8, -1), torch.float32), OpArgumentError,
     r"ReduceScatter: shape: got \(8, -1\), expected sizes >= 0"),
    ("ReduceScatter rows", lambda: reduce_scatter.ReduceScatter((7,), torch.float32), OpArgumentError,
     r"ReduceScatter: shape: got \(7,\), expected \(rows, \.\.\.\) with rows divisible by the world size 2"),
    ("AllToAll float", lambda: all_to_all.AllToAll((8, 2.0), torch.float32), OpArgumentTypeError,
     r"AllToAll: shape: got \(8, 2\.0\)"),
    ("AllToAll scalar", lambda: all_to_all.AllToAll((), torch.float32), OpArgumentError,
     r"AllToAll: shape: got \(\), expected \(rows, \.\.\.\)"),
    ("Broadcast float src", lambda: broadcast.Broadcast((8,), torch.float32, 1.0), OpArgumentTypeError,
     r"Broadcast: src: got 1\.0, expected a rank in 0\.\.1"),
    ("Broadcast dtype", lambda: broadcast.Broadcast((8,), None, 0), OpArgumentTypeError,
     r"Broadcast: dtype: got None, expected a torch.dtype"),
    ("Reduce dst", lambda: reduce_to_root.Reduce((8,), torch.float32, 2), OpArgumentError,
     r"Reduce: dst: got 2, expected a rank in 0\.\.1"),
    ("Reduce float dst", lambda: reduce_to_root.Reduce((8,), torch.float32, 0.0), OpArgumentTypeError,
     r"Reduce: dst: got 0\.0, expected a rank in 0\.\.1"),
    ("Reduce dtype", lambda: reduce_to_root.Reduce((8,), torch.int64, 0), OpArgumentError,
     r"Reduce: dtype: got torch.int64"),
    ("Reduce float shape", lambda: reduce_to_root.Reduce((2.5,), torch.float32, 0), OpArgumentTypeError,
     r"Reduce: shape: got \(2\.5,\), expected a sequence of ints"),
    # sizes beyond what the kernels index in 32-bit integers: refused by name on every rank, before any buffer
    ("GemmRS pull M x N", lambda: gemm_rs.GemmRS(65536, 32768, 4096, torch.bfloat16, path="pull"), OpArgumentError,
     r"GemmRS: M, N: got M=65536, N=32768, K_local=4096 \(M x N \(the pull path's offset of a call's partials\): "
     r"2147483648\), expected sizes for which M x N .* is at most 2\*\*31 - 1 = 2147483647"),
    ("AllToAll bytes", lambda: all_to_all.AllToAll((2, 1 << 30), torch.float32), OpArgumentError,
     r"AllToAll: shape: got \(2, 1073741824\) \(its bytes: 8589934592\), expected sizes for which its bytes is at "
     r"most 2\*\*31 - 1"),
    ("AllReduce vectors", lambda: allreduce.AllReduce(((1 << 34) + 8,), torch.bfloat16, algo="one_shot"),
     OpArgumentError, r"AllReduce: shape: got \(17179869192,\) \(its 16-byte vectors: 2147483649\)"),
    ("ReduceScatter vectors", lambda: reduce_scatter.ReduceScatter((2, 1 << 34), torch.bfloat16), OpArgumentError,
     r"ReduceScatter: shape: got \(2, 17179869184\) \(the 16-byte vectors of a rank's slice: 2147483648\)"),
    ("Reduce vectors", lambda: reduce_to_root.Reduce(((1 << 34) + 8,), torch.bfloat16, 0), OpArgumentError,
     r"Reduce: shape: got \(17179869192,\) \(its 16-byte vectors: 2147483649\)"),
    ("ReduceScatterHierarchical vectors", lambda: rs_hier.ReduceScatterHierarchical((2, 1 << 34), torch.bfloat16),
     OpArgumentError, r"ReduceScatterHierarchical: shape: got \(2, 17179869184\) \(the 16-byte vectors of a rank's "
     r"slice: 2147483648\)"),
    ("AllGather elements", lambda: allgather.AllGather((1 << 31,), torch.int8), OpArgumentError,
     r"AllGather: shape: got \(2147483648,\) \(its elements \(the kernel's n\): 2147483648\), expected sizes for "
     r"which its elements .* is at most 2\*\*31 - 1"),
    ("AllGatherHierarchical elements", lambda: ag_hier.AllGatherHierarchical((1 << 16, 1 << 15), torch.int8),
     OpArgumentError, r"AllGatherHierarchical: shape: got \(65536, 32768\) \(its elements \(the kernel's n\): "
     r"2147483648\)"),
    ("Broadcast bytes", lambda: broadcast.Broadcast((1 << 30,), torch.float16, 0), OpArgumentError,
     r"Broadcast: shape: got \(1073741824,\) torch.float16 \(2147483648 bytes\), expected at most 2139095040 bytes"),
    # the push kernel loads rows of X by TMA: whole 16 bytes (the default path takes pull for such a K)
    ("GemmRS push K", lambda: gemm_rs.GemmRS(4096, 2048, 260, torch.bfloat16, path="push"), OpArgumentError,
     r"GemmRS: K_local: got 260, expected a multiple of 8 on the push path \(its TMA loads of X need rows of whole "
     r"16 bytes\); path='pull' or None takes any K_local"),
]


@pytest.mark.parametrize("name, build, exc, msg", CONSTRUCTION, ids=[c[0] for c in CONSTRUCTION])
def test_construction_checks(fake, name, build, exc, msg):
    rt = fake(world_size=2)
    with pytest.raises(exc, match=msg) as ei:
        build()
    assert "[failed on rank(s) 0, 1 of 2; this is rank 0]" in str(ei.value)
    # agreed before raising: the exchange carried this rank's verdict (the other ranks raise too)
    assert len(rt.exchanged) == 1 and rt.exchanged[0]["__error__"] == str(ei.value).split(" [failed")[0]


@pytest.mark.parametrize("name, build, exc, msg", CONSTRUCTION[:3] + CONSTRUCTION[7:9],
                         ids=[c[0] for c in CONSTRUCTION[:3] + CONSTRUCTION[7:9]])
def test_construction_checks_on_the_good_rank(fake, name, build, exc, msg):
    # the other rank's checks failed, this rank's passed (the same arguments: a GPU-dependent check): it
    # raises too, instead of allocating and waiting for the other rank
    def other(obj):
        return {**obj, "__error__": "X: y: got z"} if isinstance(obj, dict) else obj

    fake(world_size=2, others=other)
    rt_error = None
    try:
        build()
    except exc as e:                      # this rank's own error, if its arguments are invalid too
        rt_error = e
    assert rt_error is not None and "[failed on rank(s) 0, 1 of 2" in str(rt_error)


def test_valid_construction_passes_the_checks(fake):
    fake(world_size=2)
    # valid arguments get past every check and the agreement: what stops them here is the missing GPU / heap
    for build in (lambda: allgather.AllGather((8, 4), torch.bfloat16), lambda: allgather.AllGather([8], torch.int64),
                  lambda: ag_gemm.AGGemm(4096, 2048, 1024, torch.bfloat16),
                  lambda: gemm_rs.GemmRS(4096, 2048, 1024, torch.float16),
                  lambda: allreduce.AllReduce((8,), torch.float32),
                  lambda: reduce_scatter.ReduceScatter((8,), torch.float32),
                  lambda: all_to_all.AllToAll((8, 2), torch.int8), lambda: broadcast.Broadcast((0,), torch.bool, 1)):
        with pytest.raises(Exception) as ei:
            build()
        assert not isinstance(ei.value, (OpArgumentError, CollectiveMismatchError)), ei.value


def test_symm_empty_refuses_float_sizes(fake):
    with pytest.raises(TypeError, match=r"symm.empty: shape: got \(2\.5,\), expected a sequence of ints"):
        symm._shape((2.5,))
    assert symm._shape(4) == (4,) and symm._shape((2, 3)) == (2, 3)
    with pytest.raises(OpArgumentTypeError, match="size 0 is bool"):
        symm._shape((True,))
    rt = fake(world_size=2)
    for args, kw, exc, msg in ((((2.5,),), {}, OpArgumentTypeError, r"symm.empty: shape: got \(2\.5,\)"),
                               ((2.5,), {}, OpArgumentTypeError, r"symm.empty: shape: got 2\.5"),
                               ((4, -1), {}, OpArgumentError, r"symm.empty: shape: got \(4, -1\), expected non-neg"),
                               (((4,),), {"dtype": "floaty"}, OpArgumentTypeError, r"symm.empty: dtype: got 'floaty'")):
        n = len(rt.exchanged)
        with pytest.raises(exc, match=msg):
            symm.empty(*args, **kw)
        assert len(rt.exchanged) == n + 1 and "invalid: symm.empty" in str(rt.exchanged[-1])   # agreed first
    # one rank passes a float size, the other a valid one: both raise (the agreement sees different values)
    fake(world_size=2, others=lambda obj: (obj[0], (2,), "torch.float32"))
    with pytest.raises(errors.SymmetricMismatchError, match=r"invalid: symm.empty: shape: got \(2\.5,\)"):
        symm.empty((2.5,), dtype=torch.float32)


# -------------------------------------------------------------------------------- call-time checks
class Launched(Exception):
    """Raised where an op would enqueue GPU work: its checks passed."""


def _launch(*a, **k):
    raise Launched()


def _op(cls, monkeypatch, **attrs):
    """An op object without buffers or kernels (no GPU): its call checks run, its launch raises Launched."""
    monkeypatch.setattr(base, "_capturing", lambda: False)   # Op.begin's (no CUDA here)
    op = object.__new__(cls)
    op.device = CPU
    op._check = checks.CallCheck(cls.__name__)
    op._agreed = op._check.agreed
    op._stream = _launch
    for k, v in attrs.items():
        setattr(op, k, v)
    return op


def _calls(monkeypatch):
    t = torch.zeros
    W = 2
    ag = _op(allgather.AllGather, monkeypatch, shape=(8, 4), dtype=torch.bfloat16,
             buffers=(t(W * 8, 4, dtype=torch.bfloat16),))
    agg = _op(ag_gemm.AGGemm, monkeypatch, rows=64, K=32, N=48, M=128, dtype=torch.bfloat16, world_size=W)
    rs = _op(gemm_rs.GemmRS, monkeypatch, M=128, K=32, N=48, dtype=torch.float16, world_size=W)
    ar = _op(allreduce.AllReduce, monkeypatch, shape=(16,), _size=torch.Size([16]), dtype=torch.float32)
    red = _op(reduce_scatter.ReduceScatter, monkeypatch, shape=(16,), out_shape=(8,), _out_size=torch.Size([8]),
              dtype=torch.float32)
    a2a = _op(all_to_all.AllToAll, monkeypatch, shape=(8, 2), dtype=torch.int8, meta=None)
    bc = _op(broadcast.Broadcast, monkeypatch, shape=(8,), dtype=torch.float32)
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    good = [(ag, (t(8, 4, dtype=bf),), {}), (ag, (t(4, 8, dtype=bf).t(),), {"out": t(16, 4, dtype=bf)}),
            (agg, (t(64, 32, dtype=bf), t(32, 48, dtype=bf)), {}),
            (agg, (t(1, 32, dtype=bf), t(32, 48, dtype=bf)), {"out": t(2, 48, dtype=bf)}),   # rows under the bound
            (rs, (t(128, 32, dtype=f16), t(32, 48, dtype=f16)), {"out": t(64, 48, dtype=f16)}),
            (rs, (t(6, 32, dtype=f16), t(32, 48, dtype=f16)), {"out": t(3, 48, dtype=f16)}),
            (ar, (t(16),), {"out": t(16)}), (red, (t(16),), {}), (a2a, (t(8, 2, dtype=torch.int8),), {}),
            (bc, (t(8),), {})]
    bad = [
        (ag, (t(8, 5, dtype=bf),), {}, r"AllGather: x: got a bfloat16 tensor of shape \(8, 5\) on cpu, expected a "
                                        r"bfloat16 tensor of shape \(8, 4\) on cpu \(the shard shape"),
        (ag, (t(8, 4),), {}, r"AllGather: x: got a float32 tensor"),
        (ag, ([1, 2],), {}, r"AllGather: x: got list \[1, 2\], expected a bfloat16 tensor"),
        (ag, (t(8, 4, dtype=bf),), {"out": t(16, 3, dtype=bf)}, r"AllGather: out: got a bfloat16 tensor of shape "
                                                                 r"\(16, 3\) on cpu, expected a bfloat16 tensor of "
                                                                 r"shape \(16, 4\)"),
        (ag, (t(8, 4, dtype=bf),), {"out": t(16, 4, dtype=f16)}, r"AllGather: out: got a float16 tensor"),
        (agg, (t(64, 32, dtype=bf), t(48, 32, dtype=bf).t()), {}, r"AGGemm: b: got a bfloat16 tensor of shape "
                                                                   r"\(32, 48\) on cpu with strides \(1, 32\) \(not "
                                                                   r"contiguous\), expected a contiguous, 16-byte"),
        (agg, (t(64, 32, dtype=bf), t(32, 48, dtype=bf)), {"out": t(128, 24, dtype=bf)},
         r"AGGemm: out: got a bfloat16 tensor of shape \(128, 24\) on cpu, expected a contiguous, 16-byte aligned "
         r"bfloat16 tensor of shape \(128, 48\) on cpu"),
        (agg, (t(64, 32, dtype=bf), t(32, 48, dtype=bf)), {"out": t(128, 48, dtype=f32)},
         r"AGGemm: out: got a float32"),
        (agg, (t(64, 32, dtype=bf), t(32 * 48 + 1, dtype=bf)[1:].view(32, 48)), {},
         r"AGGemm: b: .*not 16-byte aligned"),
        (agg, (t(65, 32, dtype=bf), t(32, 48, dtype=bf)), {},
         r"AGGemm: a_local: got a bfloat16 tensor of shape \(65, 32\) on cpu, expected at most 64 rows \(the bound"),
        (agg, (t(32, 31, dtype=bf), t(32, 48, dtype=bf)), {},
         r"AGGemm: a_local: got a bfloat16 tensor of shape \(32, 31\) on cpu, expected a bfloat16 tensor of shape "
         r"\(32, 32\)"),
        (agg, (t(32, 32, dtype=bf), t(32, 48, dtype=bf)), {"out": t(128, 48, dtype=bf)},
         r"AGGemm: out: .*expected .* of shape \(64, 48\) on cpu \(world_size x the rows of a_local\)"),
        (rs, (t(130, 32, dtype=f16), t(32, 48, dtype=f16)), {},
         r"GemmRS: x: got a float16 tensor of shape \(130, 32\) on cpu, expected W x m rows, m <= M / world_size = 64"),
        (rs, (t(7, 32, dtype=f16), t(32, 48, dtype=f16)), {}, r"GemmRS: x: .*expected W x m rows"),
        (rs, (t(128, 32, dtype=f16), t(32, 48, dtype=f16)), {"out": t(128, 48, dtype=f16)},
         r"GemmRS: out: got a float16 tensor of shape \(128, 48\) on cpu, expected a contiguous, 16-byte aligned "
         r"float16 tensor of shape \(64, 48\)"),
        (rs, (t(32, 128, dtype=f16).t(), t(32, 48, dtype=f16)), {}, r"GemmRS: x: .*not contiguous"),
        (ar, (t(16, dtype=torch.float64),), {}, r"AllReduce: x: got a float64 tensor"),
        (ar, (t(16),), {"out": t(15)}, r"AllReduce: out: got a float32 tensor of shape \(15,\)"),
        (red, (t(16),), {"out": t(16)}, r"ReduceScatter: out: got a float32 tensor of shape \(16,\) on cpu, expected "
                                        r"a float32 tensor of shape \(8,\) on cpu \(rows / world_size\)"),
        (a2a, (t(8, 2),), {}, r"AllToAll: x: got a float32 tensor"),
        (a2a, (t(8, 2, dtype=torch.int8),), {"out": t(4, 2, dtype=torch.int8)}, r"AllToAll: out: got an? int8|"
                                                                                  r"AllToAll: out: got a int8"),
        (bc, (t(9),), {}, r"Broadcast: x: got a float32 tensor of shape \(9,\)"),
        (bc, (t(8),), {"out": "t"}, r"Broadcast: out: got 't'"),
    ]
    return good, bad


def test_call_checks_refuse_before_launching(fake, monkeypatch):
    rt = fake(world_size=2)
    good, bad = _calls(monkeypatch)
    for op, args, kw, msg in bad:
        n = len(rt.exchanged)
        with pytest.raises(OpArgumentError, match=msg):   # never Launched
            op(*args, **kw)
        assert len(rt.exchanged) == n + 1 and rt.exchanged[-1] is not None   # agreed (on the failure) first
    for op, args, kw in good:
        n = len(rt.exchanged)
        with pytest.raises((Launched, RuntimeError, AssertionError)) as ei:   # past the checks
            op(*args, **kw)
        assert not isinstance(ei.value, OpArgumentError), ei.value
        assert len(rt.exchanged) == n + 1 and rt.exchanged[-1] is None     # one exchange: "ok"
        with pytest.raises((Launched, RuntimeError, AssertionError)):
            op(*args, **kw)
        assert len(rt.exchanged) == n + 1                                  # the same signature: no exchange


def test_call_checks_device(fake, monkeypatch):
    fake(world_size=2)
    good, _ = _calls(monkeypatch)
    for op, args, kw in good:
        op.device = torch.device("cuda", 1)          # this rank's GPU; the tensors are on the CPU
        with pytest.raises(OpArgumentError, match=r"got a \w+ tensor of shape .* on cpu, expected .* on cuda:1"):
            op(*args, **kw)


def test_allgather_hot_path_is_one_lookup(fake, monkeypatch):
    rt = fake(world_size=2)
    good, _ = _calls(monkeypatch)
    ag, args, _ = good[0]
    validated = []
    monkeypatch.setattr(ag, "_validate", lambda *a: validated.append(a))
    for _ in range(3):
        with pytest.raises(Launched):
            ag(*args)
    assert len(validated) == 1 and len(rt.exchanged) == 1


def test_function_checks(fake, monkeypatch):
    cpu = torch.zeros(8)
    fake(world_size=2)
    cases = [
        (lambda: allgather.all_gather(cpu), r"all_gather: x: got a float32 tensor of shape \(8,\) on cpu, expected a "
                                            r"CUDA tensor of dtype torch.bfloat16 / .* on cuda"),
        (lambda: allgather.all_gather([1]), r"all_gather: x: got list"),
        (lambda: allgather.all_gather_into_tensor(cpu, cpu), r"all_gather_into_tensor: input: got a float32 tensor"),
        (lambda: ag_gemm.ag_gemm(cpu, cpu), r"ag_gemm: a_local: got a float32 tensor"),
        (lambda: gemm_rs.gemm_rs(cpu.half(), cpu.half()), r"gemm_rs: x: got a float16 tensor of shape \(8,\) on cpu"),
        (lambda: allreduce.all_reduce(cpu), r"all_reduce: tensor: got a float32 tensor"),
        (lambda: allreduce.all_reduce(cpu, op="max"), r"all_reduce: op: got 'max'"),
        (lambda: reduce_scatter.reduce_scatter_tensor(cpu, cpu), r"reduce_scatter_tensor: output: got a float32"),
        (lambda: all_to_all.all_to_all_single(cpu, cpu), r"all_to_all_single: output: got a float32"),
        (lambda: broadcast.broadcast(cpu, 0), r"broadcast: tensor: got a float32 tensor"),
        (lambda: broadcast.broadcast(cpu, 1.0), r"broadcast: tensor: got"),
        (lambda: reduce_to_root.reduce(cpu, 0), r"reduce: tensor: got a float32 tensor of shape \(8,\) on cpu"),
        (lambda: reduce_to_root.reduce(cpu, 0, op="max"), r"reduce: op: got 'max'"),
    ]
    for fn, msg in cases:
        with pytest.raises(OpArgumentError, match=msg):
            fn()
    monkeypatch.setattr(checks, "this_device", lambda: CPU)     # CPU tensors count as on "this GPU"
    for fn, msg in ((lambda: allgather.all_gather_into_tensor(torch.zeros(15), torch.zeros(8)),
                     r"all_gather_into_tensor: output: got a float32 tensor of shape \(15,\) on cpu, "
                     r"expected a float32 tensor of shape \(16,\) on cpu \(world_size x input rows\)"),
                    (lambda: allgather.all_gather(torch.zeros(0)), r"all_gather: x: got .* expected a non-empty shard"),
                    (lambda: ag_gemm.ag_gemm(torch.zeros(4, 8, dtype=torch.bfloat16),
                                             torch.zeros(4, 8, dtype=torch.bfloat16)),
                     r"ag_gemm: b: got a bfloat16 tensor of shape \(4, 8\) on cpu, expected a 2-D \(8, N\) tensor"),
                    (lambda: gemm_rs.gemm_rs(torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, 4)),
                     r"gemm_rs: w: got a float32 tensor"),
                    (lambda: reduce_scatter.reduce_scatter_tensor(torch.zeros(3), torch.zeros(8)),
                     r"reduce_scatter_tensor: output: got \(3,\) \(3 elements\)"),
                    (lambda: all_to_all.all_to_all_single(torch.zeros(7), torch.zeros(7)),
                     r"all_to_all_single: input: got 7 rows, expected a multiple of the world size 2"),
                    (lambda: broadcast.broadcast(torch.zeros(8), 2), r"broadcast: src: got 2, expected a rank in 0..1"),
                    (lambda: broadcast.broadcast(torch.zeros(8), True), r"broadcast: src: got True")):
        with pytest.raises(OpArgumentError, match=msg):
            fn()


# ------------------------------------------------------------------------------------------ streams
def test_stream_order(monkeypatch):
    log = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_event(self, ev):
            log.append(("wait", self.name, ev.on))

    class Event:
        def record(self, stream):
            self.on = stream.name
            log.append(("record", stream.name))

    current = [Stream("A")]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    monkeypatch.setattr(torch.cuda, "Event", Event)
    order = checks.StreamOrder()
    order(1)
    order(1)
    assert log == [] and order.switches == 0          # first call, same stream: nothing to order
    current[0] = Stream("B")
    order(2)                                          # B waits for everything enqueued on A
    assert log == [("record", "A"), ("wait", "B", "A")] and order.switches == 1
    order(2)
    assert len(log) == 2
    current[0] = Stream("A")
    order(1)
    assert log[2:] == [("record", "B"), ("wait", "A", "B")]


def test_ops_order_a_change_of_stream(fake, monkeypatch):
    # AllGather, AllReduce, ReduceScatter, AllToAll, Broadcast read the current stream on every call and
    # order a change of it before they enqueue anything
    fake(world_size=2)
    good, _ = _calls(monkeypatch)
    seen = []

    class Order(checks.StreamOrder):
        def switch(self, handle):
            seen.append(handle)
            raise Launched()

    for op, args, kw in good:
        if isinstance(op, (ag_gemm.AGGemm, gemm_rs.GemmRS)):
            continue                                  # they read torch.cuda.current_stream() (needs a GPU)
        op._order = Order()
        op._stream = lambda: 77
        with pytest.raises(Launched):
            op(*args, **kw)
    assert seen == [77] * 6


def test_gemm_rs_push_is_refused_where_the_job_cannot_take_it(fake, monkeypatch):
    """Push needs every rank on this node: with TILESCALE_NODE_SIZE=1 (a peer on another node) it is refused by
    name on every rank, and the default is pull."""
    monkeypatch.setenv("TILESCALE_NODE_SIZE", "1")
    fake(world_size=2)
    assert gemm_rs.default_path(2) == "pull"
    with pytest.raises(OpArgumentError, match=r"GemmRS: path: got 'push', expected 'pull' or None on this job "
                                              r"\(push needs every rank on this node"):
        gemm_rs.GemmRS(4096, 2048, 1024, torch.bfloat16, path="push")


def test_gemm_rs_size_bound_is_where_tvm_stops(clean_ts_env):
    """The bound of the pull path: its kernels index the partials of a call's half (M x N) in 32 bits where the
    sizes are literals; the rows and the partials' sizes are run-time sizes now (64-bit indices, so TVM lowers any
    M), and the op refuses M x N >= 2**31 itself (check_sizes); the push kernel indexes in 64 bits and takes it."""
    from tilescale import build_only

    def lowers(M, N, path):
        for fn, args in gemm_rs.kernels(M, N, 1024, 2, "bfloat16", path=path):
            try:
                build_only.lower_source(fn.get_tir(*args))
            except Exception as e:  # noqa: BLE001
                assert "exceeds maximum of int32" in str(e), e
                return False
        return True

    with pytest.raises(OpArgumentError, match="M x N"):
        gemm_rs.check_sizes(65536, 32768, 1024, 2, "pull", 128)
    assert lowers(65536, 32768, "pull")                              # (refused by check_sizes, not by TVM)
    gemm_rs.check_sizes(32768, 32768, 1024, 2, "pull", 128)        # 2 x M x N = 2**31 elements of P: taken
    assert lowers(32768, 32768, "pull")
    gemm_rs.check_sizes(65536, 32768, 1024, 2, "push", 128)
    assert lowers(65536, 32768, "push")


def test_gemm_rs_rows_fit_a_grids_y_dimension():
    """A grid with a row of blocks per tile of M (the pull path's GEMM, the push kernel at world size 1) has at most
    65535 of them (CUDA's limit in y): refused by name; the push kernel at world size > 1 runs a grid of one row."""
    with pytest.raises(OpArgumentError, match=r"^GemmRS: M: got M=8388736, N=128, K_local=1024, expected at most "
                                              r"8388480 rows \(M / block_m = 65537 blocks in a grid's y dimension"):
        gemm_rs.check_sizes(65537 * 128, 128, 1024, 2, "pull", 128)
    with pytest.raises(OpArgumentError, match=r"M / block_m = 65537 blocks"):
        gemm_rs.check_sizes(65537 * 128, 128, 1024, 1, "push", 128)
    gemm_rs.check_sizes(65535 * 128, 128, 1024, 2, "pull", 128)
    gemm_rs.check_sizes(65537 * 128, 128, 1024, 2, "push", 128)


def test_a_kernel_tvm_cannot_index_is_an_argument_error_of_the_op():
    """Sizes no check foresaw, which TVM refuses ("Literal value ... exceeds maximum of int32"): the op frees its
    buffers and raises an OpArgumentError naming itself and its sizes (every rank alike: the arguments agreed)."""

    class Big(base.Op):
        NAME = "Big"

    op = Big()
    op._arguments = dict(M=1 << 20, N=1 << 12, dtype=torch.bfloat16)   # as agreed by op.arguments(...)
    closed = []
    op.close = lambda: closed.append(True)

    def fn(*args):
        raise ValueError("Traceback ...\nCheck failed: value < 1LL << (dtype.bits() - 1) (2147483648 vs. 2147483648) : "
                         "Literal value 2147483648 exceeds maximum of int32")
    fn.func = types.SimpleNamespace(__name__="big_kernel")
    with pytest.raises(OpArgumentError, match=r"^Big: sizes: got M=1048576, N=4096, expected sizes that the kernel "
                                              r"'big_kernel' can index with 32-bit integers \(TVM: .*exceeds maximum"):
        op.build(fn, (1,))
    assert closed == [True]

    def other(*args):
        raise ValueError("something else")
    with pytest.raises(ValueError, match="something else"):
        op.build(other, ())
