#!/usr/bin/python3
"""test_k8s.py: the container image and the Kubernetes manifests (Dockerfile, deploy/k8s) agree
with each other and with ordo-server, offline.

Checks: every manifest parses as YAML and names its apiVersion, kind and metadata.name; the
kustomization's resources and generated ConfigMap file exist; `ordo-server --check-config`
accepts the ConfigMap's ordo.toml; the Deployment's container ports are the ports the config
and the image's entry point listen on; the startup, readiness and liveness probes ask /health on
the http port; Prometheus' pod annotations and the ServiceMonitor scrape /metrics on that port;
the config's kv.dir is the mount of a ReadWriteMany claim and kv.shared is on; model.path lies
on the read-only models mount; the config is mounted where the entry point reads it; a GPU is
requested; the pod runs as the image's user; the grace period covers shutdown_grace_ms plus
kv.flush_ms_max; the Service and the PodDisruptionBudget select the pods and name existing
ports; the runtime image installs the Debian package of every shared library ordo-server links
(beyond the base image's); with a kubectl on PATH, `kubectl kustomize` renders the directory and
the Deployment mounts the generated (hash-named) ConfigMap.

Not checked here: the manifests against the API server's schemas (kubectl needs a cluster for
that; the Debian 12 machine has none), and building or running the image (minutes, as root;
docs/deploy.md says how it was checked by hand).

Usage: test_k8s.py --root SOURCE_DIR --server ORDO_SERVER_BINARY
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib

import yaml

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
    return ok


def docs_of(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def port_of(listen):
    return int(listen.rsplit(":", 1)[1])


def dockerfile(root):
    """(runtime apt packages, entry point argv, runtime user id) of the Dockerfile's last stage."""
    text = open(os.path.join(root, "Dockerfile"), encoding="utf-8").read()
    text = text.replace("\\\n", " ")
    stages = re.split(r"^FROM ", text, flags=re.M)
    runtime = stages[-1]
    packages = set()
    for run in re.findall(r"^RUN (.*)$", runtime, flags=re.M):
        for m in re.finditer(r"apt-get install ([^&]*)", run):
            packages |= {w for w in m.group(1).split() if not w.startswith("-") and
                         re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", w)}
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", runtime, flags=re.M)
    argv = yaml.safe_load(entry.group(1)) if entry else []
    uid = re.search(r"--uid (\d+)", runtime)
    return packages, argv, int(uid.group(1)) if uid else None


def linked_packages(server):
    """Debian packages of the shared libraries `server` links, as this machine resolves them."""
    out = subprocess.run(["ldd", server], capture_output=True, text=True, check=True).stdout
    pkgs = set()
    for line in out.splitlines():
        m = re.search(r"=> (/\S+)", line)
        if not m:
            continue
        real = os.path.realpath(m.group(1))
        q = subprocess.run(["dpkg", "-S", real], capture_output=True, text=True)
        if q.returncode != 0:  # usrmerge: dpkg may know the /lib spelling only
            q = subprocess.run(["dpkg", "-S", real.replace("/usr/lib/", "/lib/", 1)],
                               capture_output=True, text=True)
        if check(q.returncode == 0, f"no Debian package owns {real} (linked by ordo-server)"):
            pkgs.add(q.stdout.split(":", 1)[0].strip())
    return pkgs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--server", required=True)
    args = ap.parse_args()
    k8s = os.path.join(args.root, "deploy", "k8s")

    # Every manifest parses; every object names itself.
    objects = {}
    for name in sorted(os.listdir(k8s)):
        if not name.endswith(".yaml"):
            continue
        for d in docs_of(os.path.join(k8s, name)):
            ok = all(k in d for k in ("apiVersion", "kind")) and (
                d["kind"] == "Kustomization" or "name" in d.get("metadata", {}))
            if check(ok, f"{name}: an object without apiVersion, kind or metadata.name"):
                objects[(d["kind"], d.get("metadata", {}).get("name", name))] = (name, d)
    kust = objects.get(("Kustomization", "kustomization.yaml"), (None, {}))[1]
    for r in kust.get("resources", []):
        check(os.path.exists(os.path.join(k8s, r)), f"kustomization names a missing {r}")
    gen = {g["name"]: g for g in kust.get("configMapGenerator", [])}
    check("ordo-config" in gen, "kustomization generates no ordo-config ConfigMap")
    cfg_file = os.path.join(k8s, gen.get("ordo-config", {}).get("files", ["ordo.toml"])[0])

    # ordo-server accepts the config.
    r = subprocess.run([args.server, "--check-config", cfg_file], capture_output=True, text=True)
    if not check(r.returncode == 0,
                 f"ordo-server --check-config {cfg_file}: {r.stdout}{r.stderr}"):
        return
    with open(cfg_file, "rb") as f:
        cfg = tomllib.load(f)

    dep = objects.get(("Deployment", "ordo"), (None, None))[1]
    if not check(dep is not None, "no Deployment named ordo"):
        return
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    c = spec["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    http_port = port_of(cfg["http"]["listen"])
    msgpack_port = port_of(cfg["server"]["listen"])
    check(ports.get("http") == http_port, f"container port http {ports.get('http')} is not "
          f"the config's http.listen port {http_port}")
    check(ports.get("msgpack") == msgpack_port, f"container port msgpack "
          f"{ports.get('msgpack')} is not the config's server.listen port {msgpack_port}")

    # The image's entry point listens on the same ports and reads the mounted config.
    packages, argv, uid = dockerfile(args.root)
    flags = dict(zip(argv[1::2], argv[2::2])) if argv else {}
    check(flags.get("--http-listen", "").endswith(f":{http_port}"),
          f"the entry point's --http-listen {flags.get('--http-listen')} is not port {http_port}")
    check(flags.get("--listen", "").endswith(f":{msgpack_port}"),
          f"the entry point's --listen {flags.get('--listen')} is not port {msgpack_port}")
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    config_mount = [m for m in mounts.values()
                    if volumes.get(m["name"], {}).get("configMap", {}).get("name") ==
                    "ordo-config"]
    check(len(config_mount) == 1 and
          os.path.join(config_mount[0]["mountPath"], os.path.basename(cfg_file)) ==
          flags.get("--config"),
          f"the entry point reads {flags.get('--config')}, where ordo-config is not mounted")

    # Probes on /health, on the http port.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        g = c.get(probe, {}).get("httpGet", {})
        check(g.get("path") == "/health" and g.get("port") in ("http", http_port),
              f"{probe} does not ask /health on the http port: {g}")

    # Prometheus: annotations and the ServiceMonitor.
    ann = pod["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true" and
          ann.get("prometheus.io/port") == str(http_port) and
          ann.get("prometheus.io/path") == "/metrics",
          f"the Prometheus annotations do not scrape /metrics on {http_port}: {ann}")
    sm = objects.get(("ServiceMonitor", "ordo"), (None, None))[1]
    if check(sm is not None, "no ServiceMonitor named ordo"):
        ep = sm["spec"]["endpoints"][0]
        check(ep.get("port") == "http" and ep.get("path") == "/metrics",
              f"the ServiceMonitor does not scrape /metrics on port http: {ep}")

    # The KV dir: a shared (ReadWriteMany) claim mounted at kv.dir; the model on its mount.
    kv = cfg.get("kv", {})
    check(kv.get("enabled") is True and kv.get("shared") is True,
          "the config does not enable [kv] with shared = true")
    kv_mount = [m for m in mounts.values() if m["mountPath"] == kv.get("dir")]
    if check(len(kv_mount) == 1, f"nothing is mounted at kv.dir {kv.get('dir')}"):
        claim = volumes[kv_mount[0]["name"]].get("persistentVolumeClaim", {}).get("claimName")
        pvc = objects.get(("PersistentVolumeClaim", claim), (None, {}))[1]
        check("ReadWriteMany" in pvc.get("spec", {}).get("accessModes", []),
              f"kv.dir's claim {claim} is not ReadWriteMany")
        check(not kv_mount[0].get("readOnly", False), "kv.dir is mounted read-only")
    model_path = cfg.get("model", {}).get("path", "")
    check(any(model_path.startswith(m["mountPath"].rstrip("/") + "/") and m.get("readOnly")
              for m in mounts.values()
              if "persistentVolumeClaim" in volumes.get(m["name"], {})),
          f"model.path {model_path} is not on a read-only volume mount")

    # A GPU, the image's user, a grace period that covers the drain.
    check(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) >= 1,
          "the container requests no nvidia.com/gpu")
    sc = spec.get("securityContext", {})
    check(uid is not None and sc.get("runAsUser") == uid and sc.get("fsGroup") == uid,
          f"the pod runs as {sc.get('runAsUser')} (fsGroup {sc.get('fsGroup')}), "
          f"the image's user is {uid}")
    grace_ms = cfg.get("server", {}).get("shutdown_grace_ms", 5000) + kv.get("flush_ms_max", 5000)
    check(spec.get("terminationGracePeriodSeconds", 30) * 1000 > grace_ms,
          f"terminationGracePeriodSeconds does not cover {grace_ms} ms of drain")
    env = {e["name"]: e.get("value", "") for e in c.get("env", [])}
    check("graphics" in env.get("NVIDIA_DRIVER_CAPABILITIES", ""),
          "NVIDIA_DRIVER_CAPABILITIES lacks graphics: no Vulkan ICD in the container")

    # The Service and the PodDisruptionBudget select the pods and name real ports.
    labels = pod["metadata"].get("labels", {})
    for kind in ("Service", "PodDisruptionBudget"):
        o = objects.get((kind, "ordo"), (None, None))[1]
        if not check(o is not None, f"no {kind} named ordo"):
            continue
        sel = o["spec"]["selector"]
        sel = sel.get("matchLabels", sel)
        check(sel and all(labels.get(k) == v for k, v in sel.items()),
              f"the {kind}'s selector {sel} does not select the pods {labels}")
    svc = objects.get(("Service", "ordo"), (None, {"spec": {"ports": []}}))[1]
    for p in svc["spec"]["ports"]:
        check(p.get("targetPort") in ports or p.get("targetPort") in ports.values(),
              f"the Service's port {p.get('name')} targets no container port")

    # The runtime image has every library ordo-server links.
    base = {"libc6", "libgcc-s1", "libstdc++6"}  # in debian:bookworm-slim
    for pkg in sorted(linked_packages(args.server) - base):
        check(pkg in packages, f"the runtime image does not install {pkg} (ordo-server links it)")

    # kubectl kustomize renders it offline, where a kubectl is installed.
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("\n*** SKIPPING the kustomize render: no kubectl on PATH ***\n")
    else:
        r = subprocess.run([kubectl, "kustomize", k8s], capture_output=True, text=True)
        if check(r.returncode == 0, f"kubectl kustomize {k8s}: {r.stderr}"):
            rendered = list(yaml.safe_load_all(r.stdout))
            cms = [d["metadata"]["name"] for d in rendered if d and d["kind"] == "ConfigMap"]
            deps = [d for d in rendered if d and d["kind"] == "Deployment"]
            used = [v["configMap"]["name"] for d in deps
                    for v in d["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
            check(len(cms) == 1 and cms[0].startswith("ordo-config-") and used == cms,
                  f"the rendered Deployment does not mount the generated ConfigMap "
                  f"({used} vs {cms})")
            print(f"kubectl kustomize: {len(rendered)} objects, ConfigMap {cms}")


if __name__ == "__main__":
    main()
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failures" if failures else "ok: the image and manifests agree")
    sys.exit(1 if failures else 0)
