#!/usr/bin/env bash
# On a machine with a CUDA GPU: run the course's GPU paths, time the GPU-fast recipe, re-record what
# lectures 04 and 11 show in a room without a GPU, then run the whole test suite.
#
#   tools/gpu_check.sh OUT        # MNIST from $COURSE_DATA_DIR; the recipe on $FULL_DATA_DIR (default: the same)
#   SUITE_WORKERS=8 SUITE_TIMEOUT=300 tools/gpu_check.sh OUT   # the suite under pytest-xdist, if installed
#   SUITE_TIMEOUT=0 tools/gpu_check.sh OUT                      # everything but the suite
#
# Writes OUT/gpu_check.log (everything), OUT/train.jsonl (one JSON summary per CLI run), OUT/gpu_fast.json,
# OUT/recorded/{04_single_gpu,11_mixed_precision}.json (copy them into course_lib/recorded/ to ship them),
# OUT/lectures.tgz (the two executed notebooks) and OUT/suite.log. Every step has a timeout; a failing
# step is logged with its exit status and the script goes on, so that one run shows everything.
set -uo pipefail
OUT=$(mkdir -p "${1:?usage: tools/gpu_check.sh OUT_DIR}/recorded" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
FULL_DATA_DIR=${FULL_DATA_DIR:-${COURSE_DATA_DIR:-}}
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1 COURSE_DOWNLOAD=${COURSE_DOWNLOAD:-0}
exec > >(tee -a "$OUT/gpu_check.log") 2>&1

step() {  # step SECONDS NAME 'COMMAND': run it in bash with a timeout, log its time and exit status, go on
    local t0=$SECONDS
    echo "=== $2"
    timeout --kill-after=10 "$1" bash -c "set -o pipefail; $3"
    echo "=== $2: exit $? after $((SECONDS - t0)) s"
}
json() { echo "| tee /dev/stderr | tail -1 >>'$OUT/$1'"; }   # keep a command's last line (its --json)

step 30 "machine" "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.backends.cudnn.version())'"
step 120 "GPU unit tests" "$PY -m pytest -q -p no:cacheprovider -rs tests/test_gpu.py tests/test_precision.py \
    tests/test_measure.py tests/test_distillation.py tests/test_train_precision.py tests/test_env.py"
for flags in "" "--precision bf16" "--precision 16"; do
    step 90 "train --device cuda $flags" "$PY -m course_lib.train --device cuda --no-progress --json $flags $(json train.jsonl)"
done
step 120 "torchrun --nproc_per_node 1 --strategy ddp (nccl)" "torchrun --standalone --nproc_per_node 1 \
    -m course_lib.train --strategy ddp --device cuda --no-progress --json $(json train.jsonl)"
step 300 "bench gpu-fast" "$PY -m course_lib.bench gpu-fast --json ${FULL_DATA_DIR:+--data-dir '$FULL_DATA_DIR'} \
    $(json gpu_fast.json)"
for nb in 04_single_gpu 11_mixed_precision; do
    step 300 "lecture $nb (normal mode, recording)" "COURSE_QUICK=0 COURSE_RECORD_DIR='$OUT/recorded' $PY -c \"
from pathlib import Path
from course_lib.bench.lectures import time_notebook
seconds, error = time_notebook(Path('notebooks/$nb.ipynb'), save_to=Path('$OUT/$nb.executed.ipynb'))
print('$nb: %.0f s,' % seconds, error or 'no error'); raise SystemExit(1 if error else 0)\""
done
(cd "$OUT" && tar czf lectures.tgz --remove-files ./*.executed.ipynb)
[ "${SUITE_TIMEOUT:-}" = 0 ] && exit 0   # SUITE_TIMEOUT=0: everything but the suite
XDIST=""
# --dist loadfile: nbval runs a notebook's cells in one kernel, so they must stay on one worker
if [ -n "${SUITE_WORKERS:-}" ] && $PY -c "import xdist" 2>/dev/null; then XDIST="-n $SUITE_WORKERS --dist loadfile"; fi
step "${SUITE_TIMEOUT:-1800}" "test suite (quick mode, nbval)" "COURSE_QUICK=1 $PY -m pytest $XDIST --nbval-lax \
    --nbval-current-env --nbval-cell-timeout=600 -p no:cacheprovider -q -ra tests notebooks solutions >'$OUT/suite.log' 2>&1"
tail -40 "$OUT/suite.log"
