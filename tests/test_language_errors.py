"""Bad arguments of distributed ops are LanguageErrors raised while tracing (factory.get_tir), naming the
argument, the value received, what was expected, and the line of the kernel (this file)."""
import os
import re

import pytest

import tilescale
import tilescale.language as T
from tilescale.errors import LanguageError

THIS_FILE = os.path.basename(__file__)
N = 64


def _line_of(marker: str) -> int:
    """Line number in this file of the kernel line tagged `# <marker>`."""
    with open(__file__) as f:
        hits = [i for i, ln in enumerate(f, 1) if ln.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, marker
    return hits[0]


@tilescale.jit
def ld_bad_scope():
    @T.prim_func
    def main(flag: T.Tensor((4,), "int32"), out: T.Tensor((4,), "int32")):
        with T.Kernel(1, threads=32):
            out[0] = T.ld(flag[0], scope="device")  # <ld_scope>

    return main


@tilescale.jit
def st_bad_scope():
    @T.prim_func
    def main(flag: T.Tensor((4,), "int32")):
        with T.Kernel(1, threads=32):
            T.st(flag[0], 1, scope="device", dst_pe=1)  # <st_scope>

    return main


@tilescale.jit
def wait_bad_cmp():
    @T.prim_func
    def main(sig: T.Tensor((4,), "uint64")):
        with T.Kernel(1, threads=32):
            T.wait_until(sig[0], cmp="gte", value=1)  # <cmp>

    return main


@tilescale.jit
def st_bad_sem():
    @T.prim_func
    def main(flag: T.Tensor((4,), "int32")):
        with T.Kernel(1, threads=32):
            T.st(flag[0], 1, scope="sys", sem="acquire")  # <sem>

    return main


@tilescale.jit
def atom_bad_sem():
    @T.prim_func
    def main(flag: T.Tensor((4,), "int32"), out: T.Tensor((4,), "int32")):
        with T.Kernel(1, threads=32):
            out[0] = T.atom_add(flag[0], 1, sem="seq_cst")  # <atom_sem>

    return main


@tilescale.jit
def put_float_pe_const():
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128):
            T.put_block(A, B, dst_pe=T.float32(1.0))  # <float_pe_const>

    return main


@tilescale.jit
def put_float_pe_expr():
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32"), w: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=128):
            T.put_block(A, B, dst_pe=w[0] * 2.0)  # <float_pe_expr>

    return main


@tilescale.jit
def put_bool_pe():
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128):
            T.put_block(A, B, dst_pe=True)  # <bool_pe>

    return main


@tilescale.jit
def get_negative_pe():
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128):
            T.get_block(A, B, src_pe=-1)  # <neg_pe>

    return main


@tilescale.jit
def put_bad_size():
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128):
            T.put_block(A[0:32], B[0:32], size=16, dst_pe=1)  # <size>

    return main


@tilescale.jit
def signal_bad_dtype():
    @T.prim_func
    def main(flag: T.Tensor((4,), "int32")):
        with T.Kernel(1, threads=32):
            T.signal_op(flag[0], value=1, op="add", dst_pe=1)  # <sig_dtype>

    return main


@tilescale.jit
def wait_on_float():
    @T.prim_func
    def main(flag: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=32):
            T.wait_until(flag[0], cmp="eq", value=1)  # <wait_float>

    return main


@tilescale.jit
def put_from_fragment():
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128):
            frag = T.alloc_fragment((N,), "float32")
            T.copy(A, frag)
            T.put_block(frag, B, dst_pe=1)  # <fragment>

    return main


@tilescale.jit
def remote_of_shared():
    @T.prim_func
    def main(A: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128):
            s = T.alloc_shared((N,), "float32")
            r = T.remote(s, pe=1)  # <remote_shared>
            T.copy(A, r)

    return main


@tilescale.jit
def signal_bad_op():
    @T.prim_func
    def main(sig: T.Tensor((4,), "uint64")):
        with T.Kernel(1, threads=32):
            T.signal_op(sig[0], value=1, op="xor", dst_pe=1)  # <sig_op>

    return main


@tilescale.jit
def signal_negative_value():
    @T.prim_func
    def main(sig: T.Tensor((4,), "uint64")):
        with T.Kernel(1, threads=32):
            T.signal_op(sig[0], value=-3, dst_pe=1)  # <sig_value>

    return main


@tilescale.jit
def load_async_odd_rows():
    @T.prim_func
    def main(A: T.Tensor((64, 100), "float16")):
        with T.Kernel(1, threads=32):
            s = T.alloc_shared((64, 104), "float16")
            bar = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(bar)
            T.load_async(A[0:64, 0:100], s[0:64, 0:100], barrier=bar)  # <load_rows>

    return main


@tilescale.jit
def load_async_dynamic_barrier():
    @T.prim_func
    def main(A: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=32):
            s = T.alloc_shared((64, 64), "float16")
            bar = T.alloc_shared((1,), "uint64")
            T.load_async(A, s, barrier=bar)  # <load_barrier>

    return main


@tilescale.jit
def load_async_into_global():
    @T.prim_func
    def main(A: T.Tensor((64, 64), "float16"), B: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=32):
            bar = T.alloc_shared((1,), "uint64", scope="shared")
            T.load_async(A, B, barrier=bar)  # <load_global>

    return main


@tilescale.jit
def store_async_odd_rows():
    @T.prim_func
    def main(A: T.Tensor((64, 100), "float16")):
        with T.Kernel(1, threads=32):
            s = T.alloc_shared((64, 104), "float16")
            T.store_async(s[0:64, 0:100], A[0:64, 0:100])  # <store_rows>

    return main


@tilescale.jit
def store_async_bad_wait():
    @T.prim_func
    def k(A: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=32):
            s = T.alloc_shared((64, 64), "float16")
            T.store_async(s, A, wait="visible")  # <store_wait>

    return k


@tilescale.jit
def arrive_barrier_not_a_barrier():
    @T.prim_func
    def k(A: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=32):
            bar = T.alloc_shared((2,), "uint64", scope="shared")
            T.arrive_barrier(bar[0:2])  # <arrive_barrier>

    return k


@tilescale.jit
def store_async_from_global():
    @T.prim_func
    def main(A: T.Tensor((64, 64), "float16"), B: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=32):
            T.store_async(A, B)  # <store_global>

    return main


@tilescale.jit
def store_tile_bad_threads():
    @T.prim_func
    def k(A: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=128):
            s = T.alloc_shared((64, 64), "float16")
            T.store_tile(s, A, threads=(32, 48))  # <tile_threads>

    return k


@tilescale.jit
def store_tile_odd_rows():
    @T.prim_func
    def k(A: T.Tensor((64, 100), "float16")):
        with T.Kernel(1, threads=64):
            s = T.alloc_shared((64, 104), "float16")
            T.store_tile(s[0:64, 0:100], A[0:64, 0:100], threads=(0, 64))  # <tile_rows>

    return k


@tilescale.jit
def store_tile_into_shared():
    @T.prim_func
    def k(A: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=64):
            s = T.alloc_shared((64, 64), "float16")
            t = T.alloc_shared((64, 64), "float16")
            T.copy(A, s)
            T.store_tile(s, t, threads=(0, 64))  # <tile_shared>

    return k


@tilescale.jit
def init_barrier_no_arrivals():
    @T.prim_func
    def main(A: T.Tensor((64,), "float16")):
        with T.Kernel(1, threads=32):
            bar = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(bar, 0)  # <init_arrivals>

    return main


@tilescale.jit
def call_number_bad_scope():
    @T.prim_func
    def main(counters: T.Tensor((1,), "int64"), out: T.Tensor((1,), "uint64")):
        with T.Kernel(1, threads=32):
            out[0] = T.call_number(counters, scope="grid")  # <call_scope>

    return main


@tilescale.jit
def wait_barrier_bad_phase():
    @T.prim_func
    def main(A: T.Tensor((64,), "float16")):
        with T.Kernel(1, threads=32):
            bar = T.alloc_shared((1,), "uint64", scope="shared")
            T.init_barrier(bar)
            T.wait_barrier(bar, 2)  # <wait_phase>

    return main


# (factory, marker, what must be in the message besides the file:line: argument, value, expectation)
CASES = [
    (ld_bad_scope, "ld_scope", ["T.ld", "scope", "'device'", "'cta'", "'gpu'", "'sys'"]),
    (st_bad_scope, "st_scope", ["T.st", "scope", "'device'", "expected one of 'cta', 'gpu', 'sys'"]),
    (wait_bad_cmp, "cmp", ["T.wait_until", "cmp", "'gte'", "expected one of", "'ge'", "'eq'"]),
    (st_bad_sem, "sem", ["T.st", "sem", "'acquire'", "expected one of 'relaxed', 'release', 'volatile'"]),
    (atom_bad_sem, "atom_sem", ["T.atom_add", "sem", "'seq_cst'", "'acq_rel'"]),
    (put_float_pe_const, "float_pe_const", ["T.put_block", "dst_pe", "float32", "expected an integer"]),
    (put_float_pe_expr, "float_pe_expr", ["T.put_block", "dst_pe", "float32", "expected an integer"]),
    (put_bool_pe, "bool_pe", ["T.put_block", "dst_pe", "bool", "True", "expected an integer"]),
    (get_negative_pe, "neg_pe", ["T.get_block", "src_pe", "-1", "expected a rank >= 0"]),
    (put_bad_size, "size", ["T.put_block", "size", "got 16", "expected 32"]),
    (signal_bad_dtype, "sig_dtype", ["T.signal_op", "signal", "'flag'", "int32", "expected uint64"]),
    (wait_on_float, "wait_float", ["T.wait_until", "signal", "'flag'", "float32", "expected one of int32"]),
    (put_from_fragment, "fragment", ["T.put_block", "src", "'frag'", "local.fragment", "shared memory"]),
    (remote_of_shared, "remote_shared", ["T.remote", "buf", "'s'", "shared", "expected a global"]),
    (signal_bad_op, "sig_op", ["T.signal_op", "op", "'xor'", "expected one of 'set', 'add'"]),
    (signal_negative_value, "sig_value", ["T.signal_op", "value", "-3", "expected an unsigned integer"]),
    (load_async_odd_rows, "load_rows", ["T.load_async", "row size", "200 bytes", "a multiple of 16"]),
    (load_async_dynamic_barrier, "load_barrier", ["T.load_async", "barrier", "'bar'", "shared.dyn",
                                                  "scope=\"shared\""]),
    (load_async_into_global, "load_global", ["T.load_async", "global", "expected a global src and a shared dst"]),
    (store_async_odd_rows, "store_rows", ["T.store_async", "row size", "200 bytes", "a multiple of 16"]),
    (store_async_bad_wait, "store_wait", ["T.store_async", "wait", "'visible'", "expected 'read' or 'written'"]),
    (arrive_barrier_not_a_barrier, "arrive_barrier", ["T.arrive_barrier", "barrier", "'bar'", "expected one uint64"]),
    (store_async_from_global, "store_global", ["T.store_async", "global", "expected a shared src and a global dst"]),
    (store_tile_bad_threads, "tile_threads", ["T.store_tile", "threads", "(32, 48)", "whole warps"]),
    (store_tile_odd_rows, "tile_rows", ["T.store_tile", "row size", "200 bytes", "a multiple of 16"]),
    (store_tile_into_shared, "tile_shared", ["T.store_tile", "shared", "expected a shared src and a global dst"]),
    (init_barrier_no_arrivals, "init_arrivals", ["T.init_barrier", "arrivals", "got 0", "expected an int >= 1"]),
    (wait_barrier_bad_phase, "wait_phase", ["T.wait_barrier", "phase", "got 2", "expected 0 or 1"]),
    (call_number_bad_scope, "call_scope", ["T.call_number", "scope", "'grid'", "expected one of 'block', 'warp'"]),
]


@pytest.mark.parametrize("factory,marker,parts", CASES, ids=[c[1] for c in CASES])
def test_bad_argument_is_reported_at_the_kernel_line(factory, marker, parts):
    with pytest.raises(LanguageError) as ei:
        factory.get_tir()
    msg = str(ei.value)
    for p in parts:
        assert p in msg, f"{p!r} missing from: {msg}"
    where = f"{THIS_FILE}:{_line_of(marker)}"
    assert where in msg, f"expected the kernel line {where} in: {msg}"
    # the location is the last thing said, as "(at path/file.py:LINE)"
    assert re.search(rf"\(at [^()]*{re.escape(where)}\)$", msg), msg


def test_language_error_is_a_value_error():
    assert issubclass(LanguageError, ValueError)
    assert issubclass(LanguageError, tilescale.errors.TileScaleError)


@tilescale.jit
def valid_ops():
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32"), sig: T.Tensor((4,), "uint64"),
             flag: T.Tensor((4,), "int32")):
        with T.Kernel(1, threads=128):
            me = T.get_rank()
            T.put_signal_block(A, B, sig[0], value=1, dst_pe=(me + 1) % T.get_num_ranks())
            T.wait_until(sig[0], cmp="ge", value=1)  # <valid_wait>
            T.st(flag[0], 1, scope="sys", sem="release", dst_pe=0)

    return main


def test_valid_arguments_trace_and_record_the_wait_site():
    from tilescale.analysis import describe_distributed_calls
    from tilescale.language.distributed import WAIT_SITES

    f = valid_ops.get_tir()
    assert describe_distributed_calls(f) == ["nvshmem_my_pe", "nvshmem_n_pes", "tilescale::put_signal",
                                             "tilescale::wait_until", "tilescale::st_pe"]
    where = f"{THIS_FILE}:{_line_of('valid_wait')}"
    sites = [s for s, loc in WAIT_SITES.items() if loc.endswith(where)]
    assert len(sites) == 1, WAIT_SITES
    # stable across processes: a hash of "file:line"
    import zlib

    assert sites[0] == zlib.crc32(where.encode()) & 0x7FFFFFFF


# --------------------------------------------------------------------- from __future__ import annotations
KERNEL_MODULE = '''{future}
import tilescale
import tilescale.language as T


@tilescale.jit
def ring(n: int):
    @T.prim_func
    def main(src: T.Tensor((n,), "float32"), dst: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=32):
            dst[0] = src[0]

    return main
'''


def _kernel_module(tmp_path, name: str, future: bool):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(KERNEL_MODULE.format(future="from __future__ import annotations" if future else ""))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, path


def test_future_annotations_in_a_kernels_module_names_the_cause_and_the_fix(tmp_path):
    """The kernel's sizes are names of the enclosing function; stringized annotations lose them (a bare NameError
    inside typing before): the error names the import, the file and what to do, chained to the NameError."""
    mod, path = _kernel_module(tmp_path, "with_future", future=True)
    with pytest.raises(LanguageError) as ei:
        mod.ring(64)
    msg = str(ei.value)
    assert "ring:" in msg and "from __future__ import annotations" in msg and str(path) in msg, msg
    assert f"Remove that import from {path}" in msg and "name 'n' is not defined" in msg, msg
    assert isinstance(ei.value.__cause__, NameError)
    plain, _ = _kernel_module(tmp_path, "without_future", future=False)
    assert plain.ring.get_tir(64) is not None           # the same kernel elaborates without the import


def test_future_annotations_without_enclosing_names_still_elaborate():
    """A module with the import whose kernel annotations use constants only (tilescale's barrier kernel) is fine."""
    from tilescale.compiler import barrier_jit

    assert barrier_jit().get_tir(2) is not None
