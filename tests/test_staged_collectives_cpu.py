"""tilescale.staged_collectives and tilescale.distributed in the shared-GPU mode, on CPU: 2 processes over gloo.

* every staged collective (all_reduce with each op, reduce_scatter_tensor, all_gather_into_tensor,
  all_gather, all_to_all_single with and without split sizes, broadcast, barrier), on CPU tensors (the
  same code as CUDA tensors, whose host copies are then no-ops), against a result recomputed from every
  rank's seed; the choice for_cuda() makes; the errors;
* tilescale.distributed with the shared-GPU mode faked: init_process_group("nccl", ...) starts gloo
  instead, starts the runtime (faked), and the calls that no plan serves go through the staged collectives
  (CPU tensors counted as staged devices here), plans still first.
"""
from __future__ import annotations

from pathlib import Path

from rank_processes import run_ranks

PRELUDE = r"""
import json, logging, os, sys, warnings
warnings.filterwarnings("ignore", category=FutureWarning)
import torch
import torch.distributed as td

rank, W = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
out = {}

def data(seed, *shape, dtype=torch.float32):
    # integer-valued: sums are exact in any order, so results must agree bit for bit
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-100, 100, shape, generator=g).to(dtype)

def same(a, b):
    return bool(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))

def raises(exc, fn, text=""):
    try:
        fn()
    except exc as e:
        return text in str(e)
    return False
"""

STAGED = PRELUDE + r"""
from tilescale import staged_collectives as sc
td.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=W)
out["choice"] = [sc.needs_staging(), sc.for_cuda() is sc, sc.get_rank is td.get_rank, sc.ReduceOp is td.ReduceOp]
real_backend = td.get_backend
td.get_backend = lambda group=None: "cpu:gloo,cuda:nccl"
out["choice_nccl"] = [not sc.needs_staging(), sc.for_cuda() is td]
td.get_backend = real_backend
everyone = lambda seed, *shape, **kw: [data(seed + r, *shape, **kw) for r in range(W)]

# all_reduce: every op, dtypes, in place, views, async
x = data(10 + rank, 6, 5)
t = x.clone(); assert sc.all_reduce(t) is None
out["ar_sum"] = same(t, sum(everyone(10, 6, 5)))
t = x.clone(); sc.all_reduce(t, op=sc.ReduceOp.MAX)
out["ar_max"] = same(t, torch.stack(everyone(10, 6, 5)).amax(0))
t = x.clone(); sc.all_reduce(t, op=sc.ReduceOp.MIN)
out["ar_min"] = same(t, torch.stack(everyone(10, 6, 5)).amin(0))
t = x.clone(); sc.all_reduce(t, op=sc.ReduceOp.PRODUCT)
out["ar_product"] = same(t, torch.stack(everyone(10, 6, 5)).prod(0))
t = x.clone(); sc.all_reduce(t, op=sc.ReduceOp.AVG)
out["ar_avg"] = same(t, sum(everyone(10, 6, 5)) / W)
b = data(20 + rank, 300, dtype=torch.bfloat16) / 64          # float32 sum rounded once to bf16
t = b.clone(); sc.all_reduce(t)
out["ar_bf16"] = same(t, sum(e.float() for e in everyone(20, 300, dtype=torch.bfloat16)).div(64).bfloat16())
t = data(30 + rank, 7, dtype=torch.float16); sc.all_reduce(t)
out["ar_fp16"] = same(t, sum(e.float() for e in everyone(30, 7, dtype=torch.float16)).half())
t = data(40 + rank, 9, dtype=torch.int64); sc.all_reduce(t)
out["ar_int64"] = same(t, sum(everyone(40, 9, dtype=torch.int64)))
i = data(45 + rank, 9, dtype=torch.int32).abs(); t = i.clone(); sc.all_reduce(t, op=sc.ReduceOp.BOR)
want = everyone(45, 9, dtype=torch.int32)
out["ar_bor"] = same(t, want[0].abs() | want[1].abs())
c = torch.complex(data(50 + rank, 4), data(60 + rank, 4)); t = c.clone(); sc.all_reduce(t)
out["ar_complex"] = same(t, sum(torch.complex(data(50 + r, 4), data(60 + r, 4)) for r in range(W)))
t = x.clone(); sc.all_reduce(t[:, 1])                         # a non-contiguous view, written back in place
want = x.clone(); want[:, 1] = sum(everyone(10, 6, 5))[:, 1]
out["ar_view"] = same(t, want)
leaf = x.clone().requires_grad_()
sc.all_reduce(leaf)
out["ar_leaf"] = same(leaf.detach(), sum(everyone(10, 6, 5)))
t = x.clone(); w = sc.all_reduce(t, async_op=True)
out["ar_async"] = [isinstance(w, td.Work), w.wait() is True, w.is_completed(), same(t, sum(everyone(10, 6, 5)))]
t = torch.tensor(float(rank + 1)); sc.all_reduce(t)           # 0-d
out["ar_scalar"] = t.item() == W * (W + 1) / 2

# reduce_scatter_tensor
z = data(70 + rank, W * 3, 5)
o = torch.full((3, 5), float("nan")); assert sc.reduce_scatter_tensor(o, z) is None
full = sum(everyone(70, W * 3, 5))
out["rs_sum"] = same(o, full[rank * 3:(rank + 1) * 3])
o = torch.full((15,), float("nan")); sc.reduce_scatter_tensor(o, z, op=sc.ReduceOp.MAX)   # other shapes, same numel
out["rs_max_flat"] = same(o, torch.stack(everyone(70, W * 3, 5)).amax(0)[rank * 3:(rank + 1) * 3].reshape(-1))
o = torch.full((3, 5), float("nan")); sc.reduce_scatter_tensor(o, z, op=sc.ReduceOp.AVG)
out["rs_avg"] = same(o, (full / W)[rank * 3:(rank + 1) * 3])
zb = data(80 + rank, W * 4, dtype=torch.bfloat16)
o = torch.full((4,), float("nan"), dtype=torch.bfloat16); sc.reduce_scatter_tensor(o, zb)
want = sum(e.float() for e in everyone(80, W * 4, dtype=torch.bfloat16)).bfloat16()
out["rs_bf16"] = same(o, want[rank * 4:(rank + 1) * 4])
zc = torch.complex(data(85 + rank, W * 2), data(86 + rank, W * 2))
o = torch.zeros(2, dtype=torch.complex64); sc.reduce_scatter_tensor(o, zc)
want = sum(torch.complex(data(85 + r, W * 2), data(86 + r, W * 2)) for r in range(W))
out["rs_complex"] = same(o, want[rank * 2:(rank + 1) * 2])
o = torch.empty(3, 5); w = sc.reduce_scatter_tensor(o, z, async_op=True); w.wait()
out["rs_async"] = same(o, full[rank * 3:(rank + 1) * 3])
out["rs_bad_size"] = raises(ValueError, lambda: sc.reduce_scatter_tensor(torch.empty(4), z), "world size")

# all_gather_into_tensor and all_gather
y = data(90 + rank, 4, 3)
o = torch.full((W * 4, 3), float("nan")); assert sc.all_gather_into_tensor(o, y) is None
out["ag_cat"] = same(o, torch.cat(everyone(90, 4, 3)))
o = torch.full((W, 4, 3), float("nan")); sc.all_gather_into_tensor(o, y)
out["ag_stacked"] = same(o, torch.stack(everyone(90, 4, 3)))
yb = (data(95 + rank, 5) > 0)
o = torch.zeros(W * 5, dtype=torch.bool); sc.all_gather_into_tensor(o, yb)
out["ag_bool"] = same(o, torch.cat([e > 0 for e in everyone(95, 5)]))
yh = data(96 + rank, 3, dtype=torch.bfloat16)
o = torch.zeros(W * 3, dtype=torch.bfloat16); sc.all_gather_into_tensor(o, yh)
out["ag_bf16"] = same(o, torch.cat(everyone(96, 3, dtype=torch.bfloat16)))
o = torch.empty(W * 4, 3); w = sc.all_gather_into_tensor(o, y, async_op=True); w.wait()
out["ag_async"] = same(o, torch.cat(everyone(90, 4, 3)))
out["ag_bad_size"] = raises(ValueError, lambda: sc.all_gather_into_tensor(torch.empty(5), y), "world size")
out["ag_bad_dtype"] = raises(ValueError, lambda: sc.all_gather_into_tensor(torch.empty(W * 12, dtype=torch.int32), y),
                             "dtype")
lst = [torch.full((4, 3), float("nan")) for _ in range(W)]
assert sc.all_gather(lst, y) is None
out["ag_list"] = all(same(a, b) for a, b in zip(lst, everyone(90, 4, 3)))
lst = [torch.full((12,), float("nan")) for _ in range(W)]
sc.all_gather(lst, y)
out["ag_list_flat"] = all(same(a, b.reshape(-1)) for a, b in zip(lst, everyone(90, 4, 3)))
out["ag_list_bad"] = raises(ValueError, lambda: sc.all_gather([torch.empty(4, 3)], y), "group size")

# all_to_all_single: equal chunks, split sizes (uneven, with an empty one), rows of several elements
a_in = data(100 + rank, W * 2, 3)
o = torch.full((W * 2, 3), float("nan")); assert sc.all_to_all_single(o, a_in) is None
ins = everyone(100, W * 2, 3)
out["a2a_equal"] = same(o, torch.cat([ins[r][rank * 2:(rank + 1) * 2] for r in range(W)]))
send = [[1 + r + j for j in range(W)] for r in range(W)]       # rank r sends send[r][j] rows to rank j
send[0][W - 1] = 0
recv = [send[r][rank] for r in range(W)]
a_in = data(110 + rank, sum(send[rank]), 3)
o = torch.full((sum(recv), 3), float("nan"))
sc.all_to_all_single(o, a_in, output_split_sizes=recv, input_split_sizes=send[rank])
def chunk(r, j):
    src = data(110 + r, sum(send[r]), 3)
    start = sum(send[r][:j])
    return src[start:start + send[r][j]]
out["a2a_splits"] = same(o, torch.cat([chunk(r, rank) for r in range(W)]))
ref = torch.full((sum(recv), 3), float("nan"))
td.all_to_all_single(ref, a_in, recv, send[rank])
out["a2a_splits_vs_gloo"] = same(o, ref)
a_in = data(120 + rank, W * 2, dtype=torch.float16)
o = torch.zeros(W * 2, dtype=torch.float16); w = sc.all_to_all_single(o, a_in, async_op=True); w.wait()
ins = everyone(120, W * 2, dtype=torch.float16)
out["a2a_async_fp16"] = same(o, torch.cat([ins[r][rank * 2:(rank + 1) * 2] for r in range(W)]))
out["a2a_bad_splits"] = raises(ValueError,
                               lambda: sc.all_to_all_single(torch.empty(W), torch.empty(4), [1] * W, [9] * W),
                               "input_split_sizes")
out["a2a_indivisible"] = raises(ValueError, lambda: sc.all_to_all_single(torch.empty(W + 1), torch.empty(W + 1)),
                                "divisible")

# broadcast (global src, group_src, bool), barrier
t = data(130 + rank, 5, 2); assert sc.broadcast(t, src=W - 1) is None
out["bc_src"] = same(t, data(130 + W - 1, 5, 2))
t = data(140 + rank, 3); sc.broadcast(t, group_src=0)
out["bc_group_src"] = same(t, data(140, 3))
t = data(150 + rank, 6) > 0; w = sc.broadcast(t, src=0, async_op=True); w.wait()
out["bc_bool_async"] = same(t, data(150, 6) > 0)
out["barrier"] = [sc.barrier() is None, sc.barrier(async_op=True).wait() is True]

# groups: the whole world as a group, a group of one rank (and a call by a rank outside it)
gw = td.new_group(ranks=list(range(W)))
t = x.clone(); sc.all_reduce(t, group=gw)
out["group_world"] = same(t, sum(everyone(10, 6, 5)))
g0 = td.new_group(ranks=[0])
out["not_in_group"] = sc.needs_staging(g0) == (rank == 0)
if rank == 0:
    t = x.clone(); sc.all_reduce(t, group=g0)
    o = torch.empty(6, 5); sc.reduce_scatter_tensor(o, x, group=g0)
    out["group_one"] = [same(t, x), same(o, x)]

# refused
out["premul"] = raises(ValueError, lambda: sc.all_reduce(x.clone(), op=td._make_nccl_premul_sum(2.0)), "PREMUL_SUM")
out["avg_int"] = raises(ValueError, lambda: sc.all_reduce(torch.ones(3, dtype=torch.int32), op=sc.ReduceOp.AVG), "AVG")
out["not_tensor"] = raises(TypeError, lambda: sc.all_reduce([1.0]), "tensors")
out["no_such_name"] = raises(AttributeError, lambda: sc.no_such_name, "no_such_name")
td.destroy_process_group()
print("RESULT " + json.dumps(out), flush=True)
"""

SHARED = PRELUDE + r"""
# tilescale.distributed in the shared-GPU mode, with the GPU parts faked: the mode is on, CUDA is there
# during init_process_group (the runtime is faked), and CPU tensors stand for CUDA tensors.
import types
import tilescale.distributed as dist
import tilescale.plan as P
from tilescale import runtime, staged_collectives as sc
dbg = []
class H(logging.Handler):
    def emit(self, rec):
        dbg.append(rec.getMessage())
logging.getLogger("tilescale.distributed").addHandler(H())
logging.getLogger("tilescale.distributed").setLevel(logging.DEBUG)

dist._gpus_shared = lambda: True
rt = types.SimpleNamespace(info=types.SimpleNamespace(rank=rank, world_size=W, local_world_size=W, device=0,
                                                       shared_gpu=True), ctrl_group=None)
def fake_init():
    rt.ctrl_group = td.new_group(backend="gloo")
    runtime.current = lambda: rt
    runtime.is_initialized = lambda: True
    return rt.info
runtime.init_distributed = fake_init
runtime.finalize = lambda: out.setdefault("finalized", True)
real = torch.cuda.is_available, torch.cuda.get_device_name
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda *a: "NVIDIA H100 80GB HBM3"
try:
    dist.init_process_group("nccl", init_method=os.environ["INIT"], rank=rank, world_size=W, use_tilescale=True,
                            device_id=torch.device("cuda", 0))
finally:
    torch.cuda.is_available, torch.cuda.get_device_name = real
out["init"] = [td.get_backend() == "gloo", dist.is_tilescale_enabled(), rt.ctrl_group is not None,
               any("shared-GPU mode" in m and "gloo instead of 'nccl'" in m for m in dbg)]

dist._STAGED_DEVICES = ("cuda", "cpu")
staged = []
for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast"):
    def wrap(fn, name=name):
        def call(*a, **k):
            staged.append(name)
            return fn(*a, **k)
        return call
    setattr(sc, name, wrap(getattr(sc, name)))
x = data(10 + rank, 6, 5)
everyone = [data(10 + r, 6, 5) for r in range(W)]
calls = []
def check(name, fn, want, want_staged):
    n = len(staged)
    fn()
    out[name] = [same(*want()), staged[n:] == want_staged]

t = x.clone()
check("all_reduce", lambda: dist.all_reduce(t), lambda: (t, sum(everyone)), ["all_reduce"])
t2 = x.clone()
check("all_reduce_max", lambda: dist.all_reduce(t2, op=dist.ReduceOp.MAX),
      lambda: (t2, torch.stack(everyone).amax(0)), ["all_reduce"])
o = torch.full((W * 6, 5), float("nan"))
check("all_gather", lambda: dist.all_gather_into_tensor(o, x), lambda: (o, torch.cat(everyone)),
      ["all_gather_into_tensor"])
z = x.reshape(-1)[: W * 15].reshape(W * 3, 5).clone()
o2 = torch.full((3, 5), float("nan"))
check("reduce_scatter", lambda: dist.reduce_scatter_tensor(o2, z),
      lambda: (o2, sum(e.reshape(-1)[: W * 15].reshape(W * 3, 5) for e in everyone)[rank * 3:(rank + 1) * 3]),
      ["reduce_scatter_tensor"])
ins = [[1 + r, 5 - r] for r in range(W)]
outs = [ins[r][rank] for r in range(W)]
o3 = torch.full((sum(outs), 5), float("nan")); r3 = torch.empty(sum(outs), 5)
td.all_to_all_single(r3, x, outs, ins[rank])
check("all_to_all_splits", lambda: dist.all_to_all_single(o3, x, outs, ins[rank]), lambda: (o3, r3),
      ["all_to_all_single"])
t3 = x.clone()
check("broadcast", lambda: dist.broadcast(t3, src=W - 1), lambda: (t3, everyone[W - 1]), ["broadcast"])
t4 = x.clone()
w = dist.all_reduce(t4, async_op=True)
out["async"] = [isinstance(w, td.Work), w.wait() is True, same(t4, sum(everyone)), staged[-1] == "all_reduce"]
sub = dist.new_group(ranks=list(range(W)))
t5 = x.clone()
check("subgroup", lambda: dist.all_reduce(t5, group=sub), lambda: (t5, sum(everyone)), ["all_reduce"])
# a registered plan still comes first
def ar_gather_sum(tensor, op="sum"):
    calls.append("plan")
    parts = [torch.empty_like(tensor) for _ in range(W)]
    td.all_gather(parts, tensor)
    tensor.copy_(torch.stack(parts).sum(0))
P.register(P.compile(ar_gather_sum, name="ar_gather_sum", collective="allreduce", world_size=W, nranks_per_node=W))
t6 = x.clone()
check("plan_first", lambda: dist.all_reduce(t6), lambda: (t6, sum(everyone)), [])
out["plan_first"].append(calls == ["plan"])
# where the group has NCCL (faked), or the device is not staged: torch.distributed
dist._STAGED_DEVICES = ("cuda",)
t7 = x.clone()
check("cpu_to_torch", lambda: dist.all_reduce(t7, op=dist.ReduceOp.MAX),
      lambda: (t7, torch.stack(everyone).amax(0)), [])
out["stats"] = [dist.stats()["allreduce"].get("nccl", 0) >= 4, dist.stats()["allreduce"].get("ar_gather_sum") == 1]
dist.destroy_process_group()
out["destroyed"] = [out.pop("finalized", False), not td.is_initialized(), not dist.is_tilescale_enabled()]
print("RESULT " + json.dumps(out), flush=True)
"""


NOT_SHARED = PRELUDE + r"""
# Without the shared-GPU mode init_process_group passes the backend through unchanged (here "gloo"; an
# NCCL backend cannot be created without a GPU), and _gpus_shared is False on a machine without CUDA.
import tilescale.distributed as dist
out["probe"] = dist._gpus_shared() is False
args, kwargs, shared = dist._without_nccl_if_shared(("nccl",), {"device_id": 0})
out["nccl_kept"] = [args == ("nccl",), kwargs == {"device_id": 0}, shared is False]
dist._gpus_shared = lambda: True
args, kwargs, shared = dist._without_nccl_if_shared((), {"backend": "cpu:gloo,cuda:nccl", "device_id": 0, "rank": 1})
out["mixed_replaced"] = [args == ("gloo",), kwargs == {"rank": 1}, shared is True]
args, kwargs, shared = dist._without_nccl_if_shared(("gloo",), {})
out["gloo_kept"] = [args == ("gloo",), shared is False]
args, kwargs, shared = dist._without_nccl_if_shared((), {"world_size": 2})     # torch's default backend
out["default_replaced"] = [args == ("gloo",), kwargs == {"world_size": 2}, shared is True]
dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=W)
out["backend"] = td.get_backend() == "gloo"
td.barrier()      # (no rank leaves before the other's gloo mesh is connected: under load one did, and it failed)
dist.destroy_process_group()
print("RESULT " + json.dumps(out), flush=True)
"""


def _run_ranks(tmp_path: Path, code: str, nranks: int = 2, timeout: float = 90) -> list[dict]:
    return run_ranks(tmp_path, code, nranks, timeout,
                     drop_env=("TILESCALE_DIST_PREFER", "TILESCALE_RANKS_PER_GPU", "LOCAL_WORLD_SIZE"))


def _bad(res: dict) -> dict:
    def ok(v):
        return (bool(v) and all(x is True for x in v)) if isinstance(v, list) else v is True
    return {k: v for k, v in res.items() if not ok(v)}


STAGED_KEYS = {"choice", "choice_nccl", "ar_sum", "ar_max", "ar_min", "ar_product", "ar_avg", "ar_bf16", "ar_fp16",
               "ar_int64", "ar_bor", "ar_complex", "ar_view", "ar_leaf", "ar_async", "ar_scalar", "rs_sum",
               "rs_max_flat", "rs_avg", "rs_bf16", "rs_complex", "rs_async", "rs_bad_size", "ag_cat", "ag_stacked",
               "ag_bool", "ag_bf16", "ag_async", "ag_bad_size", "ag_bad_dtype", "ag_list", "ag_list_flat",
               "ag_list_bad", "a2a_equal", "a2a_splits", "a2a_splits_vs_gloo", "a2a_async_fp16", "a2a_bad_splits",
               "a2a_indivisible", "bc_src", "bc_group_src", "bc_bool_async", "barrier", "group_world",
               "not_in_group", "premul", "avg_int", "not_tensor", "no_such_name"}


def test_staged_collectives_match_recomputed_results(tmp_path):
    results = _run_ranks(tmp_path, STAGED)
    for rank, res in enumerate(results):
        assert not _bad(res), f"rank {rank}: {_bad(res)}"
        want = STAGED_KEYS | ({"group_one"} if rank == 0 else set())
        assert set(res) == want, sorted(set(res) ^ want)


def test_distributed_in_shared_gpu_mode_stages_its_fallbacks(tmp_path):
    results = _run_ranks(tmp_path, SHARED)
    for rank, res in enumerate(results):
        assert not _bad(res), f"rank {rank}: {_bad(res)}"
        assert set(res) == {"init", "all_reduce", "all_reduce_max", "all_gather", "reduce_scatter",
                            "all_to_all_splits", "broadcast", "async", "subgroup", "plan_first", "cpu_to_torch",
                            "stats", "destroyed"}, sorted(res)


def test_distributed_keeps_the_backend_without_shared_gpus(tmp_path):
    results = _run_ranks(tmp_path, NOT_SHARED)
    for rank, res in enumerate(results):
        assert not _bad(res), f"rank {rank}: {_bad(res)}"
        assert len(res) == 6, sorted(res)
