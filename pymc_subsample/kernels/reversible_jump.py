"""Birth, death and update moves for variable selection, as a proposal of fixed dimension.

Korattikara et al. (2014), section 6.3 and supplementary E.

The state is ``q = (gamma, beta)``: D inclusion indicators (0.0 or 1.0) followed by D
coefficients, whose likelihood reads ``gamma * beta``. Reversible jump (Green 1995) adds and
drops coefficients; here every coefficient is always present, an excluded one distributed as
its prior in the model (a pseudo-prior, Carlin and Chib 1995), so that the chain's marginal on
``gamma`` and the included coefficients is the reversible-jump posterior, and the moves are
Metropolis-Hastings proposals whose log ratio this module returns. With ``k`` included:

- update (``k >= 1``): an included ``j``, ``beta_j += update_sd * z``; symmetric;
- birth (``k < D``): an excluded ``j``, ``gamma_j = 1``, ``beta_j ~ N(0, birth_sd^2)``;
- death (``k >= 1``): an included ``j``, ``gamma_j = 0``, and the dropped ``beta_j`` is replaced
  by a draw from its prior ``p(beta_j)`` (the pseudo-prior), so that birth and death are each
  other's reverse.

A birth's log proposal ratio is ``log P_death(k + 1) - log(k + 1) + log p(beta_j) -
log P_birth(k) + log(D - k) - log N(beta_j' | 0, sigma_birth)``, a death's the mirror image.
The model's ratio holds ``p(beta_j') / p(beta_j)``, so ``p`` of the excluded value cancels and
the acceptance ratio is the reversible-jump one: a birth's carries ``p(beta_j') / N(beta_j' |
0, sigma_birth) (D - k) / (k + 1)`` and the move probabilities (eq. 37), a death's the inverse
(eq. 38). The prior's ratio, including ``p(gamma)``, and the likelihood's come from the model,
so the target is whatever the user's model says (the paper's ``||beta||_1^-k lambda^k B(k, D -
k + 1)`` prior is one choice).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["MOVES", "BirthDeathProposal", "PseudoPrior"]


class PseudoPrior(NamedTuple):
    """The excluded coefficients' distribution: their prior in the model, at its current state."""

    #: ``draw(rng, j)``: a draw of coefficient j from its prior.
    draw: Callable[[np.random.Generator, int], float]
    #: ``log_density(j, value)``: its prior log-density at ``value``.
    log_density: Callable[[int, float], float]


#: The moves, in the order of ``move_probabilities``.
MOVES = ("update", "birth", "death")
#: Default sds of a born coefficient and of an update move: the paper's sigma_birth and
#: sigma_update (supplementary E), and the default move probabilities.
BIRTH_SD = 0.1
UPDATE_SD = 0.01
MOVE_PROBABILITIES = (1 / 3, 1 / 3, 1 / 3)


class MoveChoice(NamedTuple):
    """Which move was proposed and the probabilities of choosing it and its reverse."""

    move: str
    log_probability: float
    log_reverse_probability: float


class BirthDeathProposal:
    """Propose an update, birth or death move on ``q = (gamma, beta)``.

    Parameters
    ----------
    n_features : int
        D: ``q`` has ``2 D`` entries, the indicators first.
    pseudo_prior : PseudoPrior
        Draws and densities of an excluded coefficient (its prior in the model).
    birth_sd : float, default 0.1
        Sd of a born (and of a dropped) coefficient's proposal (the paper's sigma_birth).
    update_sd : float, default 0.01
        Sd of an update move's step (sigma_update).
    move_probabilities : tuple of float, default (1/3, 1/3, 1/3)
        Probabilities of update, birth and death; renormalised over the moves possible at
        ``k`` (no birth at ``k = D``, no update or death at ``k = 0``). The update's may be 0
        (another step updates the coefficients); birth and death need positive ones.

    Attributes
    ----------
    last_move : int
        The index in :data:`MOVES` of the move last proposed (-1 before the first).

    Examples
    --------
    >>> standard = PseudoPrior(
    ...     lambda rng, j: rng.standard_normal(), lambda j, x: -0.5 * x * x - 0.9189385332
    ... )
    >>> proposal = BirthDeathProposal(3, standard)
    >>> q = np.array([1.0, 0.0, 0.0, 0.5, 0.0, 0.0])
    >>> q_new, log_ratio = proposal(np.random.default_rng(0), q, 1.0)
    >>> q_new[:3].sum() in (0.0, 1.0, 2.0)
    True
    """

    def __init__(
        self,
        n_features: int,
        pseudo_prior: PseudoPrior,
        birth_sd: float = BIRTH_SD,
        update_sd: float = UPDATE_SD,
        move_probabilities: tuple[float, float, float] = MOVE_PROBABILITIES,
    ) -> None:
        self.n_features = int(n_features)
        if self.n_features < 1:
            raise ValueError(f"n_features must be at least 1, got {n_features!r}.")
        for name, value in (("birth_sd", birth_sd), ("update_sd", update_sd)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}.")
        probabilities = np.asarray(move_probabilities, dtype=float)
        if (
            probabilities.shape != (3,)
            or not np.all(np.isfinite(probabilities))
            or probabilities[0] < 0
            or np.any(probabilities[1:] <= 0)
        ):
            raise ValueError(
                "move_probabilities must be three numbers (update, birth, death): birth and "
                f"death positive, update positive or 0; got {move_probabilities!r}."
            )
        self.pseudo_prior = pseudo_prior
        self.birth_sd = float(birth_sd)
        self.update_sd = float(update_sd)
        self.move_probabilities = probabilities / probabilities.sum()
        self.last_move = -1

    #: The moves ignore the step's ``scaling``: the step tunes nothing (``kernels/user_proposal``).
    uses_scaling = False

    def __call__(
        self, rng: np.random.Generator, q: np.ndarray, scaling: float
    ) -> tuple[np.ndarray, float]:
        """Return ``q'`` and ``log q(q | q') - log q(q' | q)``; ``scaling`` is not used."""
        d = self.n_features
        included = q[:d] > 0.5
        k = int(included.sum())
        choice = self._choose(rng, k)
        q_new = np.array(q, dtype=np.float64, copy=True)
        if choice.move == "update":
            j = int(rng.choice(np.flatnonzero(included)))
            q_new[d + j] += self.update_sd * rng.standard_normal()
            return q_new, 0.0
        if choice.move == "birth":
            j = int(rng.choice(np.flatnonzero(~included)))
            q_new[j] = 1.0
            q_new[d + j] = self.birth_sd * rng.standard_normal()
            forward = -math.log(d - k) + self._log_birth_density(q_new[d + j])
            reverse = -math.log(k + 1) + self.pseudo_prior.log_density(j, q[d + j])
        else:
            j = int(rng.choice(np.flatnonzero(included)))
            q_new[j] = 0.0
            q_new[d + j] = self.pseudo_prior.draw(rng, j)
            forward = -math.log(k) + self.pseudo_prior.log_density(j, q_new[d + j])
            reverse = -math.log(d - k + 1) + self._log_birth_density(q[d + j])
        log_ratio = choice.log_reverse_probability + reverse - choice.log_probability - forward
        return q_new, log_ratio

    def _possible(self, k: int) -> np.ndarray:
        return np.array([k >= 1, k < self.n_features, k >= 1])

    def _probabilities(self, k: int) -> np.ndarray:
        weights = np.where(self._possible(k), self.move_probabilities, 0.0)
        return weights / weights.sum()

    def _choose(self, rng: np.random.Generator, k: int) -> MoveChoice:
        probabilities = self._probabilities(k)
        index = int(rng.choice(3, p=probabilities))
        self.last_move = index
        move = MOVES[index]
        if move == "update":
            return MoveChoice(move, 0.0, 0.0)
        # The reverse of a birth at k is a death at k + 1, of a death at k a birth at k - 1.
        reverse_k, reverse_index = (k + 1, 2) if move == "birth" else (k - 1, 1)
        return MoveChoice(
            move,
            math.log(probabilities[index]),
            math.log(self._probabilities(reverse_k)[reverse_index]),
        )

    def _log_birth_density(self, value: float) -> float:
        z = value / self.birth_sd
        return -0.5 * z * z - math.log(self.birth_sd) - 0.5 * math.log(2 * math.pi)
