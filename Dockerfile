# ordo's container image (docs/deploy.md "Container image"): Debian 12, two stages.
#
#   podman build -t ordo .            (or docker build / buildah bud)
#   podman run --rm -p 8080:8080 -p 7070:7070 ordo
#
# The build stage compiles ordo-server, the `ordo` client and `ordo-model` from this tree with
# Debian's packages (the list in tools/dev.sh, less the test tools). The runtime stage holds the
# binaries, etc/ordo.toml, the Vulkan loader (libvulkan1) and the shared libraries they link,
# nothing else. The GPU's Vulkan driver comes from the host: with NVIDIA's container toolkit
# (`--device nvidia.com/gpu=all` with CDI, or the Kubernetes device plugin) the toolkit mounts
# the driver and its Vulkan ICD file when NVIDIA_DRIVER_CAPABILITIES includes "graphics", as set
# below. With --build-arg LAVAPIPE=1 the image also holds Mesa's lavapipe (a CPU Vulkan device)
# and runs without a GPU, slowly.
#
# The image serves the generated random-weight default model (var/models/ordo-default.gguf,
# made at build time, gibberish) until a real GGUF is mounted and named: `-v /models:/models:ro`
# with `--model /models/x.gguf` or model.path in a mounted config (deploy/k8s does that).

FROM debian:bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cmake ninja-build pkg-config g++ \
      libuv1-dev libxxhash-dev libpcre2-dev libvulkan-dev glslang-dev glslang-tools \
      libmsgpack-cxx-dev libspdlog-dev libtomlplusplus-dev nlohmann-json3-dev node-llhttp \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DORDO_BUILD_TESTS=OFF -DORDO_BUILD_BENCH=OFF \
 && cmake --build /build --target ordo-server ordo ordo-model \
 && /build/tools/model/ordo-model mk --out /build/ordo-default.gguf --n-embd 256 --n-layer 4 \
      --n-head 8 --n-head-kv 4 --n-ff 768 --n-vocab 512 --type f16 --seed 1 --ctx 2048 >/dev/null

FROM debian:bookworm-slim
ARG LAVAPIPE=0
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libuv1 libxxhash0 libpcre2-8-0 libvulkan1 libspdlog1.10 libfmt9 libtomlplusplus3 \
      $( [ "$LAVAPIPE" = 1 ] && echo mesa-vulkan-drivers ) \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/ordo --create-home ordo \
 && mkdir -p /var/lib/ordo/kv /var/lib/ordo/models /etc/ordo \
 && chown -R ordo:ordo /var/lib/ordo
COPY --from=build /build/tools/server/ordo-server /build/tools/client/ordo \
     /build/tools/model/ordo-model /usr/local/bin/
COPY --from=build --chown=ordo:ordo /build/ordo-default.gguf \
     /var/lib/ordo/var/models/ordo-default.gguf
COPY etc/ordo.toml /etc/ordo/ordo.toml
# The NVIDIA container toolkit mounts the driver's Vulkan ICD only with "graphics".
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics \
    XDG_RUNTIME_DIR=/tmp
USER ordo
# Relative paths in the config (model.generated_path, kv.dir) are relative to this directory.
WORKDIR /var/lib/ordo
EXPOSE 7070 8080
# Both front doors on every interface: inside a container, loopback reaches nobody. Configure
# API keys (server.api_keys_file or --api-key) before exposing the ports beyond a private network.
ENTRYPOINT ["/usr/local/bin/ordo-server", "--config", "/etc/ordo/ordo.toml", \
            "--listen", "0.0.0.0:7070", "--http-listen", "0.0.0.0:8080"]
