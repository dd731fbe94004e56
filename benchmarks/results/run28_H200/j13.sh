# run J13 (session 33): the persistent push kernel with the non-default tile configs (tests/gpu/gemm_configs_main.py:
# GEMM+RS at K / W <= 1024 runs it) at 2 and 4 ranks, and the TP layer example at 2 ranks; ranks sharing the GPU
# (correctness only)
source .device/prelude.sh
export TILESCALE_WAIT_TIMEOUT_S=30 NVSHMEM_SYMMETRIC_SIZE=1G
D=$OUT/j13; mkdir -p $D; export TILESCALE_TEST_LOG_DIR=$D/jobs
B=$(mktemp -d); L=$((330 - SECONDS))
run() { local name=$1; shift; ( timeout $L python3 -m pytest -m multigpu -p no:cacheprovider -v -rs --basetemp $B/$name "$@" > $D/$name.log 2>&1; echo "$name rc=$? at ${SECONDS}s" ) & }
run a2 --ranks 2 tests/test_gemm_config.py::test_fused_ops_with_non_default_configs_on_gpus examples/distributed/example_tp_layer.py
run c4 --ranks 4 tests/test_gemm_config.py::test_fused_ops_with_non_default_configs_on_gpus
wait
rm -rf $B
for f in $D/a2.log $D/c4.log; do echo "== $(basename $f)"; grep -a -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | grep -v INFO | tail -6; done
grep -a -h -E "OK:|Error:" $D/jobs/*.log 2>/dev/null | cut -c1-200 | sort | uniq | tail -10
echo "shm: $(ls /dev/shm | grep -c cuda.shm); procs: $(pgrep -fc torch.distributed.run)"
cd $OUT && tar czf j13.tgz j13 && rm -rf j13/jobs
