"""podman as the tests run it: with the project's containers.conf (runc, no default ulimits;
tests/podman/containers.conf, given through CONTAINERS_CONF) and host networking, so that a
container reaches the test's broker on 127.0.0.1 and the test reaches its /metrics."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pinned_tools import REPO, makefile_pin
from processes import require_binary

CONTAINERS_CONF = REPO / "tests" / "podman" / "containers.conf"
# What `make image-base` imports: Debian bookworm (debootstrap) with python3 and python3-venv.
DEBIAN_BASE_IMAGE = makefile_pin("DEBIAN_BASE_IMAGE")
# The CA bundle pip in the build trusts (the machine's; a TLS-intercepting proxy's CA is in it).
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman_command(*args: str) -> list[str]:
    return [require_binary("podman", "podman"), *args]


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(podman_command(*args), capture_output=True, text=True, check=False,
                          timeout=timeout, env=podman_env())


def build_image(tag: str, base: str, log: Path, timeout: float = 1500) -> None:
    """`podman build` deploy/Dockerfile on `base` (the whole output goes to `log`); raises
    AssertionError with the end of the log when the build fails."""
    args = ["build", "--network", "host", "--file", str(REPO / "deploy" / "Dockerfile"),
            "--build-arg", f"BASE={base}", "--tag", tag]
    if HOST_CA_BUNDLE.is_file():
        args += ["--secret", f"id=pip_ca,src={HOST_CA_BUNDLE}"]
    with log.open("wb") as out:
        done = subprocess.run(podman_command(*args, str(REPO)), stdout=out,
                              stderr=subprocess.STDOUT, check=False, timeout=timeout,
                              env=podman_env())
    tail = log.read_text(errors="replace")[-4000:]
    assert done.returncode == 0, f"podman build on {base} failed:\n{tail}"
