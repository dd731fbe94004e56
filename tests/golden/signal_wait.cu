extern "C" __global__ void __launch_bounds__(128, 1) signal_wait_kernel(const int* cnt, float* dst, uint64_t* sig, const float* src, uint64_t epoch) {
int me = nvshmem_my_pe();
if (0 <= me) {
if (me < 4) {
tilescale::put_signal<2>((&(src[0])), (&(dst[(me * 256)])), 1, 1024, 1024, 1024, epoch, (&(sig[me])), 0, ((me + 1) & 3));
tilescale::put_signal<1>((&(src[0])), (&(dst[(me * 256)])), 1, 128, 128, 128, (uint64_t)1, (&(sig[me])), 1, ((me + 1) & 3));
tilescale::put_signal<0>((&(src[0])), (&(dst[(me * 256)])), 1, 16, 16, 16, (uint64_t)2, (&(sig[me])), 0, ((me + 1) & 3));
tilescale::signal_op(epoch, (&(sig[me])), 0, ((me + 1) & 3));
tilescale::signal_op((uint64_t)5, (&(sig[me])), 0, 0);
tilescale::signal_op((uint64_t)1, (&(sig[me])), 1, 1);
}
}
tilescale::wait_until<unsigned long long>((&(sig[((me + 3) & 3)])), 0, epoch, <site>);
tilescale::wait_until<unsigned long long>((&(sig[0])), 3, (uint64_t)1, <site>);
tilescale::wait_until<int>((&(cnt[0])), 1, 0, <site>);
tilescale::wait_until<int>((&(cnt[1])), 4, 3, <site>);
}
