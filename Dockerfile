# attune: operator, agent sidecar and reference trainer in one small non-root image.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY attune ./attune
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[k8s]"

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent attune
COPY --from=build /wheels /wheels
# torch comes from the CPU index unless a GPU base image provides it; trial images extend this one
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 HOME=/tmp
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["attune"]
CMD ["operator", "run"]
