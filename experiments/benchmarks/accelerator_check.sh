#!/usr/bin/env bash
# The accelerator check on a lent GPU / TPU machine (no network there), in two halves.
#
# 1. Here, in the repo root, before the device session (needs this checkout's .venv):
#      bash experiments/benchmarks/accelerator_check.sh prepare
#    copies the pure-Python packages the lent machine's image lacks (ml_collections,
#    math-verify, latex2sympy2_extended, antlr4-python3-runtime, tensorboardX: what importing
#    ibpo_jax.trainer.loop needs beyond the image's jax, flax, optax, orbax, numpy) from .venv
#    into .accel_site/ (~6 MB, ignored through .git/info/exclude), with the commit and dirty
#    flag of this checkout (the tree travels without .git). A virtual environment cannot
#    travel: the image's own python3 and jax run the check.
# 2. On the lent machine, as the device tool's command with carry [".accel_site"]:
#      bash experiments/benchmarks/accelerator_check.sh run [accelerator_check.py args]
#    writes $OUT/accelerator_agreement.json, $OUT/accelerator_check.json and
#    $OUT/accelerator_check.log (both tables). Where device time is left after it:
#      bash experiments/benchmarks/accelerator_check.sh schedules
#    times today's sampler, slot refill and partial rollouts on a random model of Qwen3-0.6B's
#    dimensions (bench_partial.py --model 0.6b: issue 59, whether refill pays where decode is
#    bound by the weights), at most SCHEDULES_TIMEOUT (default 240) seconds, into
#    $OUT/bench_partial.json and $OUT/bench_partial.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
SITE=.accel_site

lent_env() {  # the lent machine's environment: the image's python with .accel_site
  OUT=${OUT:-/tmp/accelerator_check}
  mkdir -p "$OUT"
  if [ ! -f "$SITE/COMMIT" ]; then
    echo "no $SITE: run 'bash $0 prepare' here first and carry [\"$SITE\"]" >&2
    exit 2
  fi
  read -r IBPO_GIT_COMMIT IBPO_GIT_DIRTY < "$SITE/COMMIT"
  export IBPO_GIT_COMMIT IBPO_GIT_DIRTY PYTHONUNBUFFERED=1
  export PYTHONPATH="$PWD/$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  # The share of GPU memory XLA may take (chips.Chip.usable_fraction, the README's GPU command).
  export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
  PY=${PYTHON:-python3}
}

case "${1:-}" in
prepare)
  rm -rf "$SITE" && mkdir -p "$SITE"
  .venv/bin/python - "$SITE" <<'EOF' || exit 1
import importlib.metadata as md, shutil, sys
from pathlib import Path
site = Path(sys.argv[1])
for name in ("ml_collections", "math-verify", "latex2sympy2_extended",
             "antlr4-python3-runtime", "tensorboardX"):
    dist = md.distribution(name)
    for f in dist.files or ():
        src = Path(dist.locate_file(f))
        if "__pycache__" in f.parts or f.parts[0] == ".." or not src.is_file():
            continue
        (site / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, site / f)
    print(f"{name} {dist.version}")
EOF
  dirty=0
  [ -n "$(git status --porcelain --untracked-files=no)" ] && dirty=1
  echo "$(git rev-parse HEAD) $dirty" > "$SITE/COMMIT"
  grep -qx "/$SITE/" .git/info/exclude 2>/dev/null || echo "/$SITE/" >> .git/info/exclude
  du -sh "$SITE"
  ;;
run)
  shift
  lent_env
  { nvidia-smi -L 2>/dev/null; "$PY" -c "import jax, flax, optax; print('jax', jax.__version__,
    'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"; } \
    2>&1 | tee "$OUT/accelerator_check.log"
  # First the kernels' and the sampler's agreement (accelerator_agreement.py, issue 61 item 1),
  # at most AGREE_TIMEOUT seconds; its verdict is kept for the exit status.
  timeout -k 5 "${AGREE_TIMEOUT:-120}" "$PY" experiments/benchmarks/accelerator_agreement.py \
    --out "$OUT/accelerator_agreement.json" 2>&1 | tee -a "$OUT/accelerator_check.log"
  agreed=${PIPESTATUS[0]}
  # The check stops starting steps at --time-limit (default 540 s; pass a smaller one to fit
  # a shorter session); the kill is a backstop, and the JSON is rewritten after every step,
  # so a killed run still returns its figures.
  timeout -k 5 "${CHECK_TIMEOUT:-585}" "$PY" experiments/benchmarks/accelerator_check.py \
    --out "$OUT/accelerator_check.json" "$@" 2>&1 | tee -a "$OUT/accelerator_check.log"
  checked=${PIPESTATUS[0]}
  [ "$agreed" -ne 0 ] && echo "accelerator_agreement.py exited $agreed" | tee -a "$OUT/accelerator_check.log"
  [ "$checked" -ne 0 ] && exit "$checked"
  exit "$agreed"
  ;;
schedules)
  lent_env
  echo "commit $IBPO_GIT_COMMIT dirty $IBPO_GIT_DIRTY" | tee "$OUT/bench_partial.log"
  timeout -k 5 "${SCHEDULES_TIMEOUT:-240}" "$PY" -m experiments.benchmarks.bench_partial \
    --workload skewed --model 0.6b --steps 5 --json "$OUT/bench_partial.json" 2>&1 \
    | tee -a "$OUT/bench_partial.log"
  exit "${PIPESTATUS[0]}"
  ;;
*)
  echo "usage: $0 prepare | run [accelerator_check.py args] | schedules" >&2
  exit 2
  ;;
esac
