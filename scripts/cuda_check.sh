#!/bin/bash
# One pass on a lent GPU machine (the device tool's `run`; it has torch but no registry): install rlcli into the
# machine's Python, run tests/test_cuda.py, then time SAC Pendulum as one seed against a population on device=cuda.
#   scripts/cuda_check.sh OUT_DIR [SECONDS [SAC_STEPS [--compiled]]]   (--compiled: the compile=true rows too)
# Needs the wheels of rlcli's pure-Python dependencies the machine lacks in .whl/ (gymnasium, farama-notifications,
# hydra-core, omegaconf, antlr4-python3-runtime; hatchling, trove-classifiers and tomlkit to build rlcli there),
# made here once and carried along (the device tool's carry=[".whl"]):
#   echo /.whl/ >> .git/info/exclude
#   pip download -q --no-deps --only-binary=:all: -d .whl gymnasium==1.4.0 farama-notifications==0.0.6 \
#       hydra-core==1.3.8 omegaconf==2.3.1 hatchling trove-classifiers tomlkit
#   pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3   # an sdist only on PyPI; pure Python
# On 2026-11-26 (an H200) the tests took ~90 s on 14 workers and one SAC seed 174 s for 20k steps: give the
# tests 2/5 of SECONDS and the benchmark the rest. pytest runs -v so that a cut-off run still names each outcome.
set -u
out=${1:?usage: scripts/cuda_check.sh OUT_DIR [SECONDS [SAC_STEPS [--compiled]]]}
budget=${2:-540}
steps=${3:-20000}
compiled=${4:-}
export PYTHONUNBUFFERED=1
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --no-build-isolation . || exit 3
python3 -c "import torch, rlcli; print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 3
echo "== tests/test_cuda.py ($(left) s left)"
timeout $((budget * 2 / 5)) python3 -m pytest tests/test_cuda.py -v -n 14 -p no:cacheprovider --durations=40 >"$out/cuda_tests.log" 2>&1
echo "pytest exit $?"
grep -E "PASSED|FAILED|passed|failed" "$out/cuda_tests.log" | tail -50  # -v: each outcome as it comes, also when cut off
echo "== SAC Pendulum-v1 $steps steps, one seed and a population of 8, device=cuda ($(left) s left)"
timeout $(($(left) - 10)) python3 scripts/population_bench.py --algo sac --steps "$steps" --members 8 --no-basic --no-sb3 $compiled \
  --device cuda --keep /tmp/bench --out "$out/sac_cuda.json" >"$out/sac_cuda.txt" 2>&1
echo "bench exit $?"
cat "$out/sac_cuda.txt"
grep -H "time:" /tmp/bench/one/train.log "/tmp/bench/population 8/0/train.log" 2>/dev/null
tail -n 2 /tmp/bench/one/train.log "/tmp/bench/population 8/0/train.log" 2>/dev/null  # how far a cut-off row got
if [ "$(left)" -gt 120 ]; then
  echo "== scaling: SAC 3k steps, populations of 1, 8 and 32, device=cuda ($(left) s left)"
  timeout $(($(left) - 15)) python3 scripts/population_bench.py --algo sac --steps 3000 --members 1 8 32 --no-basic \
    --no-sb3 --device cuda --out "$out/sac_scaling.json" >"$out/sac_scaling.txt" 2>&1
  echo "scaling exit $?"
  cat "$out/sac_scaling.txt"
fi
echo "== done, $(left) s left"
