"""hack/image/build.py, without building anything: the image config it derives for each target
of the Dockerfile agrees with the Dockerfile as ``harness.dockerfile`` reads it, the venv it
makes installs the extras the target's build stage installs, and its layer and OCI archive
writers produce what containerd imports (sorted entries, links kept, digests that match)."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from harness import dockerfile
from harness.hack import load_image

build = load_image()
DOCKERFILE = dockerfile.parse("Dockerfile")
TARGETS = ["runtime", "operator"]


def expected_env(target: str) -> dict[str, str]:
    """The Dockerfile's ENV of the target's chain, ``$PATH`` expanded over the base PATH."""
    env = DOCKERFILE.env(DOCKERFILE.target(target))
    return {k: v.replace("$PATH", build.DEFAULT_PATH) for k, v in env.items()}


@pytest.mark.parametrize("target", TARGETS)
def test_config_agrees_with_the_dockerfile(target: str) -> None:
    config = build.image_config(target)
    chain = DOCKERFILE.chain(DOCKERFILE.target(target))
    own = chain[-1]
    assert config["Entrypoint"] == own.exec_form("ENTRYPOINT")
    assert config.get("Cmd") == (own.exec_form("CMD") if own.args("CMD") else None)
    users = [u for s in chain for u in s.args("USER")]
    assert config["User"] == users[-1] == "10001:10001"
    ports = [p for s in chain for raw in s.args("EXPOSE") for p in raw.split()]
    assert config["ExposedPorts"] == {f"{p}/tcp": {} for p in ports} == (
        {"8080/tcp": {}, "8081/tcp": {}} if target == "runtime" else {"8080/tcp": {}})
    env = dict(item.split("=", 1) for item in config["Env"])
    assert {k: env.get(k) for k in expected_env(target)} == expected_env(target)
    assert env["PATH"].startswith("/opt/tailguard/bin:")
    assert "WorkingDir" not in config  # no WORKDIR in the final stages
    assert config["Labels"]["org.opencontainers.image.title"] == f"tailguard-{target}"
    assert config["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_the_runtime_keeps_its_cmd_and_the_operator_has_none() -> None:
    assert build.image_config("runtime")["Cmd"][:2] == ["--config", "/etc/tailguard/runtime.json"]
    assert "Cmd" not in build.image_config("operator")


@pytest.mark.parametrize("target", TARGETS)
def test_extras_are_those_the_build_stage_installs(target: str) -> None:
    final = DOCKERFILE.target(target)
    ((source, _),) = [c for c in final.copies_from() if "/opt/tailguard" in c[1]]
    assert build.build_stage(target) == source
    extras: set[str] = set()
    for run in DOCKERFILE.runs(DOCKERFILE.stage(source)):
        for args in dockerfile.pip_installs(run):
            for arg in args:
                if arg.startswith("."):
                    extras |= dockerfile.requirement_extras(arg)[1]
    assert build.build_extras(target) == sorted(extras)
    assert build.checks(target) == final.args("RUN")


def test_the_base_stage_runs_are_part_of_the_base_key() -> None:
    stages = build.parse_dockerfile()
    (base,) = [s for s in stages if s.name == "base"]
    key = build.base_key(stages)
    base.instructions = [(i, t + " && true" if i == "RUN" else t) for i, t in base.instructions]
    assert build.base_key(stages) != key


def read_tar(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return tar.getmembers()


def test_a_layer_keeps_order_owners_modes_and_links(tmp_path: Path) -> None:
    root = tmp_path / "root"
    venv = root / "opt" / "app"
    (venv / "bin").mkdir(parents=True)
    (venv / "b.txt").write_text("b")
    (venv / "a.txt").write_text("a")
    os.link(venv / "a.txt", venv / "z-hard.txt")
    (venv / "bin" / "python").symlink_to("/usr/bin/python3.11")
    os.chmod(venv / "b.txt", 0o600)
    layer = build.write_layer(root, ["opt/app"], tmp_path / "layer.tar")
    assert layer.sha256 == hashlib.sha256(layer.path.read_bytes()).hexdigest()
    members = read_tar(layer.path)
    names = [m.name for m in members]
    assert names == ["opt", "opt/app", "opt/app/a.txt", "opt/app/b.txt", "opt/app/bin",
                     "opt/app/bin/python", "opt/app/z-hard.txt"]
    by = {m.name: m for m in members}
    assert by["opt/app/bin/python"].issym() and by["opt/app/bin/python"].linkname == "/usr/bin/python3.11"
    assert by["opt/app/z-hard.txt"].islnk() and by["opt/app/z-hard.txt"].linkname == "opt/app/a.txt"
    assert by["opt/app/b.txt"].mode & 0o777 == 0o600
    assert all(m.uname == "" and m.uid == os.getuid() for m in members)
    assert build.write_layer(root, ["opt/app"], tmp_path / "again.tar").sha256 == layer.sha256


def test_an_archive_is_an_oci_layout_containerd_names(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "pause").write_bytes(b"\x7fELF")
    layer = build.write_layer(tmp_path / "root", ["pause"], tmp_path / "layer.tar")
    config = {"User": "65535:65535", "Entrypoint": ["/pause"]}
    out = build.write_archive(tmp_path / "a.tar", "tailguard.dev/pause:1.0", [layer], config,
                              ["pause"])
    with tarfile.open(out) as tar:
        def blob(digest: str) -> bytes:
            f = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert f is not None
            return f.read()

        def doc(name: str) -> Any:
            f = tar.extractfile(name)
            assert f is not None
            return json.load(f)

        assert doc("oci-layout") == {"imageLayoutVersion": "1.0.0"}
        (entry,) = doc("index.json")["manifests"]
        assert entry["annotations"] == {"io.containerd.image.name": "tailguard.dev/pause:1.0",
                                        "org.opencontainers.image.ref.name": "1.0"}
        manifest_bytes = blob(entry["digest"])
        assert hashlib.sha256(manifest_bytes).hexdigest() == entry["digest"].split(":")[1]
        manifest = json.loads(manifest_bytes)
        (desc,) = manifest["layers"]
        assert desc == {"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": f"sha256:{layer.sha256}", "size": layer.size}
        image = json.loads(blob(manifest["config"]["digest"]))
        assert image["rootfs"] == {"type": "layers", "diff_ids": [f"sha256:{layer.sha256}"]}
        assert (image["architecture"], image["os"], image["config"]) == ("amd64", "linux", config)
