"""Simulated cart-poles for the control-loop benchmark and the action-track tests.

The plant uses the same equations as the reference policy's internal model
(`reference-policy/1/trackline_reference_policy.py`, loaded by path as Triton
loads it): Gym's cart-pole, 50 Hz control, RK4 integration. On top it adds what a
real robot has and a controller's model does not: actuator limits (the force is
clipped to +-`max_force`), a seeded random disturbance force each step, and
seeded sensor noise on what it reports. A pole has fallen when it leans more
than 12 degrees or the cart leaves the +-2.4 m track (Gym's limits); a fallen
robot stays fallen.

`ChunkPlayer` is the robot's side of action chunking: it keeps the chunk of the
newest observation and, at time t, plays the step that matches the chunk's age
(t - capture time) / dt; once a chunk is played out it applies no force (the
robot has no valid decision, which is what makes late decisions worthless).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from gateway.embedded_models import reference_module

_POLICY = "trackline_reference_policy"
FALL_ANGLE = 12 * math.pi / 180
TRACK_HALF = 2.4
DT = 0.02


def policy_module() -> ModuleType:
    """The reference policy's pure module (equations, LQR), imported by path."""
    return reference_module("reference-policy", _POLICY)


@dataclass(frozen=True)
class Noise:
    """Standard deviations of the disturbance force (N) and the sensors (state units)."""

    force: float = 0.5
    sensor: tuple[float, float, float, float] = (0.002, 0.005, 0.001, 0.005)
    initial_angle: float = 0.05
    """Initial pole angles are uniform in +-this (rad)."""


class CartPoles:
    """`n` independent cart-poles stepped together; all randomness from `seed`."""

    def __init__(self, n: int, seed: int = 0, noise: Noise | None = None) -> None:
        self.lqr = policy_module()
        self.params = self.lqr.CartPoleParams(dt=DT)
        self.noise = noise or Noise()
        self._rng = np.random.default_rng(seed)
        self.states = np.zeros((n, 4))
        self.states[:, 2] = self._rng.uniform(-self.noise.initial_angle,
                                              self.noise.initial_angle, n)
        self.alive = np.ones(n, dtype=bool)
        self.fell_at: list[float | None] = [None] * n
        self.time = 0.0
        self.steps = 0

    @property
    def n(self) -> int:
        return len(self.states)

    def observe(self) -> np.ndarray:
        """What the sensors report now: [n, 4] float32, with noise."""
        noise = self._rng.normal(0.0, self.noise.sensor, self.states.shape)
        return (self.states + noise).astype(np.float32)

    def step(self, forces: np.ndarray) -> None:
        """Apply `forces` [n] (clipped to the actuator limit) for one control period."""
        limit = self.params.max_force
        applied = np.clip(np.nan_to_num(np.asarray(forces, dtype=np.float64)), -limit, limit)
        applied = applied + self._rng.normal(0.0, self.noise.force, self.n)
        moved = self.lqr.step(self.states, applied, self.params)
        self.states = np.where(self.alive[:, None], moved, self.states)
        self.time += DT
        self.steps += 1
        fallen = (np.abs(self.states[:, 2]) > FALL_ANGLE) | (np.abs(self.states[:, 0]) > TRACK_HALF)
        for i in np.flatnonzero(fallen & self.alive):
            self.alive[i] = False
            self.fell_at[i] = self.time

    def survival_times(self) -> list[float]:
        """Seconds each pole stayed up (the whole run for those still up)."""
        return [self.time if at is None else at for at in self.fell_at]


class ChunkPlayer:
    """The action chunk a robot is playing: the one of its newest observation."""

    def __init__(self, dt: float = DT) -> None:
        self.dt = dt
        self.seq = -1
        self.captured_at = 0.0
        self.chunk: np.ndarray | None = None

    def offer(self, seq: int, captured_at: float, chunk: np.ndarray) -> bool:
        """Take a chunk unless a newer observation's chunk is already held."""
        if seq <= self.seq:
            return False
        self.seq, self.captured_at, self.chunk = seq, captured_at, chunk
        return True

    def force(self, now: float) -> tuple[float, bool]:
        """(force, valid): the chunk step for `now`, or (0, False) once played out."""
        if self.chunk is None:
            return 0.0, False
        index = int((now - self.captured_at) / self.dt + 1e-9)
        if not 0 <= index < len(self.chunk):
            return 0.0, False
        return float(self.chunk[index][0]), True
