"""A regular (non-editable) install puts one package, ragpulse, in site-packages: the
repository's pipeline/ and judges/ as ragpulse.pipeline and ragpulse.judges, with the judge
prompts and lexicons the image needs, and nothing named `pipeline` or `judges` at the top."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds and installs a wheel

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Build from a clean copy: an in-tree build/ directory would hand back stale files.
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"
    for folder in ("pipeline", "judges", "ragpulse"):
        shutil.copytree(ROOT / folder, src / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("ragpulse-*.whl")
    return built


def test_the_wheel_has_one_top_level_package_ragpulse(wheel: Path) -> None:
    shipped = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in shipped if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"ragpulse"}
    modules = sorted(
        p.relative_to(ROOT).as_posix()
        for folder in ("pipeline", "judges")
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    )
    assert len(modules) > 80
    assert [m for m in modules if f"ragpulse/{m}" not in shipped] == []


def test_the_wheel_contains_every_prompt_and_lexicon_file(wheel: Path) -> None:
    shipped = set(zipfile.ZipFile(wheel).namelist())
    data = [
        p.relative_to(ROOT).as_posix()
        for folder in ("judges/prompts", "judges/prompts/combined", "judges/lexicons")
        for p in (ROOT / folder).iterdir()
        if p.suffix in {".yaml", ".txt"}
    ]
    assert len(data) >= 8
    assert [f for f in data if f"ragpulse/{f}" not in shipped] == []


def test_the_installed_package_runs_and_finds_its_prompts_without_the_checkout(
    wheel: Path, tmp_path: Path
) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True,
        capture_output=True,
    )
    probe = (
        "import importlib.resources, importlib.util, ragpulse.pipeline.cli, ragpulse.judges\n"
        "print(ragpulse.pipeline.cli.__file__)\n"
        "print(importlib.resources.files('ragpulse.judges') / 'prompts' / 'groundedness.yaml')\n"
        "print(importlib.util.find_spec('pipeline'), importlib.util.find_spec('judges'))\n"
    )
    # The target folder first on the path, the checkout nowhere on it (cwd is elsewhere).
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(target)},
        capture_output=True, text=True, check=True,
    )
    cli_file, prompt, specs = done.stdout.splitlines()
    assert Path(cli_file).is_relative_to(target)
    assert Path(prompt).is_file() and Path(prompt).is_relative_to(target)
    assert specs == "None None"
