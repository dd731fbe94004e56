"""PyTorch's own async-TP test cases, against tilescale's drop-ins, on N ranks.

The cases of pytorch/pytorch test/distributed/test_symmetric_memory.py, class AsyncTPTest (test_fused_all_gather_matmul
for gather_dim 0, 1, 2; test_fused_all_gather_matmul_native, B row- and column-major; test_multimem_all_gather_matmul;
test_fused_matmul_reduce_scatter for scatter_dim 0, 1, 2; test_fused_matmul_reduce_scatter_bfloat16_custom_reduce
with its CUDA graph capture; test_optimal_layout), with their shapes and dtypes, written for
``tilescale.ops.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``. Where torch's tests compare
``torch.ops.symm_mem`` with torch's unfused fallback, these compare tilescale's drop-in with:

* the values of plain torch on every rank's inputs, rebuilt here from every rank's seed (no communication: this
  works where ranks share a GPU too): fp32 (tilescale's collective, then torch's GEMM) within 1e-5, bf16 (the fused
  kernels) within a relative error (Frobenius norm of the difference / that of the reference) of 2e-2;
* the shapes, dtypes and strides of torch's op (its meta kernel, on this job's process group), for every result;
* where every rank has a GPU of its own (torch's symmetric memory needs that): ``torch.ops.symm_mem``'s results
  themselves (values and strides), and a group other than the whole world (two TP groups of 2, at 4 ranks), which
  the drop-in sends to torch's op.

Extra cases: the fp32 cases again in bf16 (so that the fused kernels run them), and several Bs in one call. Prints
``[rank R] OK: <case>: ...`` per case and ``[rank R] OK: async-TP cases, N cases``. Run by
tests/test_async_tp_gpu.py at 2 and 4 ranks.

    GPUS=2 bash launch.sh tests/gpu/async_tp_main.py
"""
import tilescale

TOL_BF16 = 2e-2


def main():
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._symmetric_memory import (
        restride_A_for_fused_matmul_reduce_scatter,
        restride_A_shard_for_fused_all_gather_matmul,
    )

    from tilescale import compat, staged_collectives, testing
    from tilescale.ops import fused_all_gather_matmul, fused_matmul_reduce_scatter

    info = tilescale.init_distributed()
    rank, W = info.rank, info.world_size
    dev = torch.device("cuda", torch.cuda.current_device())
    group = dist.group.WORLD.group_name
    own_gpus = not staged_collectives.needs_staging()
    if own_gpus:
        compat.mark_group_for_symm_mem(group)        # for torch's own ops (torch 2.14 no longer needs it)
    cases = []

    def rand(r, seed, *shape, dtype=torch.float32):
        """Rank r's tensor `seed` (torch.rand, as torch's tests), the same wherever it is rebuilt."""
        g = torch.Generator(device=dev).manual_seed(1000 * seed + 42 + r)
        return torch.rand(*shape, generator=g, device=dev).to(dtype)

    def layout(t):
        return None if t is None else (tuple(t.shape), t.stride(), t.dtype)

    def close(what, got, want, strides=True):
        """`got` equals `want` (fp32: within 1e-5; bf16: relative error within TOL_BF16), of its shape and dtype, and
        of its strides unless `strides` is False (a reference built here: the layouts are checked against torch's)."""
        if got.shape != want.shape or got.dtype != want.dtype or (strides and got.stride() != want.stride()):
            raise AssertionError(f"[rank {rank}] {what}: {layout(got)}, expected {layout(want)}")
        if got.dtype == torch.float32:
            testing.check_close(what, got, want, rank, atol=1e-5, rtol=1e-5)
            return
        err = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()
        if not err <= TOL_BF16:
            raise AssertionError(f"[rank {rank}] {what}: relative error {err:.3g} > {TOL_BF16}")

    def torchs_layouts(op, *args, **kwargs):
        """The layouts torch's op gives (its meta kernel, on this job's group)."""
        with FakeTensorMode() as mode:
            fake = [[mode.from_tensor(t) for t in a] if isinstance(a, list) else
                    mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            out = getattr(torch.ops.symm_mem, op)(*fake, **kwargs)
        if isinstance(out, torch.Tensor):
            return layout(out)
        return layout(out[0]), [layout(o) for o in out[1]]

    def ag_case(name, A_shard_shape, gather_dim, Bs_shapes, dtype, return_A=True, restride=False, b_t=False):
        shards = [rand(r, 1, *A_shard_shape, dtype=dtype) for r in range(W)]
        Bs = [rand(0, 2 + i, *(s[::-1] if b_t else s), dtype=dtype) for i, s in enumerate(Bs_shapes)]
        Bs = [B.t() for B in Bs] if b_t else Bs
        A_shard = shards[rank]
        if restride:
            A_shard = restride_A_shard_for_fused_all_gather_matmul(A_shard, gather_dim)
        A_ref = torch.cat(shards, dim=gather_dim)
        A, outs = fused_all_gather_matmul(A_shard, Bs, gather_dim=gather_dim, group_name=group, return_A=return_A)
        want = torchs_layouts("fused_all_gather_matmul", A_shard, Bs, gather_dim, group, return_A=return_A)
        got = (layout(A), [layout(o) for o in outs])
        if got != want:
            raise AssertionError(f"[rank {rank}] {name}: layouts {got}, torch's {want}")
        if return_A:
            close(f"{name} A", A, A_ref, strides=False)
        elif A is not None:
            raise AssertionError(f"[rank {rank}] {name}: A returned with return_A=False")
        for i, (o, B) in enumerate(zip(outs, Bs, strict=True)):
            close(f"{name} output {i}", o, (A_ref.double() @ B.double()).to(dtype), strides=False)
        if own_gpus:          # torch's own op: the same values and layouts
            tA, touts = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, Bs, gather_dim, group, return_A=return_A)
            if return_A:
                close(f"{name} A vs torch.ops.symm_mem", A, tA)
            for i, (o, t) in enumerate(zip(outs, touts, strict=True)):
                close(f"{name} output {i} vs torch.ops.symm_mem", o, t)
        cases.append(name)
        testing.say(f"[rank {rank}] OK: {name}: values and layouts as torch's"
                    + ("" if own_gpus else " (torch.ops.symm_mem not run: ranks share a GPU)"))

    def rs_case(name, A_shape, B_shape, reduce_op, scatter_dim, dtype, restride=False, graph=False):
        As = [rand(r, 5, *A_shape, dtype=dtype) for r in range(W)]
        B = rand(0, 6, *B_shape, dtype=dtype)         # the same on every rank, as a weight shard would be per rank
        A = As[rank]
        if restride:
            A = restride_A_for_fused_matmul_reduce_scatter(A, scatter_dim)
        full = sum(a.double() @ B.double() for a in As)
        full = full / W if reduce_op == "avg" else full
        y = fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim=scatter_dim, group_name=group)
        want = torchs_layouts("fused_matmul_reduce_scatter", A, B, reduce_op, scatter_dim, group)
        if layout(y) != want:
            raise AssertionError(f"[rank {rank}] {name}: layout {layout(y)}, torch's {want}")
        ref = full.chunk(W, dim=scatter_dim)[rank].to(dtype)
        close(name, y, ref, strides=False)
        if graph:             # torch's test captures the op in a CUDA graph (after an eager call) and replays it
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y2 = fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim=scatter_dim, group_name=group)
            y2.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            close(f"{name} replayed from a CUDA graph", y2, ref, strides=False)
        if own_gpus:
            close(f"{name} vs torch.ops.symm_mem", y,
                  torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group))
        cases.append(name)
        testing.say(f"[rank {rank}] OK: {name}: values and layouts as torch's"
                    + ("" if own_gpus else " (torch.ops.symm_mem not run: ranks share a GPU)"))

    BATCH, M, N, K = 8, 64, 16, 32
    for dtype in (torch.float32, torch.bfloat16):
        for gather_dim in (0, 1, 2):                  # test_fused_all_gather_matmul
            shape = [BATCH, M, K]
            shape[gather_dim] //= W
            ag_case(f"fused_all_gather_matmul gather_dim={gather_dim} {dtype}", shape, gather_dim, [(K, N)] * 3, dtype)
    for b_t in (False, True):                         # test_fused_all_gather_matmul_native (B row- / column-major)
        ag_case(f"fused_all_gather_matmul native shape, B {'column' if b_t else 'row'}-major", (4096 // W, 1024), 0,
                [(1024, 1024)], torch.bfloat16, b_t=b_t)
    ag_case("fused_all_gather_matmul return_A=False (the multimem case)", (1024 // W, 1024), 0, [(1024, 1024)],
            torch.bfloat16, return_A=False)
    ag_case("fused_all_gather_matmul several Bs, bf16", (2, 256 // W, 256), 1, [(256, 128), (256, 256), (256, 64)],
            torch.bfloat16)
    for dim in (0, 1, 2):                             # test_optimal_layout: A laid out by torch's restride helper
        shape = [8, 64, 32, 16]
        shape[dim] //= W
        ag_case(f"fused_all_gather_matmul restrided A_shard gather_dim={dim}", shape, dim, [(16, 32)],
                torch.bfloat16, restride=True)
    for dtype in (torch.float32, torch.bfloat16):
        for scatter_dim in (0, 1, 2):                 # test_fused_matmul_reduce_scatter
            rs_case(f"fused_matmul_reduce_scatter scatter_dim={scatter_dim} {dtype}", (BATCH, M, 1024), (1024, N),
                    "avg", scatter_dim, dtype)
    rs_case("fused_matmul_reduce_scatter bfloat16 avg, CUDA graph", (64, 1024), (1024, 32), "avg", 0, torch.bfloat16,
            graph=True)                               # test_fused_matmul_reduce_scatter_bfloat16_custom_reduce
    rs_case("fused_matmul_reduce_scatter fused shape", (4, 128, 512), (512, 256), "sum", 1, torch.bfloat16)
    for dim in (0, 1, 2):                             # test_optimal_layout
        rs_case(f"fused_matmul_reduce_scatter restrided A scatter_dim={dim}", (8, 64, 32, 16), (16, 32), "sum", dim,
                torch.bfloat16, restride=True)
    if W == 4 and own_gpus:                           # a TP group of 2 (of two): torch's op serves it
        pair = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
        mine = [r for r in range(W) if r // 2 == rank // 2]
        shards = [rand(r, 7, 4, 32, 64) for r in mine]
        B = rand(0, 8, 64, 16)
        A, (c,) = fused_all_gather_matmul(shards[rank % 2], [B], 1, pair.group_name)
        want = torchs_layouts("fused_all_gather_matmul", shards[rank % 2], [B], 1, pair.group_name)
        if (layout(A), [layout(c)]) != want:     # torch's op gives A as a view of its gather along dim 0
            raise AssertionError(f"[rank {rank}] subgroup: layouts {(layout(A), [layout(c)])}, torch's {want}")
        close("subgroup A (torch's op)", A, torch.cat(shards, dim=1), strides=False)
        close("subgroup output (torch's op)", c, torch.cat(shards, dim=1) @ B, strides=False)
        cases.append("subgroup")
        testing.say(f"[rank {rank}] OK: a TP group of 2 in a world of 4 goes to torch.ops.symm_mem")
    torch.cuda.synchronize()
    testing.say(f"[rank {rank}] OK: async-TP cases, {len(cases)} cases (world size {W}"
                + (")" if own_gpus else "; ranks share a GPU: torch.ops.symm_mem not run)"))
    tilescale.finalize()


if __name__ == "__main__":
    main()
