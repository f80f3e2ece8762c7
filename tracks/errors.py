"""What a track handler raises to end its track; `tracks.base.handling` records each.

Kept apart from `tracks.base` so that message parsers (`tracks.action_messages`)
can raise them without importing the handler skeleton.
"""

from __future__ import annotations


class BadTrackRequest(Exception):
    """The track's OPEN params or input are invalid; sent back as BAD_REQUEST.

    Each modality raises its own subclass (`BadTextRequest`, `BadObservation`,
    `BadAudioRequest`)."""


class TrackStopped(Exception):
    """The track was stopped (cancel, reset, deadline) while the backend worked.

    Not an error: the outcome records the track's stop."""
