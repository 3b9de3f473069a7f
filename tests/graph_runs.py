"""Runs of the real Beam graph (`pipeline.graphs.bounded`) over records held in memory, for tests.

The stages, sinks and runner are the ones `ragpulse run` uses; only the source differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import apache_beam as beam

from ragpulse.pipeline.canaries import CanaryEvent
from ragpulse.pipeline.graphs.bounded import GraphResult, Sinks, StageConfig, run_graph
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.models import BatchSettings, JudgeSettings
from ragpulse.pipeline.sinks.files import WriteDeadLetters, WriteVerdicts, WriteWindows


def stage_config(**overrides: Any) -> StageConfig:
    """The stage configuration of the default settings (local judges), with `overrides` (a
    field of `StageConfig`, or `window_seconds`: its admission rules' window size)."""
    config = BatchSettings(judges=JudgeSettings(backend="local")).stage_config()
    if "window_seconds" in overrides:
        config = config.admitting(window_size=overrides.pop("window_seconds"))
    return dataclasses.replace(config, **overrides)


def run_to_files(
    records: Sequence[SourceRecord],
    out_dir: Path,
    config: StageConfig,
    canaries: Sequence[CanaryEvent] = (),
) -> GraphResult:
    """Judge `records` as `ragpulse run` would, writing its three row files into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sinks = Sinks(
        dead_letters=WriteDeadLetters(out_dir),
        verdicts=WriteVerdicts(out_dir, config.judges.text_policy),
        windows=WriteWindows(out_dir),
    )
    return run_graph(beam.Create(list(records)), config, sinks, canaries=canaries)
