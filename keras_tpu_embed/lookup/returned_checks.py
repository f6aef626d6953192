"""Checks computed inside an XLA program and asserted outside it.

XLA drops assertions, so the fused serving lookup (`fused_host.py`) cannot
raise from inside its compiled program. Instead the program computes each
check as data: per check, whether it passed and one value that shows why
not (the largest id of a column, the count of a weight feature's NaN or
inf values), beside a message fixed at trace time. The program reduces
them to a `Verdict` (every check passed; the first that did not, and its
value), and one `Assert` op outside the program raises with that check's
message when the verdict is not clear. A served call pays one assertion,
not a branch: an `If` runs its branch as a function call on every call
(W1's default export at batch 64: about a tenth of the call, measured in
`benchmarks/`), and a lowered `tf.cond` walks its untaken branch.

Under `returned_checks()`, a lookup traced inside a larger program (the
export's joined lookups, or a whole model under `jit_compile=True`,
`export/`) hands its checks to the collector instead of reducing them; the
caller folds every lookup's checks into one verdict at the end of its
program (`verdict`) and asserts it outside (`assert_clear`).

A lookup that cannot hand its checks over (a column whose padding is
checked per batch) marks the collector `refused`; lookups of other paths
hand nothing, which the caller sees by counting them: a layer notes each
backend call it makes (`note_lookup`), and the collector is `complete`
only when every one handed its checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor


@dataclasses.dataclass(frozen=True)
class Checks:
    """Checks computed in a program, `k` of them.

    Attributes:
        passed: bool `[k]`, whether each check passed.
        evidence: int64 `[k]`, each check's value that shows why it did
            not (meaningless when it did).
        messages: the `k` messages, each ending where its value is shown.
    """

    passed: Tensor
    evidence: Tensor
    messages: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Every check of a program folded into scalars: `clear` when all
    passed, else the index of the first that did not and its value."""

    clear: Tensor
    first: Tensor
    evidence: Tensor


def gathered(checks: Sequence[Checks]) -> Checks:
    """Several lookups' checks as one `Checks`, in order."""
    if len(checks) == 1:
        return checks[0]
    return Checks(
        passed=tf.concat([c.passed for c in checks], 0),
        evidence=tf.concat([c.evidence for c in checks], 0),
        messages=tuple(m for c in checks for m in c.messages),
    )


def verdict(checks: Checks) -> Verdict:
    """The `Verdict` of `checks`, computed where they are (in the program:
    three scalars leave it, not `k` flags)."""
    first = tf.argmin(tf.cast(checks.passed, tf.int32), output_type=tf.int32)
    return Verdict(
        clear=tf.reduce_all(checks.passed),
        first=first,
        evidence=tf.gather(checks.evidence, first),
    )


def assert_clear(verdict: Verdict, messages: Sequence[str]) -> Tensor | None:
    """One `Assert` op: raises `InvalidArgumentError` with the first failed
    check's message and value unless `verdict.clear`. Inside a
    `tf.function` it runs by TensorFlow's automatic control dependencies
    (it is stateful); eagerly it raises at once.

    Example:

    >>> checks = Checks(
    ...     passed=tf.constant([True, False]),
    ...     evidence=tf.constant([0, 12], tf.int64),
    ...     messages=("a fine.", "Feature b has ids outside [0, 10). "
    ...               "Largest id:"),
    ... )
    >>> try:
    ...     assert_clear(verdict(checks), checks.messages)
    ... except tf.errors.InvalidArgumentError as e:
    ...     print(e.message.split("assertion failed: ")[1].split(" [Op")[0])
    [Feature b has ids outside [0, 10). Largest id:] [12]
    """
    if len(messages) == 1:
        message = tf.constant(messages[0])
    else:
        message = tf.gather(tf.constant(list(messages)), verdict.first)
    # The raw op: `tf.debugging.Assert` wraps data other than string and
    # int32 (the int64 evidence) in a `tf.cond`, a branch on every call.
    check: Tensor | None = tf.raw_ops.Assert(
        condition=verdict.clear,
        data=[message, verdict.evidence],
        summarize=1,
    )
    return check


@dataclasses.dataclass
class ReturnedChecks:
    """The checks handed over while tracing, and why not, if refused."""

    handed: list[Checks] = dataclasses.field(default_factory=list)
    refused: list[str] = dataclasses.field(default_factory=list)
    lookups: int = 0
    """Backend calls traced (`note_lookup`): each must hand its checks."""

    def own(self, checks: Checks) -> None:
        """Adds a check of the caller's own, beside its lookups'."""
        self.handed.append(checks)
        self.lookups += 1

    @property
    def complete(self) -> bool:
        """Whether every lookup traced handed its checks over."""
        return not self.refused and len(self.handed) == self.lookups


_ACTIVE: list[ReturnedChecks] = []


@contextlib.contextmanager
def returned_checks() -> Iterator[ReturnedChecks]:
    """Collects the checks of the fused lookups traced inside.

    Example:

    >>> with returned_checks() as checks:
    ...     pass
    >>> checks.handed, checks.refused, checks.complete
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
