"""Lookups that hand their checks to the caller instead of acting on them.

`export_saved_model(jit_compile=True)` compiles a whole model with XLA,
lookups included, when it can; XLA drops assertions, so a check inside the
program would vanish. Under `returned_checks()`, the fused serving lookup
(`fused_host.py`) answers from its program unconditionally and hands its
flag (every id in range, every weight finite) to the collector instead of
branching on it; the caller returns the flags from the program and, outside
it, answers only when all are clear, else runs the model uncompiled, whose
lookups raise naming the feature (`export/compiled_model.py`).

A lookup that cannot hand its checks over (a column whose padding is
checked per batch) marks the collector `refused`; lookups of other paths
hand nothing, which the caller sees by counting them: a layer notes each
backend call it makes (`note_lookup`), and the collector is `complete`
only when every one handed a flag.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from keras_tpu_embed.types import Tensor


@dataclasses.dataclass
class ReturnedChecks:
    """The flags handed over while tracing, and why not, if refused."""

    flags: list[Tensor] = dataclasses.field(default_factory=list)
    refused: list[str] = dataclasses.field(default_factory=list)
    lookups: int = 0
    """Backend calls traced (`note_lookup`): each must hand one flag."""

    @property
    def complete(self) -> bool:
        """Whether every lookup traced handed its checks over."""
        return not self.refused and len(self.flags) == self.lookups


_ACTIVE: list[ReturnedChecks] = []


@contextlib.contextmanager
def returned_checks() -> Iterator[ReturnedChecks]:
    """Collects the checks of the fused lookups traced inside.

    Example:

    >>> with returned_checks() as checks:
    ...     pass
    >>> checks.flags, checks.refused, checks.complete
    ([], [], True)
    """
    checks = ReturnedChecks()
    _ACTIVE.append(checks)
    try:
        yield checks
    finally:
        _ACTIVE.remove(checks)


def active() -> ReturnedChecks | None:
    """The innermost collector, or None outside `returned_checks()`."""
    return _ACTIVE[-1] if _ACTIVE else None


def note_lookup() -> None:
    """Counts one backend call of a layer in the active collector."""
    checks = active()
    if checks is not None:
        checks.lookups += 1
