#!/usr/bin/env bash
# The same benchmarks on an old tree and on this one, one GPU, back to back, then one table per benchmark
# (benchmarks/compare_runs.py): does a refactor move the numbers?
#   bash benchmarks/old_tree.sh 7fb3089                        # here: the old tree into .bench-old/ (carried)
#   bash tests/gpu/compare_trees.sh OUTDIR check               # each tree imports its own tilescale (no GPU work)
#   bash tests/gpu/compare_trees.sh OUTDIR build_modes,fused   # each: the old tree, then the new one
#   bash tests/gpu/compare_trees.sh OUTDIR gemm_configs@old    # one tree only (BENCH@old, BENCH@new)
#   bash tests/gpu/compare_trees.sh OUTDIR compare             # only the tables, from the JSON already in OUTDIR
# WHAT defaults to check,build_modes,fused,gemm_configs (more than one 10-minute command: split it, the same
# OUTDIR each time; every call ends with the tables of what both trees have run so far).
# Settings, the same for both trees: BUILD_MODES_REPEATS (5), GEMM_REPS (7, bench_gemm_configs' default),
# FUSED_OP (both), FUSED_MAX_SHAPES (99: all), TOL (0.03); bounds in seconds per tree and benchmark:
# BUILD_MODES_TIMEOUT (200), FUSED_TIMEOUT (270), GEMM_CONFIGS_TIMEOUT (280).
# OLD_TREE (.bench-old) is run from its own folder with its own tilescale first on PYTHONPATH and this repo's
# root taken off it; the new tree from the repo root. Each tree has its own kernel caches below CACHE_ROOT
# (/tmp/tilescale-compare-cache; kept between calls on a warm machine: a re-run compiles nothing), so that
# neither loads a kernel the other built. bench_fused runs at world size 1 (no communication: the fused ops'
# GEMM kernels and host path, which the refactor moved onto the shared op base).
# JSON and logs: OUTDIR/old/<bench>.{json,log}, OUTDIR/new/...; tables: OUTDIR/compare.md.
set -u
OUTD=${1:?usage: compare_trees.sh OUTDIR [check,build_modes,fused,gemm_configs,BENCH@old,BENCH@new,compare]}
WHAT=${2:-check,build_modes,fused,gemm_configs}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$OUTD/old" "$OUTD/new"
OUTD=$(cd "$OUTD" && pwd)
OLD=${OLD_TREE:-$ROOT/.bench-old}
CACHE_ROOT=${CACHE_ROOT:-/tmp/tilescale-compare-cache}
TOL=${TOL:-0.03}
export TILESCALE_WAIT_TIMEOUT_S=${TILESCALE_WAIT_TIMEOUT_S:-30}
export TILESCALE_SKIP_DOCTOR=${TILESCALE_SKIP_DOCTOR:-1}
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ ! -f "$OLD/BENCH_REV" ] || [ ! -f "$OLD/launch.sh" ]; then
  echo "compare_trees.sh: no old tree in $OLD (bash benchmarks/old_tree.sh OLD_REV, and carry .bench-old)" >&2
  exit 2
fi
OLD=$(cd "$OLD" && pwd)
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) x $NG;" \
     "old: $(cut -c1-60 "$OLD/BENCH_REV"); new: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') ($ROOT)"
summary=()

tree_dir() { if [ "$1" = old ]; then echo "$OLD"; else echo "$ROOT"; fi; }
tree_pythonpath() {  # the tree first, then PYTHONPATH without the other tree and without this repo's root
  local dir p out
  dir=$(tree_dir "$1"); out=$dir
  local IFS=:
  for p in ${PYTHONPATH:-}; do
    case "${p%/}" in ""|"$ROOT"|"$OLD"|.) ;; *) out="$out:$p" ;; esac
  done
  echo "$out"
}
in_tree() {  # in_tree TREE CMD...: CMD in the tree's folder with its PYTHONPATH and kernel caches
  local t=$1; shift
  (cd "$(tree_dir "$t")" && env PYTHONPATH="$(tree_pythonpath "$t")" \
     TILELANG_CACHE_DIR="$CACHE_ROOT/$t/tilelang" TILESCALE_CACHE_DIR="$CACHE_ROOT/$t/tilescale" "$@")
}
check_tree() {  # the tilescale the tree's programs import is the tree's own (from /, so only PYTHONPATH counts)
  local t=$1 dir f
  dir=$(tree_dir "$t")
  f=$(cd / && env PYTHONPATH="$(tree_pythonpath "$t")" python3 -c 'import tilescale; print(tilescale.__file__)' 2>&1)
  case "$f" in
    "$dir/tilescale/__init__.py") echo "$t tree imports $f"; return 0 ;;
    *) echo "$t tree: tilescale imports from ${f:-nothing}, expected $dir/tilescale/__init__.py" >&2; return 1 ;;
  esac
}
bench() {  # bench NAME TREE: one benchmark on one tree, bounded; JSON to OUTDIR/TREE/NAME.json
  local name=$1 t=$2 secs script args
  case $name in
    build_modes) secs=${BUILD_MODES_TIMEOUT:-200}; script=bench_build_modes.py
                 args=(--repeats "${BUILD_MODES_REPEATS:-5}") ;;
    fused) secs=${FUSED_TIMEOUT:-270}; script=bench_fused.py
           args=(--op "${FUSED_OP:-both}" --max-shapes "${FUSED_MAX_SHAPES:-99}") ;;
    gemm_configs) secs=${GEMM_CONFIGS_TIMEOUT:-280}; script=bench_gemm_configs.py args=(--reps "${GEMM_REPS:-7}") ;;
  esac
  local log="$OUTD/$t/$name.log" json="$OUTD/$t/$name.json" t0=$SECONDS rc
  rm -f "$json"   # a failed run leaves no earlier run's numbers behind to compare
  if ! check_tree "$t" > "$log" 2>&1; then
    rc=3
  else
    echo "+ (cd $(tree_dir "$t") && GPUS=1 bash launch.sh benchmarks/$script ${args[*]} --json $json)" >> "$log"
    in_tree "$t" timeout -k 10 "$secs" env GPUS=1 bash launch.sh "benchmarks/$script" "${args[@]}" --json "$json" \
      >> "$log" 2>&1
    rc=$?
  fi
  [ "$rc" = 0 ] && [ ! -f "$json" ] && rc=4   # ran, wrote nothing
  summary+=("$name@$t: rc=$rc in $((SECONDS - t0)) s$([ "$rc" = 124 ] && echo " (timed out after $secs s)")")
  echo "--- $name@$t (rc=$rc, $((SECONDS - t0)) s)"
  grep -a -E "^\| |^[a-zA-Z]+ +(tvm_ffi|cython|cuBLAS) |MET|MISSED|target|compiled|timed|tree imports|OK:|Error|error" \
    "$log" | grep -v "INFO\]" | tail -30
}

for what in ${WHAT//,/ }; do
  case $what in
    check) for t in old new; do
             if check_tree "$t"; then summary+=("check@$t: ok"); else summary+=("check@$t: FAILED"); fi
           done ;;
    build_modes|fused|gemm_configs) bench "$what" old; bench "$what" new ;;
    build_modes@old|build_modes@new|fused@old|fused@new|gemm_configs@old|gemm_configs@new)
      bench "${what%@*}" "${what#*@}" ;;
    compare) ;;
    *) echo "unknown step $what (check, build_modes, fused, gemm_configs, BENCH@old, BENCH@new, compare)" >&2; exit 2 ;;
  esac
done
echo "== summary"; printf '%s\n' "${summary[@]}"
if ls "$OUTD"/old/*.json "$OUTD"/new/*.json > /dev/null 2>&1; then
  echo "== old ($OLD) vs new ($ROOT), tolerance $TOL"
  python3 "$ROOT/benchmarks/compare_runs.py" --dirs "$OUTD/old" "$OUTD/new" --tol "$TOL" --out "$OUTD/compare.md"
else
  echo "== no benchmark JSON in $OUTD/old or $OUTD/new yet: no tables"
fi
