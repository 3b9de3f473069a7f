"""The suite's temporary files stay under pytest's temp folder (tests/conftest.py): Beam's
beam-pipeline-temp* and beam-artifact-staging folders, made with the tempfile module by the
tests' own process or by a subprocess it starts, were left in /tmp by every run."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def test_temporary_folders_of_a_test_and_of_its_subprocesses_are_under_pytests_temp_folder(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.getbasetemp()
    here = Path(tempfile.mkdtemp(prefix="beam-pipeline-temp"))
    made = subprocess.run(
        [sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp(prefix='beam-temp'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert here.is_relative_to(base), here
    assert Path(made).is_relative_to(base), made
