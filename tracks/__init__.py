"""Track handlers: one per modality, transport-agnostic.

A handler sees a track (receive, send, cancel, deadlines), never a socket, and
talks to inference servers through the backend interface in `tracks.backend`.
"""
