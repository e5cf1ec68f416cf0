# Multi-stage: build a wheel with the toolchain, run it without one, as a non-root user.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install --no-cache-dir build && python -m build --wheel --outdir /dist

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 kubemoot
COPY --from=build /dist/*.whl /tmp/
RUN pip install --no-cache-dir /tmp/*.whl && rm -f /tmp/*.whl
USER 10001
ENV KUBEMOOT_LISTEN=127.0.0.1:11434 PYTHONUNBUFFERED=1
EXPOSE 11434
ENTRYPOINT ["kubemoot-proxy"]
CMD ["serve"]
