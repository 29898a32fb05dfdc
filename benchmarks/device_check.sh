#!/usr/bin/env bash
# The GPU checks in one run, for a lent CUDA machine whose Python already has torch (and
# torchvision for nvJPEG): the tests with CUDA paths, bench_gpu.py (pinned copy, nvJPEG, loader
# epochs onto the device, a ResNet-50 fed by feedpipe), bench_augment.py (batch operations on the
# device) and bench_batch_size.py (find_batch_size). Each step has its own time limit, so one
# failing step still leaves the others' figures. Wheels of feedpipe's own dependencies the
# machine lacks may wait in .whl/ (see benchmarks/README.md). Figures go to $OUT (default
# device-out/).
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
step() {  # step NAME SECONDS COMMAND...: its output appended to $OUT/steps.log, its status to status.txt
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "=== $name" >>"$OUT/steps.log"
    timeout "$limit" "$@" >>"$OUT/steps.log" 2>&1
    echo "$name rc=$? $((SECONDS - t0))s" | tee -a "$OUT/status.txt"
}
{ nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  $PY -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'cpus', __import__('os').cpu_count())"; } >"$OUT/device.txt" 2>&1
step tests 150 $PY -m pytest -q -p no:cacheprovider -rs tests/test_augment.py tests/test_hot_path.py \
    tests/test_device_decode.py tests/test_monitor.py tests/test_gpu_probe.py tests/test_bench_gpu.py
step bench_gpu 210 $PY benchmarks/bench_gpu.py --images 2048 --batch 256 --steps 30 --epochs 2 \
    --data /tmp/bench-data --json "$OUT/gpu.json"
step bench_augment 60 $PY benchmarks/bench_augment.py --devices cpu,cuda --json "$OUT/augment.json"
step bench_batch_size 120 $PY benchmarks/bench_batch_size.py --json "$OUT/batch_size.json"
cat "$OUT/status.txt"
