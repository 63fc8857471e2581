#!/bin/bash
# A lent GPU machine's checks (the device tool's `run`; it has torch but no registry), in two parts that fit one
# call each, so that the GPU's minutes go to what a cut-off run would lose last:
#   scripts/cuda_check.sh tests OUT_DIR [SECONDS]       install rlcli there, run tests/test_cuda.py
#   scripts/cuda_check.sh speed OUT_DIR [SECONDS [ROW ...]]   steady env steps/s of one run per row
#       (scripts/cuda_speed.py; default rows: sac-compiled-capture sac-compiled sac-eager ppo-compiled)
#   scripts/cuda_check.sh bench OUT_DIR [SECONDS [SAC_STEPS [--compiled]]]
#       time SAC Pendulum as one seed against a population of 8 on device=cuda (--compiled: the population with
#       compile=true only, the target row; the eager one is left out for time)
# Both install rlcli into the machine's Python first unless it is there (a warm machine keeps it).
# Needs the wheels of rlcli's pure-Python dependencies the machine lacks in .whl/ (gymnasium, farama-notifications,
# hydra-core, omegaconf, antlr4-python3-runtime; hatchling, trove-classifiers and tomlkit to build rlcli there),
# made here once and carried along (the device tool's carry=[".whl"]):
#   echo /.whl/ >> .git/info/exclude
#   pip download -q --no-deps --only-binary=:all: -d .whl gymnasium==1.4.0 farama-notifications==0.0.6 \
#       hydra-core==1.3.8 omegaconf==2.3.1 hatchling trove-classifiers tomlkit
#   pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3   # an sdist only on PyPI; pure Python
# On 2026-11-26 (an H200) the tests took ~90 s on 14 workers and one SAC seed 174 s for 20k steps (28 s for 4k
# after the storing changes of that day). On 2026-11-28 (an H200, torch 2.11) the tests took 142 s on 14 workers; the
# speed rows 35-60 s each (compiling cold). pytest runs -v so that a cut-off run still names each outcome.
set -u
part=${1:?usage: scripts/cuda_check.sh tests|speed|bench OUT_DIR [SECONDS ...]}
out=${2:?usage: scripts/cuda_check.sh tests|speed|bench OUT_DIR [SECONDS ...]}
budget=${3:-540}
export PYTHONUNBUFFERED=1
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
  || { echo "scripts/cuda_check.sh: no GPU here (it installs rlcli into the machine's Python: run it on a lent GPU)"; exit 2; }
nproc
if ! python3 -c "import rlcli" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 3
  python3 -m pip install -q --no-index --no-deps --no-build-isolation . || exit 3
fi
python3 -c "import torch, rlcli; print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 3
case $part in
tests)
  echo "== tests/test_cuda.py ($(left) s left)"
  timeout $(($(left) - 5)) python3 -m pytest tests/test_cuda.py -v -n 14 -p no:cacheprovider --durations=60 \
    >"$out/cuda_tests.log" 2>&1
  echo "pytest exit $?"
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$out/cuda_tests.log" | tail -80
  grep -B2 -A30 "^_____" "$out/cuda_tests.log" | head -150  # the first failures' tracebacks, if any
  ;;
bench)
  steps=${4:-20000}
  compiled=${5:-}
  echo "== SAC Pendulum-v1 $steps steps, one seed and a population of 8, device=cuda ($(left) s left)"
  timeout $(($(left) - 5)) python3 scripts/population_bench.py --algo sac --steps "$steps" --members 8 --no-basic \
    --no-sb3 ${compiled:+--compiled --no-one-compiled --no-eager} --device cuda --keep /tmp/bench \
    --out "$out/sac_cuda.json" >"$out/sac_cuda.txt" 2>&1
  echo "bench exit $?"
  cat "$out/sac_cuda.txt"
  for log in /tmp/bench/one/train.log /tmp/bench/population*/0/train.log; do
    [ -f "$log" ] && { echo "-- $log"; grep -E "time:|compile" "$log"; tail -n 2 "$log"; }  # a cut-off row's progress
  done
  ;;
speed)
  rows=("${@:4}")
  [ ${#rows[@]} -eq 0 ] && rows=(sac-compiled-capture sac-compiled sac-eager ppo-compiled)
  echo "== rl-train rows on device=cuda: ${rows[*]} ($(left) s left)"
  python3 scripts/cuda_speed.py --deadline $(($(left) - 10)) --out "$out/speed.json" "${rows[@]}" 2>&1 | tee "$out/speed.txt"
  for log in /tmp/speed-*/train.log; do echo "-- $log"; grep -E "time:|done:|cuda graphs" "$log"; done
  ;;
*) echo "scripts/cuda_check.sh: the part is tests, speed or bench, not $part"; exit 2 ;;
esac
echo "== done, $(left) s left"
