# slim serve in a container: docs/deploy.md. Build: docker build -t slim .
# Run:   docker run -p 8000-8002:8000-8002 -v "$PWD/models:/models:ro" slim

# Build stage: the build packages of scripts/setup.sh (--build), then the slim binary only.
FROM debian:12 AS build
COPY scripts/setup.sh scripts/packages.sh /src/scripts/
RUN bash /src/scripts/setup.sh --build
COPY . /src
RUN cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIM_BUILD_TESTS=OFF \
 && cmake --build /build --target slim \
 && strip /build/tools/slim

# Runtime stage: the shared libraries the binary links (deploy/runtime-packages.txt) and
# curl for the health check.
FROM debian:12-slim
COPY deploy/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl $(sed 's/#.*//' /tmp/runtime-packages.txt) \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin slim \
 && mkdir /models && chown slim /models
COPY --from=build /build/tools/slim /usr/local/bin/slim
USER 10001
VOLUME /models
# KServe v2 REST, KServe v2 gRPC, Prometheus metrics.
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:8000/v2/health/ready || exit 1
ENTRYPOINT ["slim"]
# Poll the volume: a new version directory dropped in is loaded once it is stable.
CMD ["serve", "--model-repository", "/models", "--host", "0.0.0.0", \
     "--model-control-mode", "poll", "--repository-poll-secs", "10"]
