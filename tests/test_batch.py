"""Batches of kernel builds (tilescale.compilation.batch): side by side up to TILESCALE_BUILD_JOBS, one progress line on
rank 0 only while kernels are really built (nothing for cache hits, nothing on other ranks), kernels compiled in a
batch are the ones ``fn(*args)`` returns (no second compile through tilelang's cache), and the ops and prebuild
build through batches. No nvcc: a "build" here is tilelang's lowering of a small kernel (its code generation is
what tells a real build from a cache hit), or a stand-in."""
import inspect
import threading

import pytest

import tilescale
import tilescale.language as T
from tilescale import batch, codegen


@tilescale.jit
def tiny(n: int, world_size: int = 2):
    @T.prim_func
    def kernel(x: T.Tensor((n,), "float32"), sig: T.Tensor((1,), "uint64")):
        with T.Kernel(1, threads=32):
            T.put_thread(x[0], x[0], size=4, dst_pe=(T.get_rank() + 1) % world_size)
            T.wait_until(sig[0], cmp="ge", value=1)

    return kernel


def lowered(fn, pf, args, kwargs):
    """A build's first half: tilelang lowers the kernel and generates its CUDA (as a build that misses the caches)."""
    return tilescale.compiler.lower_source(pf, target={"kind": "cuda", "arch": "sm_90a"})


def cached(fn, pf, args, kwargs):
    return "from the cache"


@pytest.fixture
def rank(menv):
    def set_rank(r, world=2):
        menv.setenv("RANK", str(r))
        menv.setenv("WORLD_SIZE", str(world))
    return set_rank


def lines(err: str) -> list[str]:
    return [ln for ln in err.split("\n") if ln]


def test_one_progress_line_for_a_batch_on_rank_0(rank, capsys):
    rank(0)
    got = batch.run([(tiny, (64,)), (tiny, (128,)), (tiny, (256,))], lowered, label="tiny kernels")
    assert all("tilescale::wait_until" in s for s in got)
    err = capsys.readouterr().err
    assert len(lines(err)) == 1, repr(err)                      # one line, redrawn in place (\r)
    last = err.strip().split("\r")[-1]
    assert last.startswith("tilescale: building tiny kernels 3/3 ["), repr(err)


def test_other_ranks_and_cache_hits_print_nothing(rank, capsys):
    rank(1)
    batch.run([(tiny, (64,)), (tiny, (128,))], lowered)
    assert capsys.readouterr().err == ""
    rank(0)
    assert batch.run([(tiny, (64,)), (tiny, (128,))], cached) == ["from the cache"] * 2
    assert capsys.readouterr().err == ""


def test_a_batch_that_builds_only_some_kernels_counts_them_all(rank, capsys):
    rank(0)

    def first_cached(fn, pf, args, kwargs):
        return cached(fn, pf, args, kwargs) if args == (64,) else lowered(fn, pf, args, kwargs)

    batch.run([(tiny, (64,)), (tiny, (128,))], first_cached, workers=1)
    assert capsys.readouterr().err.strip().split("\r")[-1].startswith("tilescale: building kernels 2/2 [")


def test_builds_run_side_by_side_up_to_the_build_jobs(menv):
    menv.setenv("TILESCALE_BUILD_JOBS", "2")
    both = threading.Barrier(2, timeout=60)

    def meet(fn, pf, args, kwargs):
        both.wait()                    # returns only while the other build runs too
        return args

    assert batch.run([(tiny, (64,)), (tiny, (128,))], meet, progress=False) == [(64,), (128,)]
    menv.setenv("TILESCALE_BUILD_JOBS", "1")
    running, most = [0], [0]
    lock = threading.Lock()

    def count(fn, pf, args, kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threading.Event().wait(0.2)
        with lock:
            running[0] -= 1

    batch.run([(tiny, (64,)), (tiny, (128,)), (tiny, (256,))], count, progress=False)
    assert most[0] == 1
    assert batch.workers_for(3) == 1 and batch.workers_for(3, 8) == 3 and batch.workers_for(0) == 1


def test_errors_come_back_in_job_order_and_compile_all_raises_the_first(menv):
    def fail_on_128(fn, pf, args, kwargs):
        if args == (128,):
            raise ValueError("no 128")
        return args

    got = batch.run([(tiny, (64,)), (tiny, (128,)), (tiny, (256,))], fail_on_128, progress=False)
    assert got[0] == (64,) and isinstance(got[1], ValueError) and got[2] == (256,)
    with pytest.raises(ValueError, match="no 128"):
        batch.raise_first(got)


def test_a_kernel_compiled_in_a_batch_is_the_one_the_call_returns(menv):
    """compile_all's kernel is what ``fn(*args)`` gives later, whatever the spelling of the arguments; tilelang's
    compile (and its memory-cache warning) is not reached a second time."""
    calls = []

    def fake_compile(pf, **kw):
        calls.append(kw["world_size"])
        return object()

    menv.setattr(tilescale.compiler, "compile", fake_compile)
    fn = tilescale.jit(tiny.func.orig_func)
    [k] = tilescale.compile_all([(fn, (64,), {"world_size": 4})])
    assert fn(64, 4) is k and fn(64, world_size=4) is k and fn.compile(64, 4) is k
    assert calls == [4]
    assert tilescale.compile_all([(fn, (64, 4))]) == [k] and calls == [4]    # nothing compiled again
    other = fn(64)                                                        # another kernel (world size 2)
    assert other is not k and calls == [4, 2]
    menv.setenv("TILESCALE_WAIT_TIMEOUT_S", "5")                         # a setting in its binary: another one
    assert fn.compile(64, 4) is not k and calls == [4, 2, 4]


def test_par_compile_is_a_batch(menv):
    seen = []

    def fake_compile(pf, **kw):
        seen.append(threading.current_thread().name)
        if kw["world_size"] == 3:
            raise RuntimeError("no 3")
        return kw["world_size"]

    menv.setattr(tilescale.compiler, "compile", fake_compile)
    fn = tilescale.jit(tiny.func.orig_func)
    assert fn.par_compile([(64, 2), {"n": 64, "world_size": 4}, (64, 3)], ignore_error=True) == [2, 4, None]
    assert all(t.startswith("tilescale-build") for t in seen), seen
    with pytest.raises(RuntimeError, match="no 3"):
        fn.par_compile([(64, 3)])


def test_ops_compile_their_kernels_as_one_batch(menv):
    """Op.build compiles through a batch (a progress line for a single kernel too), and an op with several
    kernels hands all of them to one batch before it builds them one by one."""
    from tilescale.ops import allgather_gemm, base, gemm_reduce_scatter

    batches = []
    menv.setattr(tilescale.batch, "compile_all", lambda jobs, **kw: batches.append((list(jobs), kw)))
    op = object.__new__(base.Op)
    op.NAME = "Fake"

    class Fn:
        compile_tir = None

        def __call__(self, *args):
            raise RuntimeError("stop after the batch")

    fn = Fn()
    with pytest.raises(RuntimeError, match="stop after the batch"):
        op.build(fn, (1, 2))
    assert batches == [([(fn, (1, 2))], {"label": "Fake kernels"})]
    src = inspect.getsource(allgather_gemm.AGGemm.__init__)
    ahead = src.index("self.compile_ahead(jobs + prof_jobs)")
    assert src.index("prof_jobs = ") < ahead < src.index("self.build(fn, jobs[0][1]") < src.index("f(*a).prepare()")
    src = inspect.getsource(gemm_reduce_scatter.GemmRS.__init__)
    assert src.index("self.compile_ahead(jobs)") < src.index("self.build(gemm_fn")


def test_prebuild_compiles_in_one_batch(menv):
    from tilescale.ops import prebuild

    batches = []
    menv.setattr(tilescale.batch, "compile_all", lambda jobs, **kw: batches.append((list(jobs), kw)))
    prebuild.compile_all([(tiny, (1,)), (tiny, (1,)), (tiny, (2,))])
    prebuild.compile_all([(tiny, (3,))], verbose=False)
    assert batches == [([(tiny, (1,)), (tiny, (2,))], {"workers": None, "progress": None}),
                       ([(tiny, (3,))], {"workers": None, "progress": False})]


def test_code_generation_tells_listeners_in_its_thread_only():
    heard = []
    with codegen.on_generate(lambda: heard.append(threading.current_thread().name)):
        tilescale.compiler.lower_source(tiny.get_tir(64), target={"kind": "cuda", "arch": "sm_90a"})
        t = threading.Thread(target=lambda: tilescale.compiler.lower_source(tiny.get_tir(128)), name="other")
        t.start()
        t.join()
    tilescale.compiler.lower_source(tiny.get_tir(256))
    assert heard == [threading.current_thread().name]


def test_workers_load_kernels_on_the_callers_cuda_device(menv):
    """A worker compiles and loads a kernel; the current CUDA device is per thread (a new thread's is 0), so a rank
    of GPU 2 whose workers ran on device 0 got kernels it could not launch. Each job runs with the caller's device."""
    import contextlib

    import torch

    entered = []

    @contextlib.contextmanager
    def device(d):
        entered.append((threading.get_ident(), d))
        yield

    menv.setattr(torch.cuda, "is_initialized", lambda: True)
    menv.setattr(torch.cuda, "current_device", lambda: 2)
    menv.setattr(torch.cuda, "device", device)
    got = batch.run([threading.get_ident] * 3, None, workers=3, progress=False)
    assert got and all((ident, 2) in entered for ident in got)
    assert any(ident != threading.get_ident() for ident in got)      # the jobs ran in workers


def test_no_cuda_no_device_set(menv):
    """Where CUDA is not initialized (a build machine), the workers set no device (nothing initializes CUDA)."""
    import torch

    menv.setattr(torch.cuda, "is_initialized", lambda: False)
    menv.setattr(torch.cuda, "device", lambda d: pytest.fail("a device was set"))
    assert batch.run([lambda: 1, lambda: 2], None, workers=2, progress=False) == [1, 2]
