"""Entry point of the Dataflow flex template launcher (FLEX_TEMPLATE_PYTHON_PY_FILE).

The launcher runs `python launch.py --NAME=VALUE ...` with the template's parameters (names of
deploy/dataflow/metadata.json, where `_` stands for `-`: kafka_bootstrap is --kafka-bootstrap)
mixed with Dataflow's own pipeline options (--project, --region, --temp_location,
--sdk_container_image, ...). This hands the first to `ragpulse stream` as its flags and the
rest as --beam-arg, with --runner DataflowRunner, and returns once the job is submitted.
"""

from __future__ import annotations

import sys

from ragpulse.pipeline import cli


def stream_flags() -> set[str]:
    """The long flags `ragpulse stream` takes (e.g. --kafka-bootstrap)."""
    parser = cli.build_parser()
    sub = cli._subparser(parser, "stream")
    return {flag for action in sub._actions for flag in action.option_strings}


def ragpulse_argv(launcher_argv: list[str]) -> list[str]:
    """`ragpulse stream` arguments from the launcher's (every one given as --NAME=VALUE)."""
    flags = stream_flags()
    own: list[str] = []
    beam: list[str] = []
    for arg in launcher_argv:
        name, sep, value = arg.partition("=")
        flag = name.replace("_", "-")
        if flag in flags:
            own.append(f"{flag}={value}" if sep else flag)
        else:
            beam.append(f"--beam-arg={arg}")
    if not any(a.startswith("--runner=") for a in own):
        own.append("--runner=DataflowRunner")
    return ["stream", *own, *beam]


if __name__ == "__main__":
    sys.exit(cli.main(ragpulse_argv(sys.argv[1:])))
