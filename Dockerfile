# attune: operator, agent sidecar, the reference trainer and the HF Trainer framework in one non-root image.
# Every Python package is pinned by docker/constraints.txt (the versions CI tests); torch is the CPU build unless
# TORCH_INDEX_URL points at another wheel index (GPU base images may provide their own torch).
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
WORKDIR /src
COPY pyproject.toml README.md ./
COPY docker ./docker
COPY attune ./attune
# docker/wheels (not in git): wheels to prefer over any index, e.g. a local torch CPU build (docker/buildah-build.sh)
RUN pip wheel --no-cache-dir --wheel-dir /wheels --extra-index-url "${TORCH_INDEX_URL}" --find-links ./docker/wheels \
        -c docker/constraints.txt ".[torch,k8s,llm,hf]"

FROM ${PYTHON_IMAGE}
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent attune
COPY --from=build /wheels /wheels
COPY docker/constraints.txt /etc/attune-constraints.txt
RUN pip install --no-cache-dir --no-index --find-links /wheels -c /etc/attune-constraints.txt /wheels/attune_llm-*.whl \
        "attune-llm[torch,k8s,llm,hf]" && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 HOME=/tmp
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["attune"]
CMD ["operator", "run"]
