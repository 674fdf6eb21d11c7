# Worker image: the evaluation environment in a container, for hostile candidate code.
#
# The container is the boundary here: no network, a read-only root filesystem, a non-root user,
# and writable space only where it is mounted (a tmpfs for /tmp, a volume for the compile cache).
# Inside it, the per-worker namespaces of env/isolation.py usually cannot be created (Docker's
# default seccomp and AppArmor profiles refuse unshare and mount), and the workers fall back to
# the container's boundary plus the in-process sandbox; `multiminddev doctor --json` says which.
#
# Build (needs the network once):   docker build -t multiminddev-worker .
# Run (no network from here on):
#   docker run --rm --gpus all --network none --read-only \
#     --tmpfs /tmp:rw,nosuid,nodev,size=4g --tmpfs /dev/shm:rw,nosuid,nodev,size=1g \
#     --cap-drop ALL --security-opt no-new-privileges \
#     -v mmd-cache:/var/cache/multiminddev \
#     -v "$PWD/problems:/data/problems:ro" -v "$PWD/candidates:/data/candidates:ro" \
#     multiminddev-worker eval-dir /data/problems /data/candidates --out /tmp/results.jsonl
#   (`doctor --json` as the command checks the GPU, NVRTC and the boundary.)
#
# The runtime base image is enough for NVRTC candidates (torch and NVRTC come as pip wheels);
# the load_inline compat path also needs nvcc: use the matching -devel base image for that.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV"

# Dependencies first (a layer that survives source edits), then the package itself.
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN pip install --upgrade pip \
    && pip install /src \
    && python -m compileall -q "$VIRTUAL_ENV" \
    && rm -rf /src

# A non-root user; the only writable places at run time are the mounted tmpfs and the cache
# volume (created here so the volume inherits its owner).
RUN useradd --create-home --uid 10001 --user-group mmd \
    && mkdir -p /var/cache/multiminddev/torch_extensions \
    && chown -R mmd:mmd /var/cache/multiminddev
ENV HOME=/tmp \
    MULTIMINDDEV_CACHE=/var/cache/multiminddev \
    TORCH_EXTENSIONS_DIR=/var/cache/multiminddev/torch_extensions \
    TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor \
    TRITON_CACHE_DIR=/tmp/triton
VOLUME ["/var/cache/multiminddev"]
USER mmd
WORKDIR /tmp

ENTRYPOINT ["multiminddev"]
CMD ["doctor"]
