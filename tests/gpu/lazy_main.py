"""A consumer kernel spinning on a signal while its producer kernel is launched later on another
stream, under CUDA's lazy module loading (CUDA_MODULE_LOADING=LAZY): tilescale loads every kernel of
a module when it prepares it, so this must just work. Run by tests/test_gpu_runtime.py."""
import tilescale
import tilescale.language as T
from tilescale import testing


@tilescale.jit
def consumer_kernel(n: int):
    @T.prim_func
    def consumer(flag: T.Tensor((1,), "uint64"), data: T.Tensor((n,), "float32"), out: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=128):
            T.wait_until(flag[0], cmp="ge", value=1)
            T.copy(data, out)

    return consumer


@tilescale.jit
def producer_kernel(n: int):
    @T.prim_func
    def producer(src: T.Tensor((n,), "float32"), data: T.Tensor((n,), "float32"), flag: T.Tensor((1,), "uint64")):
        with T.Kernel(1, threads=128):
            T.copy(src, data)
            T.sync_threads()
            if T.get_thread_binding() == 0:
                T.st(flag[0], 1, scope="gpu", sem="release")

    return producer


def run(info):
    import os
    import time

    import torch

    c = consumer_kernel(4096).prepare()
    p = producer_kernel(4096).prepare()
    flag = torch.zeros(1, dtype=torch.uint64, device="cuda")
    data = torch.zeros(4096, device="cuda")
    out = torch.full((4096,), float("nan"), device="cuda")
    src = torch.randn(4096, device="cuda")
    torch.cuda.synchronize()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    t0 = time.time()
    with torch.cuda.stream(s1):
        c(flag, data, out)
    time.sleep(0.05)
    with torch.cuda.stream(s2):
        p(src, data, flag)
    tilescale.synchronize()
    testing.check_close("consumer output", out, src, info.rank)
    print(f"[rank {info.rank}] OK: consumer/producer on two streams with CUDA_MODULE_LOADING="
          f"{os.environ.get('CUDA_MODULE_LOADING')} finished in {time.time() - t0:.3f} s", flush=True)


if __name__ == "__main__":
    testing.example_main(run, lambda ws: None)
