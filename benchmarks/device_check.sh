#!/usr/bin/env bash
# The GPU checks in one run, for a lent CUDA machine whose Python already has torch (and
# torchvision for nvJPEG; DALI where installed): the tests with CUDA paths (the feed engine,
# nvJPEG, DALI, the batch operations), then benchmarks/bench_gpu.py: the copy rates
# (cudaHostAlloc, /dev/shm registered in place, pageable) and cudaHostRegister's cost, nvJPEG
# against a CPU core, the loader alone at 1-15 workers, and a ResNet-50 AMP step fed by CPU
# decode, nvJPEG and DALI at 8 and 15 workers (fed rate over the step's own, GPU idle gaps).
# Each step has its own time limit (about 9 minutes in all; the tests, then the fed step), so
# one failing step still leaves the others' figures. Wheels of feedpipe's own dependencies the
# machine lacks may wait in .whl/ (see benchmarks/README.md). Figures go to $OUT (default
# device-out/). STEPS="tests data training" runs only those steps (default: all);
# TRAIN_WORKERS and TRAIN_STEPS shorten the fed step.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DATA=${DATA:-/tmp/bench-data}
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
STEPS=${STEPS:-tests data training copy_decode loader}
step() {  # step NAME SECONDS COMMAND...: its output appended to $OUT/steps.log, its status to status.txt
    local name=$1 limit=$2; shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    local t0=$SECONDS
    echo "=== $name" >>"$OUT/steps.log"
    timeout "$limit" "$@" >>"$OUT/steps.log" 2>&1
    echo "$name rc=$? $((SECONDS - t0))s" | tee -a "$OUT/status.txt"
}
{ nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)"
  echo "commit ${COMMIT:-$(git log -1 --format="%h %cs" 2>/dev/null)}"  # COMMIT: where a copy has no history
  $PY -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'cpus', __import__('os').cpu_count())"
  $PY -c "import torchvision; print('torchvision', torchvision.__version__)" 2>&1 | tail -1
  $PY -c "import nvidia.dali as d; print('dali', d.__version__)" 2>&1 | tail -1; } >"$OUT/device.txt" 2>&1
# the tests with CUDA paths first (a short budget still checks the code), then the photos and
# their packing, outside the timed steps' limits
step tests 80 $PY -m pytest -q -p no:cacheprovider -rs tests/test_engine.py \
    tests/test_device_decode.py tests/test_dali.py tests/test_augment.py tests/test_gpu_probe.py
step data 100 $PY -c "
from pathlib import Path
from converters import convert
from converters.synth import make_photos
d = Path('$DATA'); p = d / 'gpu-photos-8192'
if not p.exists(): make_photos(p, 8192, size=(500, 375), classes=10, seed=3)
if not (d / 'gpu-lmdb-8192').exists(): convert(p, d / 'gpu-lmdb-8192', to='lmdb', workers=8)"
# the fed step (the goal), then the copy and decode rates and the loader's scaling
step training 200 $PY benchmarks/bench_gpu.py --parts training --data "$DATA" --images 8192 \
    --batch 256 --steps "${TRAIN_STEPS:-100}" --warmup 12 \
    --train-workers "${TRAIN_WORKERS:-8,15}" --json "$OUT/gpu-training.json"
step copy_decode 40 $PY benchmarks/bench_gpu.py --parts copy,decode --data "$DATA" \
    --images 8192 --json "$OUT/gpu-copy.json"
step loader 100 $PY benchmarks/bench_gpu.py --parts loader --data "$DATA" --images 8192 \
    --batch 256 --scale-workers 1,2,4,8,12,15 --workers 8 --loader-batches 30 \
    --json "$OUT/gpu-loader.json"
cat "$OUT/status.txt"
