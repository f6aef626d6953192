"""Checks computed inside an XLA program and asserted outside it.

XLA drops assertions, so the fused serving lookup (`fused_host.py`) cannot
raise from inside its compiled program. Instead the program computes its
checks as data, and one `Assert` op outside the program raises with the
first failed check's message (fixed at trace time) and its value (the
largest id of a column, the count of a weight feature's NaN or inf
values). A served call pays one assertion, not a branch: an `If` runs its
branch as a function call on every call (W1's default export at batch 64:
about a tenth of the call, measured in `benchmarks/`), and a lowered
`tf.cond` walks its untaken branch.

A call whose checks pass pays one reduction for all of them (`Checks.
worst`): XLA runs each reduction as a task of its own, and one per check
(26 for the Criteo-shaped W4) cost more than its gathers at batch 1. Which
check failed, and its value, is computed only when one did, in a
conditional inside the program (`verdict`). A check may show several
values (the batch sizes of a call's inputs, `Checks.shows`): then the
program returns the widest check's count of values, and the assertion
shows as many of them as the failed check has.

Under `returned_checks()`, a lookup traced inside a larger program (the
export's joined lookups, or a whole model under `jit_compile=True`,
`serving/`) hands its checks to the collector instead; the caller folds
every lookup's checks into one verdict at the end of its program and
asserts it outside (`assert_clear`).

A lookup that cannot hand its checks over (a column whose padding is
checked per batch) marks the collector `refused`; lookups of other paths
hand nothing, which the caller sees by counting them: a layer notes each
backend call it makes (`note_lookup`), and the collector is `complete`
only when every one handed its checks.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Callable
from typing import Iterator
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor


@dataclasses.dataclass(frozen=True)
class Checks:
    """Checks computed in a program, one per message.

    Attributes:
        worst: int64 scalar, negative when every check passed
            (`worst_of`).
        details: builds, where it is called, bool `[k]` (whether each
            check passed) and int64 `[k]` (each one's value that shows why
            not; `[k, shows]` when each shows more than one); `verdict`
            calls it only when `worst` is not negative.
        messages: the `k` messages, each ending where its values are
            shown.
        shows: how many values each check shows.
    """

    worst: Tensor
    details: Callable[[], tuple[Tensor, Tensor]]
    messages: tuple[str, ...]
    shows: int = 1


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Every check of a program folded: `clear` when all passed, else the
    index of the first that did not and its value (a scalar), or, when some
    check shows several (`Checks.shows`), its values padded to the widest
    check's count (`[n]`) and how many of them it shows (`shown`, `[1]`).
    """

    clear: Tensor
    first: Tensor
    evidence: Tensor
    shown: Tensor | None = None


def worst_of(per_example: Sequence[Tensor]) -> Tensor:
    """One int64 scalar for checks given per example (`[batch]` each,
    negative where the example passes): negative when all pass.

    One element-wise maximum and one reduction: a reduction per check, or
    of their concatenation (which XLA splits back into one per piece),
    runs as a task of its own each. Inputs of other batch sizes are padded
    with passes to the longest first; XLA knows the sizes when it
    compiles, so inputs of one batch size pad by nothing.
    """
    longest = tf.reduce_max(tf.stack([tf.size(v) for v in per_example]))
    padded = [
        tf.pad(v, [[0, longest - tf.size(v)]], constant_values=-1)
        for v in per_example
    ]
    return tf.reduce_max(functools.reduce(tf.maximum, padded))


def verdict(checks: Sequence[Checks]) -> Verdict:
    """The `Verdict` of every lookup's `checks`, computed where they are
    (in the program: three scalars leave it, or a few more values when a
    check shows several). When all pass, the details are not computed (an
    XLA conditional inside a compiled program)."""
    worsts = [c.worst for c in checks]
    worst = worsts[0] if len(worsts) == 1 else tf.reduce_max(tf.stack(worsts))
    clear = worst < 0
    widest = max(c.shows for c in checks)
    shape = [] if widest == 1 else [widest]

    def passed_all() -> tuple[Tensor, Tensor]:
        return tf.constant(0, tf.int32), tf.zeros(shape, tf.int64)

    def first_failed() -> tuple[Tensor, Tensor]:
        passed, evidence = zip(*(c.details() for c in checks))
        every = tf.concat(passed, 0)
        first = tf.argmin(tf.cast(every, tf.int32), output_type=tf.int32)
        if widest > 1:
            evidence = tuple(
                tf.pad(
                    tf.reshape(values, [-1, c.shows]),
                    [[0, 0], [0, widest - c.shows]],
                )
                for c, values in zip(checks, evidence)
            )
        return first, tf.gather(tf.concat(evidence, 0), first)

    first, evidence = tf.cond(clear, passed_all, first_failed)
    if widest == 1:
        return Verdict(clear=clear, first=first, evidence=evidence)
    shows = [c.shows for c in checks for _ in c.messages]
    shown = tf.reshape(tf.gather(tf.constant(shows), first), [1])
    return Verdict(clear=clear, first=first, evidence=evidence, shown=shown)


def messages_of(checks: Sequence[Checks]) -> tuple[str, ...]:
    """Every lookup's messages, in the order `verdict` counts them."""
    return tuple(m for c in checks for m in c.messages)


def assert_clear(verdict: Verdict, messages: Sequence[str]) -> Tensor | None:
    """One `Assert` op: raises `InvalidArgumentError` with the first failed
    check's message and values unless `verdict.clear`. Inside a
    `tf.function` it runs by TensorFlow's automatic control dependencies
    (it is stateful); eagerly it raises at once. Returns the op (None
    eagerly), for what must run only after it.

    Example:

    >>> checks = Checks(
    ...     worst=tf.constant(2, tf.int64),
    ...     details=lambda: (
    ...         tf.constant([True, False]), tf.constant([0, 12], tf.int64)
    ...     ),
    ...     messages=("a fine.", "Feature b has ids outside [0, 10). "
    ...               "Largest id:"),
    ... )
    >>> try:
    ...     assert_clear(verdict([checks]), checks.messages)
    ... except tf.errors.InvalidArgumentError as e:
    ...     print(e.message.split("assertion failed: ")[1].split(" [Op")[0])
    [Feature b has ids outside [0, 10). Largest id:] [12]
    """
    if len(messages) == 1:
        message = tf.constant(messages[0])
    else:
        message = tf.gather(tf.constant(list(messages)), verdict.first)
    evidence = verdict.evidence
    if verdict.shown is not None:
        evidence = tf.slice(evidence, [0], verdict.shown)
    # The raw op: `tf.debugging.Assert` wraps data other than string and
    # int32 (the int64 evidence) in a `tf.cond`, a branch on every call.
    check: Tensor | None = tf.raw_ops.Assert(
        condition=verdict.clear,
        data=[message, evidence],
        summarize=max(1, verdict.evidence.shape.num_elements() or 1),
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


# The open collectors, innermost last, of this thread or task: an export
# traced on another thread at the same time has its own (a module-level
# list shared them, and removed a collector by equality, so that closing
# one could close an equal one of another trace).
_OPEN: contextvars.ContextVar[tuple[ReturnedChecks, ...]] = (
    contextvars.ContextVar("keras_tpu_embed_returned_checks", default=())
)


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
    token = _OPEN.set(_OPEN.get() + (checks,))
    try:
        yield checks
    finally:
        _OPEN.reset(token)


def active() -> ReturnedChecks | None:
    """The innermost collector, or None outside `returned_checks()`."""
    opened = _OPEN.get()
    return opened[-1] if opened else None


def note_lookup() -> None:
    """Counts one backend call of a layer in the active collector."""
    checks = active()
    if checks is not None:
        checks.lookups += 1
