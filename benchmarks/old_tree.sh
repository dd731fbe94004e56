#!/usr/bin/env bash
# An older tree of tilescale, ready to run its benchmarks beside today's (tests/gpu/compare_trees.sh):
#
#   bash benchmarks/old_tree.sh [OLD_REV] [DEST]      # default 7fb3089 into .bench-old/ of the repo root
#
# Writes `git archive OLD_REV` of what the benchmarks need (tilescale/, benchmarks/ without results/, launch.sh,
# pyproject.toml, setup.py) into DEST, with DEST/BENCH_REV naming the commit; no git metadata, nothing to
# install. DEST (.bench-old/ is git-ignored) travels to the GPU machine as a carried path; there the old tree runs
# from it, its own tilescale first on PYTHONPATH (the device prelude puts the repo root there):
#   cd .bench-old && PYTHONPATH="$PWD:$PYTHONPATH" GPUS=1 bash launch.sh benchmarks/bench_build_modes.py ...
# (its launch.sh also puts its own folder first). Prints DEST's size; fails above 20 MiB.
set -euo pipefail
ROOT=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
REV=${1:-7fb3089}
DEST=${2:-$ROOT/.bench-old}
MAX_BYTES=$((20 * 1024 * 1024))
sha=$(git -C "$ROOT" rev-parse --verify --quiet "$REV^{commit}") || { echo "old_tree.sh: $REV: not a commit here" >&2; exit 2; }
if [ -e "$DEST" ]; then
  # only a folder this script wrote (or an empty one) is replaced
  if [ ! -d "$DEST" ] || { [ ! -f "$DEST/BENCH_REV" ] && [ -n "$(ls -A "$DEST")" ]; }; then
    echo "old_tree.sh: $DEST exists and was not written by old_tree.sh (no BENCH_REV): not replacing it" >&2
    exit 2
  fi
  rm -rf "$DEST"
fi
mkdir -p "$DEST"
paths=()
for p in tilescale benchmarks launch.sh pyproject.toml setup.py; do
  if git -C "$ROOT" cat-file -e "$sha:$p" 2>/dev/null; then paths+=("$p"); fi
done
for p in tilescale benchmarks launch.sh; do
  case " ${paths[*]} " in *" $p "*) ;; *) echo "old_tree.sh: $REV has no $p" >&2; rm -rf "$DEST"; exit 2 ;; esac
done
git -C "$ROOT" archive --format=tar "$sha" -- "${paths[@]}" ':(exclude)benchmarks/results' | tar -x -C "$DEST"
printf '%s %s\n' "$sha" "$(git -C "$ROOT" log -1 --format='%h %s' "$sha" | cut -c1-100)" > "$DEST/BENCH_REV"
bytes=$(du -sb "$DEST" | cut -f1)
echo "old_tree.sh: $REV ($(cut -c1-12 "$DEST/BENCH_REV")) in $DEST: $(find "$DEST" -type f | wc -l) files," \
     "$((bytes / 1024)) KiB"
if [ "$bytes" -gt "$MAX_BYTES" ]; then
  echo "old_tree.sh: $DEST is $((bytes / 1024 / 1024)) MiB, over the 20 MiB that may travel with it" >&2
  exit 1
fi
