"""Composite PTransforms written as one function (Beam's `ptransform_fn`), typed.

A stage, source or sink that only chains labelled steps is a function of its input and its
arguments rather than a PTransform subclass whose `__init__` stores them for `expand`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec

import apache_beam as beam

_Args = ParamSpec("_Args")


def composite_transform(
    expand: Callable[Concatenate[Any, _Args], Any],
) -> Callable[_Args, beam.PTransform]:
    """`beam.ptransform_fn`, keeping the arguments of `expand` after its input in the type of
    the transform's constructor (Beam's own hint takes any arguments), so mypy checks each use.

    Apply it with a label (`"Label" >> Transform(...)`): unlabelled, its label has its first
    argument in it. Its arguments are shown as the step's display data in the runner's UI, so
    pass it none that may hold a credential.
    """
    factory: Callable[_Args, beam.PTransform] = beam.ptransform_fn(expand)
    return factory
