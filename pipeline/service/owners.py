"""Who else reads this instance's partitions: a second live owner, or another --instances.

Two `ragpulse serve` with one --instance, or with different --instances, count the same events
twice (each has its own state file) and leave other partitions unread. Nothing in Kafka stops
them: serve assigns partitions by hand, so the instances share only the consumer group's
committed offsets. Each instance therefore signs its commits (`Owner.metadata`: the commit's
metadata string, kept by Kafka next to the offset) and reads the group's commits back before
it commits again (`conflicts`): a commit on one of its partitions that is not its own, made
since its own, is a second live owner; a live commit with another --instances is a mistake
too. Brokers that drop the metadata string (Tansu 0.6, the test broker) still show the first
case when the other owner commits another offset.

Two serves that start within milliseconds of each other both find no owner in the group's
commits; each then commits its claim and reads it back, and the one whose read-back came before
the other's claim used to pass with it. So the claim is a splitter (Moir and Anderson, 1995)
over two registers: each claimant first writes its name in a second register, the claims group
(`claim_rivals`), then reads the group's commits (the first register: a live owner closes the
door), commits its claim there, and reads the claims group back: its claim stands only if its
name is still the last one written there. Of claims that overlap, at most one stands (the
last to write its name did so after every other had written its own; any later one then finds
its claim in the first register); when they overlap closely, all may be refused, and the next
start after their lease wins.

The state file's exclusive lock (`pipeline.service.state.lock_state`) says which owner used
the file before this process: that one is dead (it no longer holds the lock), so its commits
are not a second owner's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Commit", "Owner", "claim_rivals", "conflicts", "read_metadata"]


@dataclasses.dataclass(frozen=True, slots=True)
class Owner:
    """One serve process reading partitions p with p % instances == instance."""

    id: str
    instance: int
    instances: int
    started: float
    # How long after its last commit the owner counts as alive (its --unhealthy-after: a serve
    # that has not finished a cycle for that long is unhealthy anyway).
    lease_seconds: float

    @classmethod
    def this_process(cls, instance: int, instances: int, lease_seconds: float) -> Owner:
        owner_id = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        return cls(owner_id, instance, instances, time.time(), lease_seconds)

    def metadata(self, now: float, *, released: bool = False) -> str:
        """The metadata string of this owner's commits (Kafka keeps up to 4,096 bytes)."""
        return json.dumps(
            {
                "owner": self.id,
                "instance": self.instance,
                "instances": self.instances,
                "started": round(self.started, 3),
                "heartbeat": round(now, 3),
                "lease": self.lease_seconds,
                "released": released,
            },
            separators=(",", ":"),
        )

    def describe(self) -> str:
        return f"{self.id} (--instance {self.instance} --instances {self.instances})"


@dataclasses.dataclass(frozen=True, slots=True)
class Commit:
    """One partition's committed offset in the consumer group, with what its metadata says."""

    offset: int
    owner: Owner | None = None  # None: no ragpulse metadata (the broker dropped it, or a tool)
    heartbeat: float = 0.0
    released: bool = False


def read_metadata(offset: int, metadata: str | None) -> Commit:
    """The commit of `offset` with `metadata`; metadata that is not ragpulse's is ignored."""
    try:
        data: Any = json.loads(metadata) if metadata else None
        owner = Owner(
            str(data["owner"]),
            int(data["instance"]),
            int(data["instances"]),
            float(data["started"]),
            float(data["lease"]),
        )
        return Commit(offset, owner, float(data["heartbeat"]), bool(data.get("released")))
    except (ValueError, TypeError, KeyError):
        return Commit(offset)


def conflicts(
    me: Owner,
    group: Mapping[int, Commit],
    mine: Mapping[int, int] | None,
    *,
    previous_owner: str | None,
    now: float,
) -> list[tuple[str, Owner | None]]:
    """What in the group's commits `group` shows another live owner of `me`'s partitions or
    another --instances: one sentence each, with that owner when its commit says who it is
    (empty: nothing).

    `mine`: the offsets `me` committed last ({partition: offset}), None before its first
    commit (at start, only a commit whose lease has not run out can be a live owner's).
    `previous_owner`: the owner that used this state file before (dead; its commits are fine).
    """
    found: list[tuple[str, Owner | None]] = []
    for partition, commit in sorted(group.items()):
        other = commit.owner
        if other is not None and other.id in (me.id, previous_owner):
            continue
        owned = partition % me.instances == me.instance
        if mine is not None and owned and partition in mine:
            if other is not None or commit.offset != mine[partition]:
                who = other.describe() if other is not None else "another process"
                found.append((
                    f"partition {partition} was committed by {who} since this instance "
                    "committed it",
                    other,
                ))
            continue
        if other is None or commit.released or now - commit.heartbeat > other.lease_seconds:
            continue
        if owned:
            found.append((f"partition {partition} is read by the live {other.describe()}", other))
        elif other.instances != me.instances:
            found.append((
                f"partition {partition} is read by the live {other.describe()}, with other "
                f"--instances than this one's {me.instances}",
                other,
            ))
    return found


def claim_rivals(
    me: Owner, claims: Mapping[int, Commit], partitions: Iterable[int]
) -> list[tuple[str, Owner | None]]:
    """Why `me`'s claim on `partitions` does not stand, as the claims group's commits `claims`
    show it, read back after `me` wrote its name there and committed its claim (module
    docstring): another name written since on one of them, or none (a claimant removed the
    claims group once its claim stood). A commit without ragpulse's metadata (a broker
    that drops it) cannot say who wrote it: it is no rival."""
    found: list[tuple[str, Owner | None]] = []
    for partition in sorted(partitions):
        commit = claims.get(partition)
        if commit is None:
            found.append((
                f"partition {partition} was claimed by another serve at the same moment (its "
                "claim was decided first)",
                None,
            ))
        elif commit.owner is not None and commit.owner.id != me.id:
            found.append((
                f"partition {partition} was claimed by {commit.owner.describe()} at the same "
                "moment",
                commit.owner,
            ))
    return found
