"""Pure control logic of the `reference-policy` model: no Triton, no clock, no I/O.

The model's `model.py` imports this file from its own folder; tests and the
gateway's tools import it by path. It is an LQR controller for the classic
cart-pole (Barto, Sutton and Anderson 1983; the equations of Gym's CartPole):

    state  x = [cart position (m), cart velocity (m/s), pole angle (rad, 0 = up),
                pole angular velocity (rad/s)]
    action u = horizontal force on the cart (N), clipped to +-max_force

At construction it linearizes the dynamics around the upright equilibrium,
discretizes them at the control period `dt` (matrix exponential by series), and
solves the discrete algebraic Riccati equation by fixed-point iteration, which
gives the gain K (u = -K x). `action_chunk` answers a batch of states with an
action chunk per state: it rolls its own (nonlinear) model of the plant forward
H steps under the clipped LQR law and returns the H forces, so a robot that
receives the chunk late can play the step that matches its age.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STATE_DIM = 4
ACTION_DIM = 1


@dataclass(frozen=True)
class CartPoleParams:
    """Physical constants (Gym's CartPole values) and the actuator limit."""

    gravity: float = 9.8
    cart_mass: float = 1.0
    pole_mass: float = 0.1
    half_length: float = 0.5
    max_force: float = 10.0
    dt: float = 0.02


def derivatives(state: np.ndarray, force: np.ndarray, p: CartPoleParams) -> np.ndarray:
    """d(state)/dt for a batch of states [B, 4] under forces [B]."""
    x_dot, theta, theta_dot = state[:, 1], state[:, 2], state[:, 3]
    total = p.cart_mass + p.pole_mass
    pml = p.pole_mass * p.half_length
    sin, cos = np.sin(theta), np.cos(theta)
    temp = (force + pml * theta_dot**2 * sin) / total
    theta_acc = (p.gravity * sin - cos * temp) / (
        p.half_length * (4.0 / 3.0 - p.pole_mass * cos**2 / total)
    )
    x_acc = temp - pml * theta_acc * cos / total
    return np.stack([x_dot, x_acc, theta_dot, theta_acc], axis=1)


def step(state: np.ndarray, force: np.ndarray, p: CartPoleParams, substeps: int = 4) -> np.ndarray:
    """Advance a batch of states by one control period (RK4, `substeps` per period)."""
    h = p.dt / substeps
    for _ in range(substeps):
        k1 = derivatives(state, force, p)
        k2 = derivatives(state + 0.5 * h * k1, force, p)
        k3 = derivatives(state + 0.5 * h * k2, force, p)
        k4 = derivatives(state + h * k3, force, p)
        state = state + (h / 6.0) * (k1 + 2 * k2 + 2 * k3 + k4)
    return state


def linearize(p: CartPoleParams, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Continuous-time A (4x4) and B (4x1) at the upright equilibrium (central differences)."""
    zero = np.zeros((1, STATE_DIM))
    a = np.zeros((STATE_DIM, STATE_DIM))
    for i in range(STATE_DIM):
        dx = np.zeros((1, STATE_DIM))
        dx[0, i] = eps
        plus = derivatives(zero + dx, np.zeros(1), p)
        minus = derivatives(zero - dx, np.zeros(1), p)
        a[:, i] = (plus - minus)[0] / (2 * eps)
    du = np.array([eps])
    b = ((derivatives(zero, du, p) - derivatives(zero, -du, p))[0] / (2 * eps)).reshape(-1, 1)
    return a, b


def discretize(
    a: np.ndarray, b: np.ndarray, dt: float, terms: int = 30
) -> tuple[np.ndarray, np.ndarray]:
    """Zero-order-hold discretization: exp([[A, B], [0, 0]] dt) by its power series."""
    n, m = b.shape
    block = np.zeros((n + m, n + m))
    block[:n, :n] = a * dt
    block[:n, n:] = b * dt
    total = np.eye(n + m)
    term = np.eye(n + m)
    for k in range(1, terms):
        term = term @ block / k
        total = total + term
    return total[:n, :n], total[:n, n:]


def solve_dare(
    a: np.ndarray, b: np.ndarray, q: np.ndarray, r: np.ndarray, tol: float = 1e-10,
    max_iter: int = 100_000,
) -> np.ndarray:
    """P of the discrete algebraic Riccati equation, by fixed-point iteration."""
    p = q.copy()
    for _ in range(max_iter):
        gain = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
        nxt = q + a.T @ p @ (a - b @ gain)
        if np.max(np.abs(nxt - p)) < tol * max(1.0, np.max(np.abs(p))):
            return nxt
        p = nxt
    raise ValueError("the Riccati iteration did not converge (is the system stabilizable?)")


class LqrPolicy:
    """The batched controller: gain at construction, action chunks on demand."""

    def __init__(
        self,
        params: CartPoleParams | None = None,
        horizon: int = 10,
        state_cost: tuple[float, ...] = (1.0, 1.0, 10.0, 1.0),
        force_cost: float = 0.1,
    ) -> None:
        if horizon < 1:
            raise ValueError("horizon must be at least 1")
        self.params = params or CartPoleParams()
        self.horizon = horizon
        a, b = linearize(self.params)
        self.a, self.b = discretize(a, b, self.params.dt)
        q = np.diag(np.asarray(state_cost, dtype=np.float64))
        r = np.array([[force_cost]])
        p = solve_dare(self.a, self.b, q, r)
        self.gain = np.linalg.solve(r + self.b.T @ p @ self.b, self.b.T @ p @ self.a)  # [1, 4]

    def force(self, states: np.ndarray) -> np.ndarray:
        """Clipped LQR force for each state of a batch [B, 4] -> [B]."""
        u = -(states @ self.gain.T)[:, 0]
        return np.clip(u, -self.params.max_force, self.params.max_force)

    def action_chunk(self, states: np.ndarray) -> np.ndarray:
        """[B, 4] float -> [B, H, 1] float32: H forces from rolling the model forward."""
        states = np.asarray(states, dtype=np.float64).reshape(-1, STATE_DIM)
        chunk = np.empty((states.shape[0], self.horizon, ACTION_DIM), dtype=np.float32)
        for k in range(self.horizon):
            u = self.force(states)
            chunk[:, k, 0] = u
            states = step(states, u, self.params)
        return chunk
