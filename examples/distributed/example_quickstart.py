# examples/distributed/example_quickstart.py (the README's quickstart, as a test): each rank puts a tile into the
# next rank's buffer, signals, and waits for its own.
#   GPUS=2 bash launch.sh examples/distributed/example_quickstart.py
import torch

import tilescale
import tilescale.language as T


@tilescale.jit
def ring(n: int, world_size: int):
    @T.prim_func
    def kernel(src: T.Tensor((n,), "float32"), recv: T.Tensor((n,), "float32"),
               sig: T.Tensor((1,), "uint64"), epoch: T.uint64):
        with T.Kernel(1, threads=128):
            nxt = (T.get_rank() + 1) % world_size
            T.put_signal_block(src, recv, sig[0], value=epoch, dst_pe=nxt)   # data, then signal
            T.wait_until(sig[0], cmp="eq", value=epoch)                       # the previous rank's tile
    return kernel


def run(info):                                             # info = tilescale.init_distributed()
    recv = tilescale.symm.zeros((1024,), dtype=torch.float32)   # symmetric: same buffer on every rank
    sig = tilescale.symm.zeros((1,), dtype=torch.uint64)
    src = torch.full((1024,), float(info.rank), device="cuda")
    ring(1024, info.world_size)(src, recv, sig, 1)         # cython backend + NVSHMEM, built once, cached
    tilescale.synchronize()
    assert recv.eq((info.rank - 1) % info.world_size).all()
    print(f"[rank {info.rank}] OK")


def build(world_size: int):                                # no GPU (launch.sh): compile and link only
    tilescale.build_all([(ring, (1024, world_size))])


try:
    import pytest
except ImportError:  # running as a program without pytest installed
    pytest = None

if pytest is not None:
    @pytest.mark.multigpu
    def test_quickstart_on_two_gpus():
        from tilescale import testing

        testing.skip_unless_ranks(2)
        testing.assert_all_ranks_ok(testing.launch(__file__, 2, timeout=300), 2)


if __name__ == "__main__":
    from tilescale import testing

    testing.example_main(run, build)   # init_distributed, run, finalize; or, without GPUs, build
