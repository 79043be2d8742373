# One device call from a preset's search to its bench:  bash bench/search_promote_bench.sh MODEL [SEARCH_S]
#
# Run on a bare device machine from the repository root, with the optuna wheels carried in .whl and the commit
# passed in (KOG_GIT_COMMIT: the device copy's git metadata can be stale). In one call:
#   1. `kogtune search` of MODEL on this GPU (bench/tune_h200.py --skip-sweep, SEARCH_S seconds, 210 by default;
#      study kog-<vendor>-<gpu>-MODEL, its storage $OUT/search_MODEL/search.db);
#   2. python -m kog.tune.promote of that study: tune/data/builtin_tuned.json and tune/data/studies/<study>.json
#      of this copy, both copied to $OUT to be committed (a refusal, e.g. no confirmed gain, leaves the table
#      as it was and says why in $OUT/promote.log);
#   3. `kogtune bench` of MODEL (bench/all_presets.py $OUT/bench): the built-in entry just written against the
#      rule (kog-rule) and the baselines, in the same run; its timeline copied to $OUT/bench/timeline.parquet.
# Each step has its own timeout, so a slow step leaves the ones before it under $OUT. About SEARCH_S + 200 s
# on a ~1.5B preset (the bench alone ~160 s; llama-3.1-8b's search trials and confirmation take longer). The
# bench gets what is left of CALL_S seconds (590 by default: the device's per-call limit less a margin) and is
# skipped, with one line saying so, when that is under BENCH_MIN_S (120). Run directories are deleted: they sit
# too deep to come back.
set -u
MODEL=${1:?usage: bash bench/search_promote_bench.sh MODEL [SEARCH_S]}
SEARCH_S=${2:-210}
CALL_S=${CALL_S:-590}
BENCH_MIN_S=${BENCH_MIN_S:-120}
T0=$(date +%s)
OUT=${OUT:?set OUT to the folder whose files come back}
source bench/device_env.sh .whl
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name(0))" 2>/dev/null) || {
    echo "search_promote_bench: no GPU"; exit 1; }
SLUG=$(echo "$GPU" | tr 'A-Z' 'a-z' | sed -E 's/ (80gb|141gb).*//; s/[^a-z0-9]+/-/g; s/-+$//')
STUDY=kog-$SLUG-$MODEL
echo "search_promote_bench: $MODEL on $GPU, study $STUDY, commit ${KOG_GIT_COMMIT:-unset}"

timeout $((SEARCH_S + 150)) python3 bench/tune_h200.py --model "$MODEL" --skip-sweep --budget-s "$SEARCH_S" \
    --study "$STUDY" --out "$OUT/search_$MODEL" > "$OUT/search_$MODEL.log" 2>&1
echo "search: exit $?"
rm -rf "$OUT/search_$MODEL/runs"

python3 -m kog.tune.promote --storage "sqlite:///$OUT/search_$MODEL/search.db" --study "$STUDY" \
    > "$OUT/promote.log" 2>&1
echo "promote: exit $? ($(tail -1 "$OUT/promote.log"))"
cp tune/data/builtin_tuned.json "$OUT/"
cp "tune/data/studies/$STUDY.json" "$OUT/" 2>/dev/null

LEFT=$((CALL_S - ($(date +%s) - T0) - 10))
if (( LEFT < BENCH_MIN_S )); then
    echo "bench: skipped, ${LEFT} s left of CALL_S=${CALL_S} (needs ${BENCH_MIN_S}); run bench/all_presets.py next"
    exit 0
fi
timeout "$LEFT" python3 bench/all_presets.py "$OUT/bench" --presets "$MODEL" > "$OUT/bench.log" 2>&1
echo "bench: exit $? (timeout ${LEFT} s)"
TL=$(find "$OUT/bench/runs" -name timeline.parquet 2>/dev/null | head -1)
[ -n "$TL" ] && cp "$TL" "$OUT/bench/timeline.parquet"
rm -rf "$OUT/bench/runs"
