# A kernel experiment kept as a patch, against this checkout, in one device call:
#   bash bench/ab_patch.sh PATCH NAME [ab_trees.py options...]
#
# Run on a bare device machine from the repository root with OUT set and the optuna wheels in .whl (as
# bench/search_promote_bench.sh). Copies the checkout's kog sources (core probe tune engine reports) to
# /tmp/ab_patch, applies PATCH's changes to them there (git apply), packs them as a tar and runs
# bench/ab_trees.py with this checkout as `base` and the patched tree as NAME, the options passed on (e.g.
# --presets qwen2.5-1.5b llama-3.2-1b --rounds 2 --max-seq 321). Writes $OUT/ab_NAME.json (after every
# process) and $OUT/ab_NAME.log.
# A patch that does not apply stops the call with one line before anything runs.
set -u
PATCH=$(realpath "${1:?usage: bash bench/ab_patch.sh PATCH NAME [ab_trees.py options...]}")
NAME=${2:?usage: bash bench/ab_patch.sh PATCH NAME [ab_trees.py options...]}
shift 2
OUT=${OUT:?set OUT to the folder whose files come back}
mkdir -p "$OUT"
source bench/device_env.sh .whl
rm -rf /tmp/ab_patch && mkdir -p /tmp/ab_patch
cp -r core probe tune engine reports /tmp/ab_patch/
# the patch's changes outside the package (tests, docs) are not part of the tree a process imports
(cd /tmp/ab_patch && git init -q && git apply --exclude='tests/*' --exclude='docs/*' --exclude='bench/*' "$PATCH") || {
    echo "ab_patch: $PATCH does not apply to this checkout"; exit 1; }
tar cf /tmp/ab_patch.tar -C /tmp/ab_patch core probe tune engine reports
python3 bench/ab_trees.py "$OUT/ab_$NAME.json" --tree base=/tmp/kog-path --tree "$NAME=/tmp/ab_patch.tar" "$@" \
    > "$OUT/ab_$NAME.log" 2>&1
echo "ab_patch: exit $?"; tail -4 "$OUT/ab_$NAME.log"
