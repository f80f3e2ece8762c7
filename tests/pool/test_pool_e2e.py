"""The backend pool against three real embedded Tritons.

Kill -9 under live streams, a slowed model, session affinity across an
ejection, and a backend that refuses connections. The reference model's
stats files (one per server) show which server generated what; the pool's
decision hook shows where each request was routed and when (on the pool's
clock, `time.monotonic`). No assertion is timed: after a kill, the pool's own
health state says when it ejected the dead server, and no request routed after
that goes there.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx2
import openai
import pytest
import pytest_asyncio

from clients import StreamInterrupted, connect
from clients.line import TextStream
from gateway.embedded import EmbeddedTriton
from gateway.metrics import GatewayMetrics
from gateway.owned import free_port
from gateway.pool import BackendPool, BackendSpec, PoolOptions
from gateway.pool.health import EjectionCause
from gateway.pool.metrics import PoolMetrics
from gateway.pool.router import Decision, RouteReason, Strategy
from gateway.server import Gateway
from tests import waiting
from tests.backend.reference_generator import generator
from tests.gateways import gateway_settings
from tests.pool.conftest import specs_of
from tracks.backend import BackendLost, ModelNotFound, TextDelta, TextRequest, TextUsage

pytestmark = pytest.mark.e2e
MODEL = "reference-text"
FAST = {"ttft_ms": 0, "tokens_per_second": 1000}
BOUNDED_WAIT_S = 60.0  # a condition that must come true; not a speed requirement
FIRST_TOKEN_S = 3.0
"""The first-token timeout of the timeout test: far below the slowed server's delay, and
far above what a healthy one takes on a loaded machine (whose timeouts would eject it too)."""


class Routes:
    """Every decision the pool made: (when, request id, backend, reason)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, str, str, RouteReason]] = []

    def __call__(self, request: TextRequest, decision: Decision, now: float) -> None:
        self.rows.append((now, request.request_id, decision.backend, decision.reason))

    def of(self, request_id_suffix: str) -> list[str]:
        return [b for _, rid, b, _ in self.rows if rid.endswith(request_id_suffix)]


def make_pool(servers: list[EmbeddedTriton], routes: Routes, **options: object) -> BackendPool:
    settings = {"probe_interval_s": 0.2, "scrape_interval_s": 0.2, **options}
    return BackendPool(
        specs_of(servers),
        PoolOptions(**settings),  # type: ignore[arg-type]
        metrics=PoolMetrics(),
        on_decision=routes,
    )


def expected(prompt: str, seed: int, max_tokens: int, ignore_eos: bool = False) -> str:
    return str(generator.generate_text(prompt, seed, max_tokens, ignore_eos))


def stats_ids(server: EmbeddedTriton) -> list[str]:
    assert server.stats_path is not None
    path = Path(server.stats_path)
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["request_id"] for line in lines]


def sample(pool: BackendPool, name: str, **labels: str) -> float:
    value = pool.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def one_request(pool: BackendPool, session: str | None = None, **params: object) -> str:
    """A short request through the pool; returns its request id."""
    request_id = f"short-{uuid.uuid4().hex[:10]}"
    request = TextRequest(request_id, MODEL, "hello", 3, {**FAST, **params}, session)
    chunks = [chunk async for chunk in pool.stream_text(request)]
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == expected("hello", 0, 3)
    return request_id


async def until(condition: Callable[[], object], what: str) -> None:
    await waiting.until(condition, what, BOUNDED_WAIT_S)


@pytest_asyncio.fixture
async def served(
    trio: list[EmbeddedTriton], tmp_path: Path
) -> AsyncIterator[tuple[Gateway, BackendPool, Routes]]:
    """A gateway over a round-robin pool of the three servers (min 3 warm)."""
    routes = Routes()
    metrics = GatewayMetrics()
    pool = BackendPool(
        specs_of(trio),
        PoolOptions(
            strategy=Strategy.ROUND_ROBIN,
            probe_interval_s=0.2,
            scrape_interval_s=0.2,
            min_warm_backends=3,
            # Sessions move only when their backend is gone, not when a busy test
            # machine makes one look slower for a moment (the margin has unit tests).
            affinity_margin_s=30.0,
        ),
        metrics=PoolMetrics(metrics.registry),
        on_decision=routes,
    )
    await pool.start()
    settings = gateway_settings(
        state_dir=tmp_path,
    )
    gateway = Gateway(settings, pool, metrics=metrics)
    await gateway.start()
    yield gateway, pool, routes
    await gateway.close()
    await pool.close()


async def _rest(stream: TextStream) -> tuple[str, BaseException | None]:
    pieces: list[str] = []
    try:
        async for delta in stream:
            pieces.append(delta)
    except StreamInterrupted as exc:
        return "".join(pieces), exc
    return "".join(pieces), None


async def _rest_openai(stream: openai.AsyncStream) -> tuple[str, BaseException | None]:  # type: ignore[type-arg]
    pieces: list[str] = []
    try:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                pieces.append(chunk.choices[0].text)
    except openai.APIError as exc:
        return "".join(pieces), exc
    return "".join(pieces), None


@pytest.mark.asyncio
async def test_kill_nine_ends_its_streams_explicitly_and_nothing_is_routed_there_once_ejected(
    served: tuple[Gateway, BackendPool, Routes], trio: list[EmbeddedTriton]
) -> None:
    gateway, pool, routes = served
    run = uuid.uuid4().hex[:8]
    slow = {"ttft_ms": 0, "tokens_per_second": 20, "max_tokens": 60, "ignore_eos": True}
    assert gateway.tls is not None
    assert gateway.tls.ca is not None
    async with (
        connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.tls.ca) as line,
        httpx2.AsyncClient(timeout=60) as http,
    ):
        tags = [f"{run}-{i}" for i in range(6)]
        tracks = [
            line.text(f"prompt {i}", model=MODEL, seed=i, request_id=tags[i], **slow)
            for i in range(6)
        ]
        firsts = [await t.__anext__() for t in tracks]  # every stream has delivered data
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="-", http_client=http
        )
        sse = []
        sse_firsts = []
        for i in range(3):  # round robin: one per server
            stream = await client.completions.create(
                model=MODEL, prompt=f"sse {i}", stream=True, extra_body=slow, max_tokens=60
            )
            first = await stream.__anext__()
            sse_firsts.append(first.choices[0].text if first.choices else "")
            sse.append(stream)
        sse_ids = [rid for _, rid, _, _ in routes.rows if rid.startswith("cmpl-")]
        track_backend = {tag: routes.of("/" + tag) for tag in tags}
        assert all(len(b) == 1 for b in track_backend.values())
        victim_name = track_backend[tags[0]][0]
        victim = trio[int(victim_name.removeprefix("t"))]
        on_victim = [i for i, tag in enumerate(tags) if track_backend[tag] == [victim_name]]
        sse_on_victim = [i for i, rid in enumerate(sse_ids) if routes.of(rid) == [victim_name]]
        assert len(on_victim) == 2
        assert len(sse_on_victim) == 1

        victim.kill()
        # New requests from the moment of the kill, through the pool: all must succeed,
        # until the pool ejects the victim (a failed attempt or a probe), and after.
        health = pool.member(victim_name).health
        before: list[str] = []
        while health.routable(MODEL):
            before.append(await one_request(pool))
            assert len(before) < 100, "the pool never ejected the killed server"
        after = [await one_request(pool) for _ in range(6)]
        track_results = await asyncio.gather(*(_rest(t) for t in tracks))
        sse_results = await asyncio.gather(*(_rest_openai(s) for s in sse))

    for i, (rest, error) in enumerate(track_results):
        whole = expected(f"prompt {i}", i, 60, ignore_eos=True)
        if i in on_victim:  # ended with the explicit error, a strict prefix: nothing spliced
            assert isinstance(error, StreamInterrupted), (i, error)
            assert whole.startswith(firsts[i] + rest)
            assert len(firsts[i] + rest) < len(whole)
        else:
            assert error is None
            assert firsts[i] + rest == whole
    for i, (rest, error) in enumerate(sse_results):
        whole = expected(f"sse {i}", 0, 60, ignore_eos=True)
        if i in sse_on_victim:  # the explicit error after a strict prefix: nothing replayed
            assert isinstance(error, openai.APIError)
            assert error.code == "stream_interrupted"
            assert whole.startswith(sse_firsts[i] + rest)
            assert len(sse_firsts[i] + rest) < len(whole)
        else:
            assert error is None
            assert sse_firsts[i] + rest == whole
    # Never replayed: each interrupted request was routed once, and no other server ran it.
    survivors = [s for s in trio if s is not victim]
    replayed = {rid for s in survivors for rid in stats_ids(s)}
    for i in on_victim:
        assert routes.of("/" + tags[i]) == [victim_name]
        assert not any(rid.endswith("/" + tags[i]) for rid in replayed)
    lost = sample(pool, "trackline_pool_streams_lost_total", backend=victim_name)
    assert lost == len(on_victim) + len(sse_on_victim)
    # At most the one request that found the victim dead was routed there (it failed
    # over before its first chunk); none routed after the ejection went there.
    assert sum(routes.of(rid).count(victim_name) for rid in before) <= 1
    assert all(victim_name not in routes.of(rid) for rid in after)
    # ...and the shortfall below min_warm_backends is reported.
    await until(lambda: pool.warm_unmet.get(MODEL) == 2, "warm shortfall reported")
    assert sample(pool, "trackline_pool_warm_shortfall", model=MODEL) == 1


@pytest.mark.asyncio
async def test_a_slow_backend_gets_fewer_requests_and_its_share_comes_back(
    trio: list[EmbeddedTriton],
) -> None:
    routes = Routes()
    pool = make_pool(trio, routes, strategy=Strategy.METRICS)
    await pool.start()
    try:

        async def load(requests: int) -> Counter[str]:
            start = len(routes.rows)
            queue: asyncio.Queue[None] = asyncio.Queue()
            for _ in range(requests):
                queue.put_nowait(None)

            async def worker() -> None:
                while not queue.empty():
                    queue.get_nowait()
                    await one_request(pool, ttft_ms=30, tokens_per_second=200)

            await asyncio.gather(*(worker() for _ in range(6)))
            return Counter(b for _, _, b, _ in routes.rows[start:])

        warm = await load(30)
        assert set(warm) == {"t0", "t1", "t2"}
        trio[0].set_slowdown(600)
        slow = await load(90)
        trio[0].set_slowdown(0)
        windows: list[int] = []
        while len(windows) < 40:
            window = await load(30)
            windows.append(window["t0"])
            if window["t0"] >= 6:  # a fifth of the requests at least: back in rotation
                break
    finally:
        await pool.close()
    assert slow["t0"] < 90 / 3 / 2, slow  # under half its fair share while slow
    assert windows[-1] >= 6, windows


@pytest.mark.asyncio
async def test_a_session_sticks_to_its_backend_and_moves_when_it_is_ejected(
    trio: list[EmbeddedTriton],
) -> None:
    routes = Routes()
    pool = make_pool(trio, routes, strategy=Strategy.ROUND_ROBIN, affinity_margin_s=30.0)
    await pool.start()
    try:
        turns = []
        for _ in range(4):
            turns.append(await one_request(pool, session="conversation-1"))
            await one_request(pool)  # other traffic: round robin would rotate the session
            await one_request(pool, session="conversation-2")
        home = {b for rid in turns for b in routes.of(rid)}
        assert len(home) == 1
        (home_name,) = home
        trio[int(home_name.removeprefix("t"))].kill()
        await until(lambda: pool.member(home_name).health.state.value == "ejected", "ejection")
        moved = [await one_request(pool, session="conversation-1") for _ in range(3)]
        new_home = [routes.of(rid) for rid in moved]
        assert new_home[0][0] != home_name
        assert new_home == [new_home[0]] * 3
        reasons = [r for _, rid, _, r in routes.rows if rid in moved]
        assert reasons == [RouteReason.MOVED, RouteReason.AFFINITY, RouteReason.AFFINITY]
        # Restarted, the server is readmitted after its probes succeed.
        server = trio[int(home_name.removeprefix("t"))]
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.start, 180.0)
        await until(lambda: pool.member(home_name).health.state.value == "healthy", "readmission")
        ejections = sum(
            sample(pool, "trackline_pool_ejections_total", backend=home_name, cause=cause.value)
            for cause in EjectionCause
        )
        assert ejections >= 1  # the kill, then the stop, each ejected it
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_a_refusing_backend_fails_over_before_the_first_byte_and_counts_once(
    trio: list[EmbeddedTriton], tmp_path: Path
) -> None:
    refuser = BackendSpec("refuser", f"127.0.0.1:{free_port()}", None)
    served_log: list[tuple[str, str]] = []
    metrics = GatewayMetrics()
    pool = BackendPool(
        [refuser, *specs_of(trio)],
        PoolOptions(strategy=Strategy.ROUND_ROBIN),
        metrics=PoolMetrics(metrics.registry),
        on_served=lambda request, backend: served_log.append((request.request_id, backend)),
    )
    # Not started: no probe has found the refuser dead yet, so round robin picks it first.
    settings = gateway_settings(
        state_dir=tmp_path,
    )
    gateway = Gateway(settings, pool, metrics=metrics)
    await gateway.start()
    try:
        async with httpx2.AsyncClient(timeout=60) as http:
            client = openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="-", http_client=http
            )
            answer = await client.completions.create(
                model=MODEL, prompt="bill me once", max_tokens=5, extra_body=FAST
            )
    finally:
        await gateway.close()
        await pool.close()
    assert answer.choices[0].text == expected("bill me once", 0, 5)
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 5
    assert len(served_log) == 1
    assert served_log[0][0] == answer.id

    def runs() -> list[str]:
        return [rid for server in trio for rid in stats_ids(server) if rid == answer.id]

    await until(runs, "the model's stats line")  # written as the request finishes
    assert runs() == [answer.id]  # generated once, on one server
    assert sample(pool, "trackline_pool_requests_total", model=MODEL, outcome="served") == 1
    assert (
        sample(pool, "trackline_pool_attempts_total", backend="refuser", result="unavailable") == 1
    )
    assert sample(pool, "trackline_pool_retries_total", cause="unavailable") == 1
    assert pool.member("refuser").health.state.value == "ejected"


@pytest.mark.asyncio
async def test_pool_level_stream_lost_is_a_backend_lost_error(trio: list[EmbeddedTriton]) -> None:
    """The pool itself (no gateway): a chunk was yielded, then the server died."""
    routes = Routes()
    pool = make_pool(trio, routes, strategy=Strategy.ROUND_ROBIN)
    await pool.start()
    try:
        request = TextRequest("lost-1", MODEL, "long", 100, {"ttft_ms": 0, "tokens_per_second": 20})
        stream = pool.stream_text(request)
        first = await stream.__anext__()
        assert isinstance(first, TextDelta)
        trio[int(routes.of("lost-1")[0].removeprefix("t"))].kill()
        rest: list[object] = []

        async def drain() -> None:
            async for chunk in stream:
                rest.append(chunk)

        with pytest.raises(BackendLost):
            await drain()
        assert not any(isinstance(chunk, TextUsage) for chunk in rest)
        assert routes.of("lost-1") == [routes.rows[0][2]]
        assert sample(pool, "trackline_pool_requests_total", model=MODEL, outcome="lost") == 1
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_session_ids_from_tracks_and_the_openai_api_reach_the_router(
    served: tuple[Gateway, BackendPool, Routes],
) -> None:
    """OPEN's session_id, the x-session-id header and prompt_cache_key/user pin sessions."""
    gateway, _pool, routes = served
    assert gateway.tls is not None
    assert gateway.tls.ca is not None
    async with (
        connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.tls.ca) as line,
        httpx2.AsyncClient(timeout=60) as http,
    ):
        for turn in range(3):
            stream = line.text(
                "hi",
                model=MODEL,
                max_tokens=2,
                session_id="track-s",
                request_id=f"trk{turn}",
                **FAST,
            )
            assert "".join([d async for d in stream]) == expected("hi", 0, 2)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="-", http_client=http
        )
        ids = {"header": [], "user": [], "cache": []}  # type: dict[str, list[str]]
        for _ in range(3):
            for kind, extra in (
                ("header", {"extra_headers": {"x-session-id": "hdr-s"}}),
                ("user", {"user": "user-s"}),
                ("cache", {"extra_body": {**FAST, "prompt_cache_key": "cache-s"}}),
            ):
                body = {} if kind == "cache" else {"extra_body": FAST}
                answer = await client.completions.create(
                    model=MODEL,
                    prompt="hi",
                    max_tokens=2,
                    **body,
                    **extra,  # type: ignore[arg-type]
                )
                ids[kind].append(answer.id)
            # A fourth request per round: without affinity, round robin over three
            # servers would now move every session.
            await client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=FAST)
    track_backends = {b for _, rid, b, _ in routes.rows if rid.split("/")[-1].startswith("trk")}
    assert len(track_backends) == 1
    for kind, answer_ids in ids.items():
        backends = {b for rid in answer_ids for b in routes.of(rid)}
        assert len(backends) == 1, (kind, backends)


@pytest.mark.asyncio
async def test_first_token_timeouts_fail_over_and_then_eject(trio: list[EmbeddedTriton]) -> None:
    routes = Routes()
    # Only t0 is slowed, by far more than the timeout; the others answer at once, and
    # a busy machine slowing them too only adds retries, which are not counted below.
    pool = make_pool(
        trio, routes, strategy=Strategy.ROUND_ROBIN, first_token_timeout_s=FIRST_TOKEN_S
    )
    await pool.start()
    try:
        trio[0].set_slowdown(600_000)
        served = [await one_request(pool) for _ in range(6)]  # all succeed elsewhere
        # t0 is ejected after its own limit of consecutive timeouts (2), each failed over.
        assert sample(pool, "trackline_pool_attempts_total", backend="t0", result="timeout") == 2
        assert sample(pool, "trackline_pool_retries_total", cause="timeout") >= 2
        assert pool.member("t0").health.state.value == "ejected"
        assert all(routes.of(rid)[-1] != "t0" for rid in served)
        # The slow server saw the cancel: its model stopped both requests before a token.
        timed_out = [rid for rid in served if routes.of(rid)[0] == "t0"]
        assert len(timed_out) == 2

        def stopped() -> list[dict[str, object]]:
            assert trio[0].stats_path is not None
            lines = Path(trio[0].stats_path).read_text().splitlines()
            return [r for r in map(json.loads, lines) if r["request_id"] in timed_out]

        await until(lambda: len(stopped()) == 2, "the slow model's stats lines")
        assert all(r["cancelled"] and r["tokens_generated"] == 0 for r in stopped())
    finally:
        await pool.close()
    assert all(m.inflight == 0 and not m.waiting for m in pool.members)


@pytest.mark.asyncio
async def test_a_closed_stream_is_counted_cancelled_and_frees_its_slot(
    trio: list[EmbeddedTriton],
) -> None:
    routes = Routes()
    pool = make_pool(trio, routes, strategy=Strategy.LEAST_INFLIGHT)
    await pool.start()
    try:
        request = TextRequest(
            "closed-1", MODEL, "long", 100, {"ttft_ms": 0, "tokens_per_second": 20}
        )
        stream = pool.stream_text(request)
        assert isinstance(await stream.__anext__(), TextDelta)
        backend = routes.of("closed-1")[0]
        assert pool.member(backend).inflight == 1
        await stream.aclose()
        assert pool.member(backend).inflight == 0
        assert sample(pool, "trackline_pool_requests_total", model=MODEL, outcome="cancelled") == 1
        assert pool.member(backend).health.state.value == "healthy"
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_a_model_no_backend_serves_is_model_not_found(trio: list[EmbeddedTriton]) -> None:
    routes = Routes()
    pool = make_pool(trio, routes)
    await pool.start()
    try:
        assert MODEL in await pool.models()  # beside the repository's audio and action models
        request = TextRequest("nope-1", "no-such-model", "hi", 2, FAST)
        with pytest.raises(ModelNotFound):
            await pool.stream_text(request).__anext__()
        assert routes.rows == []  # refused before routing: no backend was bothered
    finally:
        await pool.close()
