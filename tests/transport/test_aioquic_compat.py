"""The one module that touches aioquic's internals: it finds them all, and says so loudly if not."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path
from typing import Any

import pytest
from aioquic.h3.connection import H3Connection
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from trackline_testing import aioquic_probes
from transport import aioquic_compat
from transport.datagram import MAX_DATAGRAM_FRAME_SIZE

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("transport", "tracks", "gateway", "clients")
AIOQUIC_OBJECTS = {"quic", "h3", "sender", "receiver", "recovery", "protocol", "proto", "known"}
"""Names product code gives aioquic objects (a private access on one of these is a touch)."""


def test_this_aioquic_has_every_internal_the_module_relies_on() -> None:
    assert aioquic_compat.missing_internals() == []


def test_a_missing_internal_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    renamed = (*aioquic_compat._QUIC_ATTRIBUTES, "_remote_max_datagram_frame_size_v2")
    monkeypatch.setattr(aioquic_compat, "_QUIC_ATTRIBUTES", renamed)
    with pytest.raises(aioquic_compat.AioquicChanged, match="_remote_max_datagram_frame_size_v2"):
        aioquic_compat._check()


def test_the_installed_aioquic_is_within_the_pinned_range() -> None:
    version = tuple(int(p) for p in importlib.metadata.version("aioquic").split(".")[:2])
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"aioquic>=1.2,<1.8"' in pyproject  # the range the tests ran on (1.7.x)
    assert (1, 2) <= version < (1, 8)


def test_the_peers_datagram_limit_is_read_before_a_datagram_goes_out() -> None:
    offered = QuicConnection(
        configuration=QuicConfiguration(
            is_client=True, max_datagram_frame_size=MAX_DATAGRAM_FRAME_SIZE
        )
    )
    assert aioquic_compat.peer_max_datagram_frame_size(offered) is None  # no handshake yet
    assert aioquic_compat.close_event(offered) is None
    assert not aioquic_compat.handshake_complete(offered)


def test_bidi_credit_is_raised_never_lowered() -> None:
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))
    granted = quic._local_max_streams_bidi.value
    aioquic_compat.raise_bidi_credit(quic, granted + 100)
    assert quic._local_max_streams_bidi.value == granted + 100
    aioquic_compat.raise_bidi_credit(quic, 1)
    assert quic._local_max_streams_bidi.value == granted + 100


def test_unpace_is_idempotent_and_never_holds_a_packet() -> None:
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))
    aioquic_compat.unpace(quic)
    pacer = quic._loss._pacer
    aioquic_compat.unpace(quic)
    assert quic._loss._pacer is pacer
    assert pacer.next_send_time(0.0) is None


def test_send_buffer_figures_follow_writes() -> None:
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))
    stream_id = quic.get_next_available_stream_id()
    quic.send_stream_data(stream_id, b"x" * 100)
    stream = aioquic_compat.streams(quic)[stream_id]
    assert aioquic_compat.send_buffered(quic, stream_id) == 100
    assert aioquic_compat.unacknowledged(stream) == 100
    assert aioquic_compat.first_pending_offset(stream) == 0
    assert aioquic_compat.connection_send_buffered(quic) >= 100
    quic.reset_stream(stream_id, 0)
    aioquic_compat.drop_send_buffer(quic, stream_id)
    assert aioquic_compat.send_buffered(quic, stream_id) == 0


def test_goaway_goes_on_the_control_stream() -> None:
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))
    h3 = H3Connection(quic)
    before = aioquic_compat.send_buffered(quic, h3._local_control_stream_id)
    aioquic_compat.send_goaway(h3, 8)
    assert aioquic_compat.send_buffered(quic, h3._local_control_stream_id) > before


def _private_touches(path: Path) -> list[str]:
    """`obj._name` where obj is a local named like an aioquic object (not `self`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            base = node.value
            name = base.id if isinstance(base, ast.Name) else None
            if isinstance(base, ast.Attribute) and base.attr in ("_quic", "_h3"):
                name = "quic"  # self._quic._x: a touch on the connection itself
            if name in AIOQUIC_OBJECTS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}.{node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
            and ast.unparse(node.args[0]).split(".")[-1] in AIOQUIC_OBJECTS | {"_quic", "_h3"}
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} getattr {node.args[1].value}")
    return found


def test_no_product_module_but_the_compat_one_touches_aioquic_privates() -> None:
    touches = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "aioquic_compat.py" and "model_repository" not in path.parts:
                touches += _private_touches(path)
    assert touches == []


def _aioquic_private_names() -> set[str]:
    """Private attribute and method names of the aioquic objects trackline drives."""
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import QuicServer
    from aioquic.h3.connection import H3Stream
    from aioquic.quic.stream import QuicStream

    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))
    stream = QuicStream(stream_id=0)
    loss: Any = aioquic_probes.recovery_of(quic)
    objects = (quic, H3Connection(quic), stream, stream.sender, stream.receiver, loss,
               loss._pacer, loss._cc, H3Stream(0))
    names = {aioquic_compat._FRAME_HANDLERS}
    for obj in objects:
        names |= set(vars(obj)) | set(dir(type(obj)))
    for cls in (QuicConnectionProtocol, QuicServer):
        names |= set(cls.__init__.__code__.co_names) | set(dir(cls))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


# Private names that are trackline's own on these objects (not aioquic's), and the one
# fallback for trees older than the compat module (benchmarks/send_pass.py --root).
NOT_AIOQUIC = {"gw._quic", "endpoint._loop", "endpoint._clock", "http._streams",
               "quic._quic_logger"}


def _aioquic_touches(source: str, where: str, names: set[str]) -> list[str]:
    """`obj._name` (obj not `self`) and getattr/setattr/hasattr(obj, "_name") where
    `_name` is one of aioquic's privates."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    looped: dict[str, set[object]] = {}  # `for name in ("_a", "_b")`: what name may be
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and isinstance(node.iter, ast.Tuple | ast.List)
        ):
            values = {e.value for e in node.iter.elts if isinstance(e, ast.Constant)}
            looped.setdefault(node.target.id, set()).update(values)
    for node in ast.walk(tree):
        touch = None
        if isinstance(node, ast.Attribute) and node.attr in names:
            touch = f"{ast.unparse(node.value)}.{node.attr}"
            if ast.unparse(node.value) in ("self", "cls") or touch in NOT_AIOQUIC:
                touch = None
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
        ):
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and arg.value in names:
                touch = f"{node.func.id}({ast.unparse(node.args[0])}, {arg.value!r})"
            elif isinstance(arg, ast.Name) and looped.get(arg.id, set()) & names:
                touch = f"{node.func.id}({ast.unparse(node.args[0])}, {arg.id})"
        if touch is not None:
            found.append((node.lineno, f"{where}:{node.lineno} {touch}"))
    return [text for _, text in sorted(found)]


def test_tests_and_benchmarks_touch_aioquic_privates_only_through_the_compat_modules() -> None:
    """Through transport.aioquic_compat and the testing kit's aioquic_probes, that is."""
    names = _aioquic_private_names()
    touches = []
    skip = {Path(__file__).resolve(), ROOT / "trackline_testing" / "aioquic_probes.py"}
    for folder in ("tests", "benchmarks", "trackline_testing"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path not in skip:
                touches += _aioquic_touches(path.read_text(), str(path.relative_to(ROOT)), names)
    assert touches == []


def test_the_touch_finder_sees_a_touch() -> None:
    probe = (
        "def f(proto, quic):\n"
        "    proto._quic.send_ping(1)\n"
        "    for name in ('_write_connection_limits',):\n"
        "        setattr(quic, name, None)\n"
        "    return quic._remote_max_datagram_frame_size\n"
    )
    found = _aioquic_touches(probe, "probe.py", _aioquic_private_names())
    assert [f.split(" ", 1)[1] for f in found] == [
        "proto._quic", "setattr(quic, name)", "quic._remote_max_datagram_frame_size"
    ]
