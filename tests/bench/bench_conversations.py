"""What serve's conversation bookkeeping costs per cycle, beside the cycle's Beam graph.

Each serve cycle with --session-judges asks the state file for the hold and the sessions due,
plans the cycle's changes on the sessions it touches (`SavedConversations` in
`pipeline.service.conversations`) and saves them in the cycle's transaction. This times that
part alone, as serve calls it, on a real state file in a temporary folder: OPEN sessions of
TURNS turns saved, then cycles each adding NEW turns (new sessions) and judging the sessions the
watermark closes. Prints the median milliseconds per cycle of each step over the cycles, and
the process's peak resident memory after the sessions were saved and after the cycles.

    PYTHONPATH=. .venv/bin/python tests/bench/bench_conversations.py --open 100000 --turns 4
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ragpulse.judges.base import JudgeInput
from ragpulse.pipeline.records import InferenceRecord
from ragpulse.pipeline.service.conversations import SavedConversations, plan
from ragpulse.pipeline.service.state import CycleOutcome, StateStore
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.stages.sessions import SessionConfig

GAP = 300.0
WINDOW = 60.0


def turn(session: int, i: int, t: float) -> tuple[str, InferenceRecord]:
    return "m", InferenceRecord(
        request_id=f"s{session}-{i}", event_time=t, app="app", model="m",
        judge_input=JudgeInput(question="How do I export a report?" * 4,
                               answer="Open the report and choose Export." * 8),
        session_id=f"s{session}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--open", type=int, default=100_000,
                        help="open sessions (default 100000)")
    parser.add_argument("--turns", type=int, default=4, help="turns each (default 4)")
    parser.add_argument("--new", type=int, default=500, help="new turns a cycle (default 500)")
    parser.add_argument("--cycles", type=int, default=20)
    args = parser.parse_args()
    config = SessionConfig(
        JudgeSettings(backend="local").spec().for_sessions(("user_frustration",)), GAP
    )
    steps: dict[str, list[float]] = {"hold": [], "due": [], "plan": [], "save": []}
    judged = 0
    with tempfile.TemporaryDirectory() as folder, StateStore(Path(folder) / "s.sqlite") as state:
        book = SavedConversations(state, "t", config, window_size=WINDOW,
                                  max_open=args.open * 2, max_due=50_000)
        book.hold()  # the index checked, as at serve's first cycle
        # Open sessions spread over GAP seconds of event time, a turn every few seconds.
        fresh = [turn(s, i, s * GAP / args.open + i * 5.0)
                 for s in range(args.open) for i in range(args.turns)]
        first = plan([], {}, {}, fresh, config, window_size=WINDOW, final_before=None)
        state.apply_cycle("t", CycleOutcome(offsets={0: len(fresh)}, sessions=first))
        del fresh, first
        saved_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        clock, offset, next_session = GAP, args.open * args.turns, args.open
        for _ in range(args.cycles):
            clock += 10.0
            t0 = time.perf_counter()
            book.hold()
            t1 = time.perf_counter()
            due = book.due(clock)
            judged += len(due.sessions)
            t2 = time.perf_counter()
            new = [turn(next_session + k, 0, clock) for k in range(args.new)]
            next_session += args.new
            changes = book.changes(due, {}, new, final_before=clock - 600.0)
            t3 = time.perf_counter()
            offset += len(new)
            state.apply_cycle(
                "t",
                CycleOutcome(
                    offsets={0: offset},
                    counts=changes.counts,
                    sessions=changes,
                ),
            )
            t4 = time.perf_counter()
            for name, took in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                steps[name].append(took)
        print(f"{args.open} open sessions of {args.turns} turns, {args.new} new turns a cycle, "
              f"{args.cycles} cycles ({judged} sessions judged); saved turns at the end: "
              f"{len(state.session_turns('t'))}")
    for name, values in steps.items():
        print(f"  {name:5s} median {statistics.median(values) * 1000:8.1f} ms per cycle")
    total = sum(statistics.median(v) for v in steps.values())
    print(f"  total median {total * 1000:.1f} ms per cycle")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak RSS {saved_peak:.0f} MiB once the sessions were saved, {peak:.0f} MiB after "
          "the cycles")


if __name__ == "__main__":
    main()
