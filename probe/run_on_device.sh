#!/bin/bash
# One device call: install, quick + full scan (+ a second full scan with SECOND=1), L2 diagnostics,
# GPU tests; the run directories come back as one tarball under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 KOG_DEBUG=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=/tmp/kogruns
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -3; python3 -c "import kog.probe.scan, torch; print(\"kog ok\", torch.__version__)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
s=$EPOCHREALTIME; timeout ${QUICK_T:-70} python3 -m kog.probe.cli scan --quick --no-report --runs-dir $R/quick > $OUT/quick.txt 2>&1; rc=$?; echo "quick rc=$rc wall=$(python3 -c "print(round($EPOCHREALTIME-$s,1))")"
tail -45 $OUT/quick.txt
s=$EPOCHREALTIME; timeout ${FULL_T:-130} python3 -m kog.probe.cli scan --no-report --runs-dir $R/full > $OUT/full.txt 2>&1; rc=$?; echo "full rc=$rc wall=$(python3 -c "print(round($EPOCHREALTIME-$s,1))")"
tail -45 $OUT/full.txt
if [ -n "$SECOND" ]; then
  s=$EPOCHREALTIME; timeout ${FULL_T:-130} python3 -m kog.probe.cli scan --no-report --runs-dir $R/full2 > $OUT/full2.txt 2>&1; rc=$?; echo "full2 rc=$rc wall=$(python3 -c "print(round($EPOCHREALTIME-$s,1))")"
  tail -30 $OUT/full2.txt
fi
if [ -n "$DIAG" ]; then timeout ${DIAG_T:-40} python3 -m kog.probe.probes.diag $OUT/l2diag.json 2>&1 | tail -20; fi
timeout ${TEST_T:-45} python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_probes_gpu.py 2>&1 | tail -15
tar czf $OUT/runs.tgz -C $R . && ls -la $OUT
