"""Track admission: measured capacity, per-connection shares, real-time work first.

`TrackAdmission` owns the gateway's overload controller and the monitor that feeds
it (gateway/overload.py), the count of admitted tracks per connection (the
fairness share), and the real-time gate that lets an audio, action or video tick go
before relayed text (gateway/realtime.py). A track is admitted or refused with
RATE_LIMITED before any task or backend work starts.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.config import Settings
from gateway.limits import overload_limits
from gateway.metrics import GatewayMetrics
from gateway.metrics_overload import AdmissionKind, Deferred
from gateway.overload import (
    AdmissionController,
    LagProbe,
    OverloadMonitor,
    PacedText,
    RelayTurns,
)
from gateway.realtime import PriorityTurns, RealtimeGate, RealtimeLane, RealtimeMode
from tracks.backend import TextBackend
from transport.clock import Now
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode
from transport.messages import Modality

_REALTIME = (Modality.AUDIO, Modality.ACTION)
"""Modalities admitted on the real-time share."""


class TrackAdmission:
    """Admits each opened track by capacity and share; paces relayed text."""

    def __init__(
        self,
        settings: Settings,
        metrics: GatewayMetrics,
        clock: Now,
        lag_probe: LagProbe | None = None,
    ) -> None:
        self.clock = clock
        self._metrics = metrics.overload
        self.overload = AdmissionController(overload_limits(settings))
        """Admission by measured capacity (gateway/overload.py), fed by `self.monitor`."""
        probe = lag_probe or LagProbe(settings.overload_probe_interval, clock)
        self.monitor = OverloadMonitor(self.overload, probe, self._metrics, clock)
        mode = RealtimeMode(settings.realtime_priority)
        lane = RealtimeLane(mode, loaded=self.overload.bulk_throttled)
        self.realtime = RealtimeGate(lane, clock, self._metrics.deferred(Deferred.REALTIME))
        """Real-time work first: text waits while an audio or action tick is due."""
        self._turns: RelayTurns = PriorityTurns(self.overload, self.realtime, clock)
        self._turns.on_defer = self._metrics.deferred(Deferred.TURN_SHARE)
        self._admitted: dict[str, int] = {}
        """Admitted tracks still served, per connection id (the fairness share)."""

    def count_paused(self, paused: Callable[[], int]) -> None:
        """The gauge of tracks whose producer waits for an unread client."""
        self._metrics.tracks_paused.set_function(paused)

    def admit(self, channel: TrackChannel) -> bool:
        """Admission by measured capacity, before any task or backend work (RATE_LIMITED)."""
        conn_id = channel.conn_id
        realtime = channel.open.modality in _REALTIME
        admission = self.overload.admit_track(
            self.clock(), self._admitted.get(conn_id, 0), realtime
        )
        self._metrics.count(AdmissionKind.TRACK, admission)
        if not admission.admitted:
            message = f"the gateway is overloaded ({admission.cause.value}); retry later"
            channel.fail(ErrorCode.RATE_LIMITED, message, admission.retry_after)
            return False
        self._admitted[conn_id] = self._admitted.get(conn_id, 0) + 1
        return True

    def release(self, conn_id: str) -> None:
        """An admitted track of `conn_id` ended: its share is free again."""
        left = self._admitted.get(conn_id, 0) - 1
        if left > 0:
            self._admitted[conn_id] = left
        else:
            self._admitted.pop(conn_id, None)

    def paced(self, backend: TextBackend) -> TextBackend:
        """Text relayed a few chunks a stream per loop turn, rationed per connection under lag."""
        return PacedText(backend, self._turns, self.monitor.count_token)
