"""Instance mistakes are caught, not absorbed (issue 19): one state file for two serves, two
serves with one --instance or with different --instances, and partitions no instance reads.

Measured before: two serves with the same --instance counted 1,300 of 1,500 events twice
(1,200 with one shared state file), and the partitions no instance read had no lag exported.
The serve tests run real `ragpulse serve` processes against a real (Apache Kafka) broker; the rule
that reads the consumer group's signed commits is a pure function, tested directly for the
commit metadata Tansu drops and Apache Kafka keeps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cycle_holds import CycleHolds
from kafka_broker import ApacheKafkaBroker
from serve_process import (  # noqa: F401
    Scrape,
    ServeProcess,
    saved_offsets,
    serve_processes_fixture,
    wait_until,
)
from test_serve import JUDGES, T0, ServeFactory, caught_up, produce_round_robin
from test_serve_instances import lags_by_partition

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.service.owners import (
    Commit,
    Owner,
    claim_rivals,
    conflicts,
    read_metadata,
)
from ragpulse.pipeline.sources.kafka import KafkaGroup

PARTITIONS = 4
GROUP = "owners"
ARGS = ["--window", "10s", "--judges", ",".join(JUDGES), "--group-id", GROUP]
NOW = 1_800_000_000.0


def owner(name: str, instance: int = 0, instances: int = 1, started: float = NOW - 60) -> Owner:
    return Owner(name, instance, instances, started, lease_seconds=300.0)


def signed(offset: int, by: Owner, *, heartbeat: float = NOW - 1, released: bool = False) -> Commit:
    """A commit as a broker that keeps the metadata string gives it back."""
    return read_metadata(offset, by.metadata(heartbeat, released=released))


ME = owner("me", started=NOW - 10)


def test_a_commit_by_another_owner_on_this_instances_partition_since_its_own_is_found() -> None:
    # Both read to the same end: the offsets agree, the owner in the metadata does not.
    other = owner("other")
    found = conflicts(ME, {0: signed(500, other)}, {0: 500}, previous_owner=None, now=NOW)
    assert [(why, o) for why, o in found] == [
        ("partition 0 was committed by other (--instance 0 --instances 1) since this "
         "instance committed it", other)
    ]


def test_without_commit_metadata_another_offset_since_its_own_commit_is_found() -> None:
    found = conflicts(ME, {0: Commit(500)}, {0: 200}, previous_owner=None, now=NOW)
    assert [o for _, o in found] == [None]
    assert conflicts(ME, {0: Commit(200)}, {0: 200}, previous_owner=None, now=NOW) == []


def test_at_start_only_a_live_unreleased_commit_of_someone_else_is_another_owner() -> None:
    other = owner("other")
    live = {0: signed(9, other)}
    assert conflicts(ME, live, None, previous_owner=None, now=NOW)
    # The process that held this state file's lock before is dead: its commits are fine.
    assert conflicts(ME, live, None, previous_owner="other", now=NOW) == []
    assert conflicts(ME, {0: signed(9, other, released=True)}, None, previous_owner=None,
                     now=NOW) == []
    expired = {0: signed(9, other, heartbeat=NOW - 301)}
    assert conflicts(ME, expired, None, previous_owner=None, now=NOW) == []


def test_a_live_instance_with_other_instances_is_found_on_any_partition() -> None:
    me = owner("me", instance=0, instances=2)
    sibling = owner("sibling", instance=1, instances=2)
    stranger = owner("stranger", instance=1, instances=3)
    assert conflicts(me, {1: signed(5, sibling)}, None, previous_owner=None, now=NOW) == []
    (found,) = conflicts(me, {1: signed(5, stranger)}, None, previous_owner=None, now=NOW)
    assert "with other --instances than this one's 2" in found[0]


def test_metadata_that_is_not_ragpulses_is_no_owner() -> None:
    assert read_metadata(7, "") == Commit(7)
    assert read_metadata(7, "{not json") == Commit(7)
    assert read_metadata(7, '{"owner": "x"}') == Commit(7)


def test_a_claim_stands_only_while_its_name_is_the_last_written_in_the_claims_group() -> None:
    rival = owner("rival")
    assert claim_rivals(ME, {0: signed(5, ME), 2: signed(7, ME)}, [0, 2]) == []
    (found,) = claim_rivals(ME, {0: signed(5, ME), 2: signed(7, rival)}, [0, 2])
    assert found == ("partition 2 was claimed by rival (--instance 0 --instances 1) at the same "
                     "moment", rival)
    # Removed by a claimant whose claim was decided: no name is not this one's.
    assert [o for _, o in claim_rivals(ME, {0: signed(5, ME)}, [0, 2])] == [None]
    # A broker that drops the metadata cannot say who wrote it: no rival.
    assert claim_rivals(ME, {0: Commit(5)}, [0]) == []


# ----- real serve processes ---------------------------------------------------------------


def _events(n: int, seed: int = 3) -> list[bytes]:
    return [e.payload for e in simulate(seed, n, T0, rate=50)]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_second_serve_on_the_same_state_file_is_refused_with_one_line_and_exit_code_2(
    kafka_broker: ApacheKafkaBroker,
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    broker = kafka_broker
    broker.create_topic("shared", PARTITIONS)
    produce_round_robin(broker, "shared", _events(200), PARTITIONS)
    state = tmp_path / "state.sqlite"
    first = serve_processes(broker.bootstrap, "shared", state, ARGS).start()
    first.wait_for(caught_up(200), 60, "the first serve caught up")
    second = serve_processes(broker.bootstrap, "shared", state, ARGS)
    with pytest.raises(RuntimeError, match="exited with code 2"):
        second.start()
    errors = [line for line in second.log_text().splitlines() if "ragpulse serve:" in line]
    assert len(errors) == 1, second.log_text()
    assert f"ragpulse serve: state file {state} is in use by another ragpulse serve" in errors[0]
    assert "Traceback" not in second.log_text()
    assert first.terminate() == 0


def _refused(scrape_owner: tuple[int, str]) -> bool:
    code, body = scrape_owner
    return code == 503 and "another serve reads the partitions" in body


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "assignment",
    [["--max-batch-events", "100"], ["--instances", "2", "--instance", "0"]],
    ids=["the-same-instance", "another-number-of-instances"],
)
def test_a_second_serve_over_a_live_owners_partitions_is_refused_at_start_with_one_line(
    kafka_broker: ApacheKafkaBroker,
    serve_processes: ServeFactory,
    tmp_path: Path,
    assignment: list[str],
) -> None:
    """Apache Kafka keeps the metadata of each offset commit, so the first serve's signed
    heartbeat commits name it: a second serve given the same --instance (its own state file),
    or another --instances, is refused at start instead of counting the topic twice."""
    broker = kafka_broker
    topic = f"twice-{len(assignment)}"
    broker.create_topic(topic, PARTITIONS)
    produce_round_robin(broker, topic, _events(1_500), PARTITIONS)
    first = serve_processes(broker.bootstrap, topic, tmp_path / "a.sqlite", ARGS).start()
    first.wait_for(caught_up(1_500), 120, "the first serve caught up")
    second = serve_processes(broker.bootstrap, topic, tmp_path / "b.sqlite", [*ARGS, *assignment])
    with pytest.raises(RuntimeError, match="exited with code 2") as refused:
        second.start()
    errors = [line for line in str(refused.value).splitlines() if "ragpulse serve:" in line]
    assert len(errors) == 1, str(refused.value)
    assert "another serve reads partitions of" in errors[0]
    assert "give every instance the same --instances and its own --instance" in errors[0]
    assert not _refused(first.healthz())  # the first goes on counting, alone
    assert first.metrics().total("ragpulse_events_total") == 1_500
    assert first.terminate() == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "assignment",
    [[], ["--instances", "2", "--instance", "0"]],
    ids=["the-same-instance", "another-number-of-instances"],
)
def test_a_serve_started_while_the_first_is_in_its_first_cycle_is_refused_before_it_counts(
    kafka_broker: ApacheKafkaBroker,
    serve_processes: ServeFactory,
    tmp_path: Path,
    assignment: list[str],
) -> None:
    """The first serve holds in its first cycle, planned and before counting anything, so it
    has committed nothing yet: its signed claim at start is what the second finds. Before the
    claim, the second passed the start check (no commit to read) and counted every event a
    second time (measured: 600 of them with the same --instance, 300 beside --instances 3);
    now it exits with code 2 and the first counts each event once."""
    broker = kafka_broker
    topic = f"claimed-{len(assignment)}"
    broker.create_topic(topic, PARTITIONS)
    produce_round_robin(broker, topic, _events(1_200), PARTITIONS)
    holds = CycleHolds(tmp_path / "hooks")
    holds.hold("planned")
    first = serve_processes(
        broker.bootstrap, topic, tmp_path / "a.sqlite", ARGS, env=holds.env
    ).start()
    holds.wait_at("planned", first)
    second = serve_processes(broker.bootstrap, topic, tmp_path / "b.sqlite", [*ARGS, *assignment])
    with pytest.raises(RuntimeError, match="exited with code 2") as refused:
        second.start()
    assert "another serve reads partitions of" in str(refused.value)
    holds.release("planned")
    first.wait_for(caught_up(1_200), 120, "the first serve caught up")
    assert first.metrics().total("ragpulse_events_total") == 1_200
    assert not _refused(first.healthz())
    assert first.terminate() == 0


def _passed_the_claim(holds: CycleHolds, serve: ServeProcess) -> bool:
    """True once a launched serve has passed its claim and saved its first cycle (held at
    `saved`, before its consumer group hears of it); False if it was refused at start instead
    (exit code 2, with the one-line error)."""
    try:
        holds.wait_at("saved", serve)
    except AssertionError:
        if serve.running:
            raise
        assert serve.returncode == 2, serve.log_tail()
        assert "another serve reads partitions of" in serve.log_text(), serve.log_tail()
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_serves_with_one_instance_claiming_at_the_same_moment_count_each_event_once(
    kafka_broker: ApacheKafkaBroker,
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    """Two serves with the same --instance started within milliseconds: each is held at start
    (the hook `claiming`) once it has read the consumer group's commits and found no owner,
    before it commits its own claim. The first is let go, passes and saves its first cycle
    (held there, before it commits again); then the second is let go. Before the fix, each
    read back its own claim and passed, and both counted the first cycle's events (measured:
    1,200 each, 2,400 counts of 1,200 events); now of two claims that overlap at most one
    stands (`pipeline.service.owners.claim_rivals`): one serve exits with code 2 before it
    counts anything, the other counts each event once."""
    broker = kafka_broker
    broker.create_topic("race", PARTITIONS)
    produce_round_robin(broker, "race", _events(1_200), PARTITIONS)
    held: list[tuple[CycleHolds, ServeProcess]] = []
    for name in ("a", "b"):
        holds = CycleHolds(tmp_path / f"hooks-{name}")
        holds.hold("claiming")
        holds.hold("saved")
        serve = serve_processes(
            broker.bootstrap, "race", tmp_path / f"{name}.sqlite", ARGS, env=holds.env
        ).launch()
        holds.wait_at("claiming", serve)
        held.append((holds, serve))
    passed: list[tuple[CycleHolds, ServeProcess]] = []
    for holds, serve in held:
        holds.release("claiming")
        if _passed_the_claim(holds, serve):
            passed.append((holds, serve))
    # What each first cycle read and saved into its serve's windows (the state file).
    counted = [sum(saved_offsets(serve.state, "race").values()) for _, serve in passed]
    assert len(counted) == 1, f"events counted in the first cycle of each serve: {counted}"
    assert counted == [1_200]
    ((holds, survivor),) = passed
    holds.release("saved")
    scrape = survivor.answering().wait_for(caught_up(1_200), 120, "the serve counted every event")
    assert scrape.total("ragpulse_events_total") == 1_200
    assert not _refused(survivor.healthz())
    # The claim that stood removed the claims group: Kafka's lag tools do not list it.
    assert KafkaGroup(broker.bootstrap, f"{GROUP}.claims", "race").commits() == {}
    assert survivor.terminate() == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_lag_of_partitions_no_instance_reads_is_exported_and_grows_as_events_arrive(
    kafka_broker: ApacheKafkaBroker,
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    """Instance 0 of 2 runs, instance 1 was never started: partitions 1 and 3 are read by no
    one. Before, `ragpulse_consumer_lag`, the series the lag alert and the dashboard read, held
    only the instance's own partitions 0 and 2 (the every-partition view was a second metric
    nothing read), so a partition no instance read never raised the alert."""
    broker = kafka_broker
    broker.create_topic("half", PARTITIONS)
    produce_round_robin(broker, "half", _events(400), PARTITIONS)
    serve = serve_processes(
        broker.bootstrap, "half", tmp_path / "a.sqlite",
        [*ARGS, "--instances", "2", "--instance", "0"],
    ).start()
    scrape = serve.wait_for(
        lambda m: caught_up(200)(m) and lags_by_partition(m).get(1) == 100, 60,
        "instance 0 caught up",
    )
    assert lags_by_partition(scrape) == {0: 0, 1: 100, 2: 0, 3: 100}
    # Events keep arriving: the unread partitions' lag grows, the read ones' goes back to 0.
    produce_round_robin(broker, "half", _events(400, seed=4), PARTITIONS)
    scrape = serve.wait_for(
        lambda m: caught_up(400)(m) and lags_by_partition(m) == {0: 0, 1: 200, 2: 0, 3: 200}, 60,
        "the lag of partitions 1 and 3 to grow",
    )
    assert "ragpulse_consumer_group_lag" not in {name for name, _, _ in scrape.samples}
    assert serve.terminate() == 0


def _families(scrape: Scrape, *prefixes: str) -> set[str]:
    return {name for name, _, _ in scrape.samples if name.startswith(prefixes)}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_serve_that_finds_an_older_owner_mid_run_stops_exporting_its_counts_windows_and_lag(
    kafka_broker: ApacheKafkaBroker,
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    """The first serve (lease: --unhealthy-after 2s) is held in a cycle until its lease has
    run out (its /healthz says so), so a second one on the same partitions passes the claim
    at start and counts every event a second time. Once the first is released and commits, the
    second finds it mid-run: being the newer, it stops counting, and its /metrics no longer
    exports what it counted (counters, windows, lag), while /healthz answers 503."""
    broker = kafka_broker
    topic = "lost"
    broker.create_topic(topic, PARTITIONS)
    produce_round_robin(broker, topic, _events(400), PARTITIONS)
    holds = CycleHolds(tmp_path / "hooks")
    lease = [*ARGS, "--unhealthy-after", "2s"]
    first = serve_processes(
        broker.bootstrap, topic, tmp_path / "a.sqlite", lease, env=holds.env
    ).start()
    first.wait_for(caught_up(400), 120, "the first serve caught up")
    holds.hold("planned")
    produce_round_robin(broker, topic, _events(40, seed=5), PARTITIONS)
    holds.wait_at("planned", first)
    wait_until(lambda: first.healthz()[0] == 503, "the first serve's lease to run out")

    second = serve_processes(broker.bootstrap, topic, tmp_path / "b.sqlite", ARGS).start()
    counted = second.wait_for(caught_up(440), 120, "the second serve counted every event")
    assert _families(counted, "ragpulse_judge_verdicts", "ragpulse_judge_pass")
    assert lags_by_partition(counted) == dict.fromkeys(range(PARTITIONS), 0)

    holds.release("planned")
    wait_until(lambda: _refused(second.healthz()), "the second serve to find the first")
    scrape = second.metrics()
    assert scrape.total("ragpulse_events_total") == 0
    assert not _families(scrape, "ragpulse_judge_verdicts", "ragpulse_judge_pass",
                         "ragpulse_judge_in_progress_", "ragpulse_judge_window_samples",
                         "ragpulse_consumer_lag")
    assert scrape.value("ragpulse_heartbeat_timestamp_seconds") is not None  # still scraped
    assert "started later and stops" in first.log_text()
    first.wait_for(caught_up(440), 60, "the first serve went on counting")
    assert first.metrics().total("ragpulse_events_total") == 440
    assert not _refused(first.healthz())
    assert second.terminate() == 0
    assert first.terminate() == 0

