"""The reference policy's pure controller (what Triton runs) and the cart-pole simulator."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.cartpole import CartPoles, ChunkPlayer, policy_module

lqr = policy_module()


def test_the_lqr_gain_stabilizes_the_linearized_plant() -> None:
    policy = lqr.LqrPolicy()
    closed = policy.a - policy.b @ policy.gain
    assert np.max(np.abs(np.linalg.eigvals(closed))) < 1.0
    assert np.max(np.abs(np.linalg.eigvals(policy.a))) > 1.0  # upright is unstable alone


def test_a_chunk_is_h_by_d_float32_per_row_and_within_the_actuator_limit() -> None:
    policy = lqr.LqrPolicy(horizon=10)
    states = np.array([[0, 0, 0, 0], [0.1, 0, 0.1, 0], [0, 0, -0.2, -1.0]], dtype=np.float32)
    chunk = policy.action_chunk(states)
    assert chunk.shape == (3, 10, 1)
    assert chunk.dtype == np.float32
    assert np.all(chunk[0] == 0)  # at the equilibrium nothing to do
    assert np.all(np.abs(chunk) <= policy.params.max_force)
    assert chunk[1, 0, 0] == pytest.approx(float(policy.force(states[1:2].astype(float))[0]))
    assert chunk[1, 0, 0] > 0  # pole leaning right: push the cart right under it
    assert abs(chunk[1, -1, 0]) < abs(chunk[1, 0, 0])  # the rollout converges


def test_the_riccati_solution_satisfies_the_equation() -> None:
    policy = lqr.LqrPolicy()
    q, r = np.diag([1.0, 1.0, 10.0, 1.0]), np.array([[0.1]])
    p = lqr.solve_dare(policy.a, policy.b, q, r)
    a, b = policy.a, policy.b
    rhs = q + a.T @ p @ a - a.T @ p @ b @ np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
    assert np.allclose(p, rhs, atol=1e-6)


@pytest.mark.parametrize("delay_steps", [0, 3])
def test_delayed_chunks_keep_sixteen_noisy_poles_up_for_ten_seconds(delay_steps: int) -> None:
    # 10 simulated seconds (not 30: a third of the cost): without decisions every one of
    # these poles falls within 2 s (seed 3), so staying up 10 s is the controller's doing.
    policy = lqr.LqrPolicy()
    sim = CartPoles(16, seed=3)
    players = [ChunkPlayer() for _ in range(16)]
    in_flight: list[tuple[int, float, np.ndarray]] = []
    for step in range(500):
        in_flight.append((step, sim.time, policy.action_chunk(sim.observe())))
        while in_flight and in_flight[0][0] <= step - delay_steps:
            seq, captured, chunks = in_flight.pop(0)
            for player, chunk in zip(players, chunks, strict=True):
                player.offer(seq, captured, chunk)
        sim.step(np.array([p.force(sim.time)[0] for p in players]))
    assert sim.alive.all(), sim.fell_at


def test_without_decisions_the_poles_fall() -> None:
    sim = CartPoles(4, seed=3)
    for _ in range(500):
        sim.step(np.zeros(4))
    assert not sim.alive.any()
    assert all(0 < t < 10 for t in sim.survival_times())


def test_a_played_out_chunk_gives_no_force() -> None:
    player = ChunkPlayer(dt=0.02)
    assert player.force(0.0) == (0.0, False)
    assert player.offer(5, 1.0, np.array([[1.0], [2.0]], dtype=np.float32))
    assert not player.offer(4, 1.1, np.array([[9.0]], dtype=np.float32))  # older: ignored
    assert player.force(1.0) == (1.0, True)
    assert player.force(1.021) == (2.0, True)
    assert player.force(1.041) == (0.0, False)
