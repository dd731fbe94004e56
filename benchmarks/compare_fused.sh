#!/usr/bin/env bash
# The regression guard of the fused ops on distinct GPUs: the tree before (benchmarks/old_tree.sh, carried as
# .bench-old) and this tree, timed back to back by the same benchmark script on W ranks, then one comparison.
#
#   bash benchmarks/old_tree.sh OLD_REV                                   # here, once
#   OUT=DIR bash benchmarks/compare_fused.sh COMMIT W DEVICES             # on the GPU machine (device prelude first)
#   e.g. OUT=$OUT bash benchmarks/compare_fused.sh $(git rev-parse HEAD) 4 0,1,2,3
#
# The old tree runs this tree's bench_fused.py and timing.py (copied into it: both trees timed alike), AG+GEMM only
# (OLD_OP=both when GEMM+RS changed too); this tree runs both ops; OLD_S / NEW_S bound each run (default 200 /
# 280 s). Writes DIR/old<W>/fused.{json,md}, DIR/new<W>/fused.{json,md} (the latest result of a machine:
# benchmarks/results/<W>x<GPU>/), DIR/compare<W>.md.
set -u
NEW=${1:?usage: compare_fused.sh COMMIT W DEVICES}; W=${2:?}; VIS=${3:?}
OUT=${OUT:?set OUT to the output folder}
OLD=$(cut -d' ' -f1 .bench-old/BENCH_REV)
export CUDA_VISIBLE_DEVICES=$VIS TILESCALE_WAIT_TIMEOUT_S=${TILESCALE_WAIT_TIMEOUT_S:-30}
export TILESCALE_SKIP_DOCTOR=${TILESCALE_SKIP_DOCTOR:-1}
cp benchmarks/bench_fused.py benchmarks/timing.py .bench-old/benchmarks/
mkdir -p "$OUT/old$W" "$OUT/new$W"
( cd .bench-old && BENCH_COMMIT=$OLD timeout -k 5 "${OLD_S:-200}" env GPUS="$W" bash launch.sh \
    benchmarks/bench_fused.py --op "${OLD_OP:-ag_gemm}" --json "$OUT/old$W/fused.json" ) > "$OUT/old$W.log" 2>&1
echo "old rc=$?"
BENCH_COMMIT=$NEW timeout -k 5 "${NEW_S:-280}" env GPUS="$W" bash launch.sh benchmarks/bench_fused.py \
  --json "$OUT/new$W/fused.json" > "$OUT/new$W.log" 2>&1; echo "new rc=$?"
python3 benchmarks/compare_runs.py "$OUT/old$W/fused.json" "$OUT/new$W/fused.json" > "$OUT/compare$W.md" 2>&1
cat "$OUT/new$W/fused.md"; tail -22 "$OUT/compare$W.md"
grep -a -i "error\|Traceback" "$OUT/old$W.log" "$OUT/new$W.log" | grep -v INFO | head -5
