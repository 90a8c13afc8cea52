"""Warnings from PyMC's worker processes, shipped to the parent in the draw statistics.

``pm.sample(cores>1)`` runs each chain in a worker process, where a warning is lost: PyMC only
logs the ``warning`` stat that its samplers return with each draw (``log_warning_stats``), on
PyMC 5 and 6 alike. So a step in a worker process diverts its warnings
(:func:`pymc_subsample.warnings.divert_to_outbox`) and returns them as its ``warning`` stat,
wrapped in :class:`RelayedWarnings`. The draw's statistics are pickled through the pipe to the
parent; unpickling a :class:`RelayedWarnings` there issues each message as a real
``SubsampleWarning`` at the user's ``pm.sample`` line, once per topic and sampling run (the same
warning from several chains: once), and leaves ``None`` in the stat, which PyMC then neither logs
nor keeps (``keep_warning_stat=False`` drops the ``warning`` stat).
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any

from pymc.sampling.parallel import ParallelSampler
from pymc.stats.convergence import SamplerWarning

from pymc_subsample.warnings import divert_to_outbox, take_outbox, warn_user

__all__ = ["WARNING_STAT", "RelayedWarnings", "relay_if_worker", "relayed_warnings"]

#: The stat a step returns its relayed warnings in. PyMC's NUTS and HMC use the same name,
#: and PyMC refuses a compound step whose steps declare one stat name with two types: so the
#: type is theirs (an object column either way).
WARNING_STAT: dict[str, tuple[type, None]] = {"warning": (SamplerWarning, None)}

#: Topics already issued, per parallel sampling run (a ParallelSampler lives for one run).
_issued: weakref.WeakKeyDictionary[ParallelSampler, set[str]] = weakref.WeakKeyDictionary()
#: Topics issued when unpickled outside a sampling run (for example from a stored trace).
_issued_elsewhere: set[str] = set()

#: What a worker ships: (topic, message) pairs.
Relayed = tuple[tuple[str, str], ...]


class RelayedWarnings:
    """Warnings of a worker process; unpickling issues them in the receiving process.

    ``str()`` gives the messages, which is what PyMC logs if it ever sees one un-pickled.
    """

    def __init__(self, warnings: Relayed) -> None:
        self.warnings = warnings

    def __reduce__(self) -> tuple[Any, tuple[Relayed]]:
        return _issue_relayed, (self.warnings,)

    def __str__(self) -> str:
        return "\n".join(message for _, message in self.warnings)


def relay_if_worker(home_pid: int) -> None:
    """Divert warnings to the outbox if this is not the process ``home_pid`` that built the step.

    Parameters
    ----------
    home_pid : int
        ``os.getpid()`` when the step was constructed. A forked or spawned worker process has
        another id; a chain sampled in the user's own process (``cores=1``) warns directly.
    """
    if os.getpid() != home_pid:
        divert_to_outbox()


def relayed_warnings() -> RelayedWarnings | None:
    """Return this draw's ``warning`` stat: the queued warnings, or None."""
    queued = take_outbox()
    return RelayedWarnings(queued) if queued else None


def _issue_relayed(warnings: Relayed) -> None:
    """Issue relayed warnings whose topic this run has not shown yet; the stat becomes None."""
    run = _sampling_run()
    issued = _issued.setdefault(run, set()) if run is not None else _issued_elsewhere
    for topic, message in warnings:
        if topic not in issued:
            issued.add(topic)
            warn_user(message)


def _sampling_run() -> ParallelSampler | None:
    """Find on the stack the ParallelSampler whose draw is being received (None: none)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == ParallelSampler.__module__:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, ParallelSampler):
                return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None
