"""A regular (non-editable) install ships the judge prompts and lexicons, as the image needs."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds and installs a wheel

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_contains_every_prompt_and_lexicon_file(tmp_path: Path) -> None:
    # Build from a clean copy: an in-tree build/ directory would hand back stale files.
    src = tmp_path / "src"
    for folder in ("pipeline", "judges"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(src)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("ragpulse-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    data = [
        p.relative_to(ROOT).as_posix()
        for folder in ("judges/prompts", "judges/lexicons")
        for p in (ROOT / folder).iterdir()
        if p.suffix in {".yaml", ".txt"}
    ]
    assert len(data) >= 7
    assert not [f for f in data if f not in shipped]
