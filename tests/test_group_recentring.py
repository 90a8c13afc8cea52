"""The expansion's start: capped Newton rounds that stop once settled or stalled.

``step_methods/group_recentring.py``: the rounds stop when no block moved by more than
``SETTLED`` of its conditional sd, or, once the moves are under ``STALL_BELOW`` sds, when a
round's largest move is not under ``STALLED`` times the round's before (blocks on a ridge
moving each other back and forth). The moves here are scripted, so that each rule is tested
alone and exactly.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pymc_subsample.step_methods.group_recentring import (
    SETTLED,
    STALL_BELOW,
    STALLED,
    GroupRecentring,
)


class _ScriptedStart(GroupRecentring):
    """The mixin with one block whose Newton moves (in sds) follow a script."""

    def __init__(self, moves: list[float]) -> None:
        self.functions = SimpleNamespace(factors=(None,), direct_coordinates=np.zeros(0))
        self.expansion = SimpleNamespace(expand=lambda point: None, ridges=[])
        self.oracles = SimpleNamespace(freeze_shared=lambda: None)
        self._ridge_walks = []
        self._script = iter(moves)
        self.rounds = 0

    def _newton_block(self, point: np.ndarray, block: int | None) -> float:
        self.rounds += 1
        return next(self._script)


@pytest.mark.parametrize(
    ("moves", "rounds"),
    [
        # Settled: the fifth round moves less than SETTLED.
        ([5.0, 0.6, 0.2, 0.05, SETTLED / 2] + [0.5] * 10, 5),
        # Stalled on a ridge: the same few hundredths of an sd from the third round on.
        ([5.0, 0.6, 0.02, 0.02, 0.02] + [0.02] * 10, 4),
        # Still shrinking by more than half a round: the rounds go on.
        ([5.0, 0.6, 0.2, 0.09, 0.04, SETTLED / 2] + [0.5] * 10, 6),
        # Far out the capped moves need not shrink: no stall above STALL_BELOW.
        ([50.0, 60.0, 55.0, 58.0, 3.0, 0.2, SETTLED / 2] + [0.5] * 10, 7),
    ],
)
def test_the_start_stops_once_settled_or_stalled(moves, rounds):
    assert 0.45 < STALLED <= 1.0 and STALL_BELOW < 50.0  # what the scripts assume
    start = _ScriptedStart(moves)
    start._recentre(np.zeros(3), newton_steps=12)
    assert start.rounds == rounds


def test_the_start_stops_after_its_rounds_when_the_moves_never_settle():
    start = _ScriptedStart([40.0, 30.0] * 10)
    start._recentre(np.zeros(3), newton_steps=12)
    assert start.rounds == 12
