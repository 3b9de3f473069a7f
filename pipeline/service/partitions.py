"""This instance's partitions of the topic: where each cycle reads, who owns them, and the lag.

For whoever changes how serve shares a topic. `Partitions` owns what the serve loop knows of
the topic's partitions between cycles: the consumer group (`pipeline.sources.kafka.KafkaGroup`),
this process as the owner that signs its commits and what it committed last
(`pipeline.service.owners`), whether it stopped counting because another owner was found, when
each partition last had a backlog (for --partition-idle-after) and the lag of every partition
of the topic, read by this instance or not (`lag`). A cycle asks
it for its plan (`plan`), which partitions hold the watermark back (`holding`), and, once the
cycle is saved, to commit and measure (`after_cycle`).

Ownership is claimed before anything is counted (`claim`): a serve writes its name in the
claims group (the consumer group's id + `.claims`), reads the group's commits, commits its
signed claim on its partitions and reads the claims group back; another live owner's claim or
commit on them, another --instances, or another name written since in the claims group refuses
the start (of serves that claim at the same moment at most one goes on; if each sees the other,
all stop, and nothing is counted twice either way: `pipeline.service.owners`). The claims
group is removed once a claim stands (or a live owner refuses it), so Kafka's lag tools do
not show it. A state file
holding offsets of partitions this instance does not own is refused at open (`open_state`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.service.cycle_hooks import CycleHooks
from ragpulse.pipeline.service.owners import (
    Commit,
    Owner,
    claim_rivals,
    conflicts,
    read_metadata,
)
from ragpulse.pipeline.service.plan import CyclePlan, check_resets, plan_cycle
from ragpulse.pipeline.service.state import StateError, StateStore
from ragpulse.pipeline.service.watermark import holding_partitions
from ragpulse.pipeline.settings.models import ServeSettings
from ragpulse.pipeline.sources.kafka import (
    ONE_SHOT,
    KafkaClients,
    KafkaGroup,
    LogBounds,
    consumer_lag,
)

log = logging.getLogger(__name__)

Lag = dict[tuple[str, int], int]
# The claims group: the second register of the claim (`Partitions.claim`).
CLAIMS_GROUP_SUFFIX = ".claims"


class Partitions:
    """The partitions p of the topic with p % --instances == --instance, and the group's view
    of all of them (module docstring)."""

    def __init__(
        self,
        settings: ServeSettings,
        state: StateStore,
        owner: Owner,
        previous_owner: str | None = None,
        *,
        was_reset: bool = False,
        clients: KafkaClients = ONE_SHOT,
    ) -> None:
        """`owner`: this process as it signs its commits; `previous_owner`: the one that held
        the state file's lock before; `was_reset`: the state file is fresh after --state-reset;
        `clients`: the Kafka consumers serve keeps for the group's questions each cycle."""
        s = self.settings = settings
        self.state = state
        self.group = KafkaGroup(
            s.bootstrap, s.group_id, s.topic, s.kafka_timeout_seconds, s.kafka_security, clients
        )
        self.owner = owner
        self._previous_owner = previous_owner
        # The offsets this process last committed (None before its first commit), and why it
        # stopped counting, if another owner of its partitions was found.
        self._committed: dict[int, int] | None = None
        self.refused: str | None = None
        self._newer_owners_logged: set[str] = set()
        # After a reset, the consumer group's committed offsets say where the lost file had got;
        # for a sharded instance they say where the previous owner of a partition had got.
        self._group_offsets: dict[int, int] | None = (
            None if was_reset or s.instances > 1 else {}
        )
        # When each partition last had a backlog (time.monotonic()), for --partition-idle-after;
        # every partition counts from start-up (or from when it appears), so a restart idles
        # none before its grace.
        self._started = time.monotonic()
        self._last_backlog: dict[int, float] = {}
        self._lock = threading.Lock()
        self._lag: Lag = {}
        if s.instances > 1:
            log.info(
                "instance %d of %d: reading the partitions p of %s with p %% %d == %d",
                s.instance, s.instances, s.topic, s.instances, s.instance,
            )

    # ----- a cycle ---------------------------------------------------------------------------
    def plan(self) -> tuple[LogBounds, CyclePlan]:
        """The topic's bounds (every partition) and the cycle's plan over this instance's,
        from the saved offsets; resets are logged, and refused under --on-offset-reset fail
        (`pipeline.service.plan.OffsetResetRefused`)."""
        s = self.settings
        every = self.group.bounds()
        bounds = every.only(s.owns)
        saved = self.state.offsets(s.topic)
        plan = plan_cycle(
            bounds,
            saved,
            max_records=s.max_batch_events,
            on_offset_reset=s.on_offset_reset,
            group_offsets=self._group_offsets_for(saved, bounds),
        )
        check_resets(plan, s.topic, str(s.state), s.on_offset_reset)
        return every, plan

    def holding(self, plan: CyclePlan) -> set[int]:
        """The partitions that hold the watermark back after `plan`'s cycle: all but those
        idle (no backlog) for --partition-idle-after."""
        clock = time.monotonic()
        for p in plan.ends:
            self._last_backlog.setdefault(p, self._started)
        self._last_backlog.update(dict.fromkeys(plan.ranges, clock))
        return set(
            holding_partitions(
                self._last_backlog, clock, self.settings.partition_idle_after_seconds
            )
        )

    def after_cycle(self, every: LogBounds, plan: CyclePlan) -> None:
        """The saved cycle made visible to the group: its offsets committed, signed (every
        cycle, even one that read nothing: the signed commit is this owner's heartbeat), and
        the lag of every partition of the topic (`lag`)."""
        group = self._commit()
        # The lag is measured against the ends as they are NOW: measured against the ends seen
        # at the start of the cycle it would read 0 after every cycle that caught up with them,
        # however much arrived while the cycle ran (a 16 s cycle at 3,000 events/s hid 48,000).
        now_ends = self._ends_after_cycle(plan.ends) if plan.ranges else dict(plan.ends)
        topic = self.settings.topic
        offsets = {**plan.starts, **self.state.offsets(topic)}
        lag = {(topic, p): n for p, n in consumer_lag(offsets, now_ends).items()}
        lag.update(self._others_lag(group, every))
        with self._lock:
            self._lag = lag

    def lag(self) -> Lag:
        """The consumer lag of every partition of the topic: this instance's partitions from
        the offsets its state file holds, the others from the consumer group's commits (from
        the log start when none was committed: a partition no instance reads lags by all it
        holds). Every instance exports every partition; `max by (topic, partition)` across
        instances is the lag (the alert and the dashboard take it so)."""
        with self._lock:
            return dict(self._lag)

    # ----- ownership -------------------------------------------------------------------------
    def check_owners(self) -> list[tuple[str, Owner | None]]:
        """Another live owner of this instance's partitions, or another --instances, as the
        consumer group's commits show them (`pipeline.service.owners.conflicts`)."""
        group = self._group_commits()
        if group is None:
            return []
        return conflicts(
            self.owner, group, self._committed,
            previous_owner=self._previous_owner, now=time.time(),
        )

    def claim(self, hooks: CycleHooks) -> None:
        """Claim this instance's partitions before the first cycle counts anything: write this
        owner's name in the claims group; refuse (SettingsError) when the group's commits show
        another live owner or another --instances; else commit this owner's signed claim on
        every partition it owns, read both groups back, and refuse if another owner's claim
        landed beside it or another name was written in the claims group since this one's
        (module docstring, `pipeline.service.owners.claim_rivals`). `hooks`: a test holds
        serve at `claiming`, between reading the group and committing its claim. Visibility of
        Kafka aside, nothing is counted before this returns."""
        s = self.settings
        # Asked once, at start: its consumer is not kept.
        claims = dataclasses.replace(
            self.group, group_id=f"{s.group_id}{CLAIMS_GROUP_SUFFIX}", clients=ONE_SHOT
        )
        metadata = self.owner.metadata(time.time())
        offsets: dict[int, int] = {}
        try:
            offsets = self._claimed_offsets()
            claims.commit(offsets, metadata=metadata)
        except Exception as exc:  # the topic not there yet, the broker away: as before
            log.warning(
                "could not claim the partitions in consumer group %s before the first cycle "
                "(its commits will): %s", s.group_id, exc,
            )
            offsets = {}
        found = self.check_owners()
        rivals: list[tuple[str, Owner | None]] = []
        if not found and offsets:
            hooks.at("claiming")
            try:
                self.group.commit(offsets, metadata=metadata)
                self._committed = dict(offsets)
                rivals = claim_rivals(self.owner, _signed_commits(claims), offsets)
            except Exception as exc:  # as above: the first cycle's commit checks again
                log.warning(
                    "could not claim the partitions in consumer group %s before the first "
                    "cycle (its commits will): %s", s.group_id, exc,
                )
            else:
                found = [*self.check_owners(), *rivals]
        # A claim that lost to a rival's name leaves the claims group to that rival, which may
        # not have read it back yet: finding no name there would refuse it too.
        if offsets and not rivals:
            self._remove(claims)
        if found:
            raise SettingsError(
                f"another serve reads partitions of {s.topic!r} in consumer group "
                f"{s.group_id!r} ({'; '.join(w for w, _ in found)}): give every instance "
                "the same --instances and its own --instance (if that serve has stopped, its "
                "lease ends --unhealthy-after its last commit)"
            )

    def release(self) -> None:
        """Mark this owner's commits released (a clean stop), so that the next owner need not
        wait for the lease of this one to run out. Visibility only: a failure is logged."""
        if self._committed is None or self.refused is not None:
            return
        try:
            self.group.commit(
                self._owned_offsets(), metadata=self.owner.metadata(time.time(), released=True)
            )
        except Exception as exc:
            log.warning(
                "could not release consumer group %s's offsets: %s", self.settings.group_id, exc
            )

    @staticmethod
    def _remove(claims: KafkaGroup) -> None:
        """Remove the claims group once this claim stands, or was refused by a live owner: a
        claimant that reads it back after this finds no name and is refused, never let
        through; visibility only."""
        try:
            claims.delete()
        except Exception as exc:
            log.warning("could not remove the claims group %s: %s", claims.group_id, exc)

    def _claimed_offsets(self) -> dict[int, int]:
        """What the claim commits on each owned partition: the saved offset, else the group's
        committed one, else the partition's log start (where a first cycle starts)."""
        s = self.settings
        bounds = self.group.bounds().only(s.owns)
        group = self.group.committed()
        saved = self._owned_offsets()
        return {
            p: saved.get(p, group.get(p, bounds.beginnings.get(p, 0))) for p in bounds.ends
        }

    def _commit(self) -> dict[int, Commit] | None:
        """Read the group's commits back, refuse to go on if another owner made some of them,
        else commit this instance's offsets, signed; returns the group's commits (these
        included) for the lag gauge, None when they could not be read."""
        s = self.settings
        group = self._group_commits()
        if group is not None:
            found = conflicts(
                self.owner, group, self._committed,
                previous_owner=self._previous_owner, now=time.time(),
            )
            # The newer owner steps aside; when the other's commits do not say when it
            # started (a broker that drops commit metadata), this one cannot know: it stops.
            if any(o is None or o.started <= self.owner.started for _, o in found):
                self._refuse(found)
                return group
            for why, other in found:
                if other is not None and other.id not in self._newer_owners_logged:
                    self._newer_owners_logged.add(other.id)
                    log.error("%s; that owner started later and stops", why)
        offsets = self._owned_offsets()
        try:
            self.group.commit(offsets, metadata=self.owner.metadata(time.time()))
        except Exception as exc:  # visibility only: the state file already holds the offsets
            log.warning("could not commit offsets to consumer group %s: %s", s.group_id, exc)
            self._committed = None  # not known to have landed: nothing to compare with
            return group
        if offsets:
            self._committed = dict(offsets)
        return None if group is None else {**group, **{p: Commit(o) for p, o in offsets.items()}}

    def _refuse(self, found: list[tuple[str, Owner | None]]) -> None:
        s = self.settings
        self.refused = (
            f"another serve reads the partitions of --instance {s.instance} --instances "
            f"{s.instances} in consumer group {s.group_id!r} ({'; '.join(w for w, _ in found)}): "
            "each event would be counted twice; this instance stopped counting. Give every "
            "instance the same --instances and its own --instance, then restart this one"
        )
        log.error("%s", self.refused)

    def _owned_offsets(self) -> dict[int, int]:
        """The saved offsets of this instance's partitions: the others' owners commit theirs."""
        s = self.settings
        return {p: o for p, o in self.state.offsets(s.topic).items() if s.owns(p)}

    def _group_commits(self) -> dict[int, Commit] | None:
        """The consumer group's commits on every partition; None when they cannot be read."""
        try:
            return _signed_commits(self.group)
        except Exception as exc:  # visibility only: the next cycle asks again
            log.warning("could not read consumer group %s's offsets: %s", self.group.group_id, exc)
            return None

    def _group_offsets_for(self, saved: Mapping[int, int], bounds: LogBounds) -> dict[int, int]:
        """Where partitions with no saved offset go on from, if not from their log start:
        after --state-reset moved an unusable file aside (and for a sharded instance), the
        consumer group's committed offsets (where that file, or the partition's previous owner,
        had got to); asked once, and only when a partition has no saved offset.

        Only then: a missing file is a fresh start from the log start, so that a second
        deployment sharing the group (or a deliberate recount) is not silently skipped ahead.
        """
        s = self.settings
        if all(p in saved for p in bounds.ends):
            return {}
        if self._group_offsets is None:
            self._group_offsets = self.group.committed()
            if self._group_offsets:
                log.warning(
                    "fresh state after --state-reset: going on from consumer group %s's committed "
                    "offsets %s for %s (other partitions from their log start)",
                    s.group_id,
                    self._group_offsets,
                    s.topic,
                )
        return self._group_offsets or {}

    # ----- lag -------------------------------------------------------------------------------
    def _ends_after_cycle(self, ends: Mapping[int, int]) -> dict[int, int]:
        """End offsets after a cycle, for the lag gauge; the ones from its start if that fails."""
        try:
            now = self.group.bounds().ends
        except Exception as exc:  # visibility only: the next cycle asks again
            log.warning("could not read end offsets for the lag gauge: %s", exc)
            return dict(ends)
        return {**ends, **{p: end for p, end in now.items() if self.settings.owns(p)}}

    def _others_lag(self, group: Mapping[int, Commit] | None, every: LogBounds) -> Lag:
        """The lag of the partitions other instances read, as the consumer group's commits
        show it: from the log start where none has committed; as last measured when the
        commits could not be read."""
        topic, owns = self.settings.topic, self.settings.owns
        if group is None:
            with self._lock:
                return {k: n for k, n in self._lag.items() if not owns(k[1])}
        start = every.beginnings
        return {
            (topic, p): max(0, end - (group[p].offset if p in group else start.get(p, 0)))
            for p, end in every.ends.items()
            if not owns(p)
        }


def _signed_commits(group: KafkaGroup) -> dict[int, Commit]:
    """`group`'s commits on every partition, with what their metadata says."""
    return {p: read_metadata(offset, meta) for p, (offset, meta) in group.commits().items()}


def open_state(settings: ServeSettings) -> tuple[StateStore, bool]:
    """The state store at --state, and whether it was reset: with --state-reset, an unusable
    file (or one written under another partition assignment) is moved aside (to
    FILE.corrupt-<time>) and a fresh one started. Without it, SettingsError says what to do."""
    path = settings.state
    try:
        state = StateStore(path)
        _check_assignment(state, settings)
        return state, False
    except StateError as exc:
        if not settings.state_reset:
            raise SettingsError(str(exc)) from None
        moved = StateStore.move_aside(path)
        log.warning("%s; --state-reset: moved it to %s and starting a fresh state", exc, moved)
    return StateStore(path), True


def _check_assignment(state: StateStore, settings: ServeSettings) -> None:
    """Refuse (StateError, the store closed) a state file holding offsets of partitions this
    instance does not own: it was written with other --instance/--instances, or is another
    instance's, and going on would count those partitions twice or leave them unread."""
    foreign = sorted(p for p in state.offsets(settings.topic) if not settings.owns(p))
    if not foreign:
        return
    state.close()
    raise StateError(
        f"state file {settings.state} holds offsets of partitions "
        f"{','.join(map(str, foreign))} of {settings.topic!r}, which --instance "
        f"{settings.instance} --instances {settings.instances} does not read: it was written "
        "under another assignment or by another instance. Give each instance its own state "
        "file and keep its --instance and --instances; to change --instances, stop every "
        "instance and start each with --state-reset (it goes on from the consumer group's "
        "committed offsets)"
    )
