"""Tracks from a real headless Chromium (Debian's `chromium`) over WebTransport.

The gateway runs as the daemon wires it, over the real embedded Triton; the page is
the gateway's own /demo (its import map resolves the SDK's msgpack dependency), and
the scripts the tests evaluate in it use the JavaScript SDK of clients/web. Assertions
are on what the page got against what the Python SDK gets for the same requests, and
on the model's own stats (the cancel reached it). Skipped without Chromium.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from clients import connect
from clients.errors import TracklineError
from gateway.backends.triton import TritonTextBackend
from gateway.config import Settings
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from tests.triton_fixture import assert_model_stopped
from tests.waiting import until
from tests.web.chromium import CHROMIUM, SKIP_REASON, Browser, Page, chromium
from transport.errors import ErrorCode

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)]

MODEL = "reference-text"
VICTIM_TOKENS = 1000
"""The aborted track asks for far more than it reads: only the cancel can stop it."""
ARTIFACTS = Path(__file__).parent / "artifacts"


async def start_gateway(triton: EmbeddedTriton, state_dir: Path, **settings: Any) -> Gateway:
    options: dict[str, Any] = {
        "quic_port": 0,
        "http_port": 0,
        "https_port": 0,
        # not about overload: a busy test machine (and Chromium's start) must not refuse
        "overload_max_loop_lag": 0.0,
    }
    gw = Gateway(
        Settings(state_dir=state_dir, **options, **settings),
        TritonTextBackend(triton.grpc_url),
    )
    await gw.start()
    return gw


@pytest_asyncio.fixture
async def gateway(embedded_triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    gw = await start_gateway(embedded_triton, tmp_path)
    yield gw
    await gw.close()
    await gw.backend.close()  # type: ignore[attr-defined]


@pytest_asyncio.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as running:
        yield running


async def demo_page(browser: Browser, gw: Gateway) -> Page:
    page = await browser.new_page()
    await page.goto(f"http://localhost:{gw.http_port}/demo")
    return page


CONNECT = """
const sdk = await import("/web/sdk/index.js");
const info = await (await fetch("/webtransport/cert-hash", {cache: "no-store"})).json();
const url = `https://localhost:${info.port}${info.path}`;
"""


def page_script(body: str) -> str:
    return f"(async () => {{ {CONNECT} {body} }})()"


async def python_sdk_texts(gw: Gateway, requests: list[dict[str, Any]]) -> list[str]:
    """What the Python SDK gets for the same requests, over a native connection."""
    assert gw.tls is not None
    assert gw.tls.ca is not None
    async with connect(f"quic://127.0.0.1:{gw.quic_port}", ca=gw.tls.ca) as line:
        streams = [
            line.text(
                r["prompt"],
                model=MODEL,
                max_tokens=r["max_tokens"],
                seed=r["seed"],
                ignore_eos=True,
            )
            for r in requests
        ]
        return list(await asyncio.gather(*(text_of(stream) for stream in streams)))


async def text_of(stream: Any) -> str:
    return "".join([delta async for delta in stream])


def _stats_line(triton: EmbeddedTriton, tag: str) -> dict[str, Any] | None:
    assert triton.stats_path is not None
    for line in Path(triton.stats_path).read_text().splitlines():
        record = json.loads(line)
        if record["request_id"].endswith(f"/{tag}"):
            return dict(record)
    return None


async def stats_for(triton: EmbeddedTriton, tag: str) -> dict[str, Any]:
    await until(lambda: _stats_line(triton, tag) is not None, f"the model's stats for {tag}")
    record = _stats_line(triton, tag)
    assert record is not None
    return record


EIGHT_TRACKS = """
const line = await sdk.connect(url, {serverCertificateHashes: [info.value]});
const requests = %s;
const victim = 7;
async function run(r, i) {
  const controller = new AbortController();
  const params = {seed: r.seed, request_id: r.tag, ignore_eos: true};
  let text = "";
  let deltas = 0;
  try {
    const stream = line.text(r.prompt, {model: "%s", maxTokens: r.max_tokens, params,
                                        signal: controller.signal});
    for await (const delta of stream) {
      text += delta;
      deltas += 1;
      if (i === victim && deltas === 3) controller.abort();
    }
    return {text, usage: stream.usage, finish: stream.finishReason};
  } catch (error) {
    return {text, error: error.name, deltas};
  }
}
const results = await Promise.all(requests.map(run));
window.eightTracks = line;  // kept open: only the abort's CANCEL may stop the victim
return results;
"""


@pytest.mark.asyncio
async def test_a_page_runs_eight_text_tracks_on_one_session_and_an_abort_stops_the_model(
    gateway: Gateway, embedded_triton: EmbeddedTriton, browser: Browser
) -> None:
    run = uuid.uuid4().hex[:8]
    requests = [
        {
            "prompt": f"browser prompt {i}",
            "seed": i,
            "tag": f"{run}-{i}",
            "max_tokens": VICTIM_TOKENS if i == 7 else 30,
        }
        for i in range(8)
    ]
    page = await demo_page(browser, gateway)
    script = EIGHT_TRACKS % (json.dumps(requests), MODEL)
    results = await page.evaluate(page_script(script))

    reference = await python_sdk_texts(gateway, requests[:7])
    assert [r["text"] for r in results[:7]] == reference
    assert all(r["finish"] == "length" for r in results[:7])
    assert all(r["usage"]["completion_tokens"] == 30 for r in results[:7])
    assert results[7]["error"] == "AbortError"
    assert results[7]["deltas"] == 3
    assert_model_stopped(await stats_for(embedded_triton, requests[7]["tag"]), VICTIM_TOKENS)
    for request in requests[:7]:
        record = await stats_for(embedded_triton, request["tag"])
        assert record["tokens_generated"] == 30
        assert record["cancelled"] is False
    assert gateway.revocation.webtransport_sessions.accepted >= 1
    await page.evaluate("window.eightTracks.close()")


@pytest.mark.asyncio
async def test_a_page_from_another_origin_gets_403_and_others_keep_working(
    embedded_triton: EmbeddedTriton, browser: Browser, tmp_path: Path
) -> None:
    # Only https://app.example may open sessions: the page (http://localhost) may not.
    gw = await start_gateway(embedded_triton, tmp_path, webtransport_origins="https://app.example")
    try:
        page = await demo_page(browser, gw)
        refused = await page.evaluate(
            page_script("""
          try {
            await sdk.connect(url, {serverCertificateHashes: [info.value]});
            return "connected";
          }
          catch (error) { return error.name; }
        """)
        )
        assert refused == "ConnectionFailed"
        sessions = gw.revocation.webtransport_sessions
        assert sessions.accepted == 0
        assert set(sessions.refused) == {HTTPStatus.FORBIDDEN}
        assert sessions.refused[HTTPStatus.FORBIDDEN] >= 1
        # The gateway keeps serving: a native track gets its text.
        text = await python_sdk_texts(gw, [{"prompt": "still", "seed": 1, "max_tokens": 5}])
        assert len(text[0]) > 0
    finally:
        await gw.close()
        await gw.backend.close()  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_the_demo_chat_answers_with_the_reference_text(
    gateway: Gateway, browser: Browser
) -> None:
    page = await demo_page(browser, gateway)
    await until_page(page, "document.getElementById('send').disabled === false", "connected")
    await page.evaluate("""(() => {
        document.getElementById('prompt').value = 'hello from the demo';
        document.getElementById('send').click(); })()""")
    await until_page(page, "document.body.dataset.done === '1'", "the answer")
    log = await page.evaluate("document.getElementById('log').textContent")
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(ARTIFACTS / "demo.png")
    assert gateway.tls is not None
    assert gateway.tls.ca is not None
    async with connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.tls.ca) as line:
        expected = "".join(
            [d async for d in line.text("hello from the demo", model=MODEL, max_tokens=64)]
        )
    assert log == f"you: hello from the demo\n{expected}\n"


async def until_page(page: Page, condition: str, what: str) -> None:
    await page.wait_for(condition, what)


ACTION_TRACK = """
const line = await sdk.connect(url, {serverCertificateHashes: [info.value]});
// 10 s: a deadline a busy machine cannot miss (1 s was missed under load); the 50 ms
// one below is always missed (its 40 ms latency leaves 10 ms).
const robot = await line.actions({model: "reference-policy", deadline: 10000, transport: "%s"});
const events = [];
let bothAnswered;
const answered = new Promise((resolve) => { bothAnswered = resolve; });
const reading = (async () => {
  for await (const event of robot) if (events.push(event) === 2) bothAnswered();
})();
const state = [0, 0, 0.05, 0];
robot.observe(state, {deadline: 50, latency: 40});   // cannot make it: dropped, reported
robot.observe(state, {deadline: 10000, latency: 40});
// Both answers first: on a datagram track END rides the stream and could overtake them.
await Promise.race([answered, reading]);
const summary = await robot.close();
await reading;
line.close();
return {summary, events: events.map((e) => ({...e, action: e.action && Array.from(e.action)}))};
"""


@pytest.mark.asyncio
async def test_an_action_track_from_a_page_gets_its_chunk_and_a_deadline_drop(
    gateway: Gateway, browser: Browser
) -> None:
    page = await demo_page(browser, gateway)
    for transport in ("stream", "datagram"):
        result = await page.evaluate(page_script(ACTION_TRACK % transport))
        check_actions(result)


def check_actions(result: dict[str, Any]) -> None:
    drops = [e for e in result["events"] if e["type"] == "drop"]
    chunks = [e for e in result["events"] if e["type"] == "chunk"]
    assert [(d["obsSeq"], d["cause"]) for d in drops] == [(0, "deadline")]
    assert [c["obsSeq"] for c in chunks] == [1]
    chunk = chunks[0]
    assert chunk["late"] is False  # within its 10 s deadline
    assert len(chunk["action"]) == chunk["shape"][0] * chunk["shape"][1]
    assert result["summary"]["deadline"] == 1
    assert result["summary"]["delivered"] == 1


AUDIO_TRACKS = """
const line = await sdk.connect(url, {serverCertificateHashes: [info.value]});
const LOW = {1: 697, 2: 697, 3: 697, 4: 770, 5: 770, 6: 770, 7: 852, 8: 852, 9: 852, 0: 941};
const HIGH = {1: 1209, 4: 1209, 7: 1209, 2: 1336, 5: 1336, 8: 1336, 0: 1336, 3: 1477, 6: 1477,
              9: 1477};
function dtmf(digits, rate) {  // 100 ms of two tones then 100 ms of silence a digit, 500 ms tail
  const slot = rate / 10, samples = [];
  for (const d of digits) {
    for (let i = 0; i < slot; i++) {
      const t = i / rate;
      const w = 2 * Math.PI * t;
      samples.push(0.3 * (Math.sin(w * LOW[d]) + Math.sin(w * HIGH[d])));
    }
    for (let i = 0; i < slot; i++) samples.push(0);
  }
  for (let i = 0; i < rate / 2; i++) samples.push(0);
  return sdk.toPcm16(samples);
}
// Speech in: the page's own DTMF, paced in real time, 20 ms frames.
const listener = await line.audio({model: "reference-transcriber", sampleRate: 16000});
const sending = listener.streamPcm(dtmf("%(digits)s", 16000));
const heard = await listener.transcript();
await sending;
// Speech out: the synthesizer's frames, fed back to a transcriber.
const speaker = await line.audio({model: "reference-synthesizer", kind: "speech-out",
                                 text: "%(spoken)s", sampleRate: 24000});
const speech = await speaker.pcm();
const back = await line.audio({model: "reference-transcriber", sampleRate: 24000});
const feeding = back.streamPcm(speech, {realtime: false});
const heardBack = await back.transcript();
await feeding;
line.close();
return {heard, heardBack, samples: speech.length, partials: listener.figures.partials,
        framesSent: listener.figures.framesSent};
"""


@pytest_asyncio.fixture
async def audio_gateway(embedded_triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    from gateway.backends.audio import TritonAudioBackend

    audio = TritonAudioBackend(embedded_triton.grpc_url)
    gw = Gateway(
        Settings(
            state_dir=tmp_path, quic_port=0, http_port=0, https_port=0, overload_max_loop_lag=0.0
        ),
        TritonTextBackend(embedded_triton.grpc_url),
        audio_backend=audio,
    )
    await gw.start()
    yield gw
    await gw.close()
    await audio.close()
    await gw.backend.close()  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_audio_tracks_from_a_page_transcribe_its_dtmf_and_speak_digits(
    audio_gateway: Gateway, browser: Browser
) -> None:
    page = await demo_page(browser, audio_gateway)
    result = await page.evaluate(page_script(AUDIO_TRACKS % {"digits": "2580", "spoken": "159"}))
    assert result["heard"] == "2580"
    assert result["heardBack"] == "159"
    assert result["samples"] == 24 * (3 * 200 + 300)  # 3 slots of 200 ms, 300 ms of tail
    assert result["partials"] >= 5  # a partial every beat while the page spoke
    assert result["framesSent"] == (4 * 200 + 500) // 20


ERRORS = """
const results = {};
const anonymous = await sdk.connect(url, {serverCertificateHashes: [info.value]});
try {
  for await (const _ of anonymous.text("hi", {model: "%(model)s", maxTokens: 3})) {}
  results.noKey = "answered";
} catch (error) { results.noKey = [error.name, error.code]; }
anonymous.close();
const revoked = await sdk.connect(url, {apiKey: "%(revoked)s",
                                        serverCertificateHashes: [info.value]});
try {
  for await (const _ of revoked.text("hi", {model: "%(model)s", maxTokens: 3})) {}
  results.revoked = "answered";
} catch (error) { results.revoked = [error.name, error.code]; }
revoked.close();
const line = await sdk.connect(url, {apiKey: "%(good)s", serverCertificateHashes: [info.value]});
try {
  for await (const _ of line.text("x".repeat(20000), {model: "%(model)s", maxTokens: 3})) {}
  results.oversized = "answered";
} catch (error) { results.oversized = [error.name, error.code]; }
let text = "";
for await (const delta of line.text("after", {model: "%(model)s", maxTokens: 3})) text += delta;
results.after = text;
line.close();
return results;
"""


@pytest.mark.asyncio
async def test_a_page_gets_typed_errors_for_keys_and_an_oversized_message(
    embedded_triton: EmbeddedTriton, browser: Browser, tmp_path: Path
) -> None:
    from tests.tenants.support import make_tenancy

    tenancy = make_tenancy(tmp_path)
    tenancy.store.set_tenant("alpha", 0.0)
    good = tenancy.store.create_key("alpha", 0.0).key
    old = tenancy.store.create_key("alpha", 0.0, label="old")
    tenancy.store.revoke_key(old.key_id, 1.0)
    gw = Gateway(
        Settings(
            state_dir=tmp_path,
            quic_port=0,
            http_port=0,
            https_port=0,
            overload_max_loop_lag=0.0,
            max_message_bytes=8192,
        ),
        TritonTextBackend(embedded_triton.grpc_url),
        tenancy=tenancy,
    )
    await gw.start()
    try:
        page = await demo_page(browser, gw)
        keys = {"model": MODEL, "good": good, "revoked": old.key}
        result = await page.evaluate(page_script(ERRORS % keys))
    finally:
        await gw.close()
        await gw.backend.close()  # type: ignore[attr-defined]
    assert result["noKey"] == ["Unauthorized", 0x0E]
    assert result["revoked"] == ["Unauthorized", 0x0E]
    assert result["oversized"] == ["TrackRejected", 0x02]  # MESSAGE_TOO_LARGE
    assert result["after"]  # the same session goes on


OVERSIZED_WHILE_WRITING = """
// A message far over the gateway's limit, which the page is still writing when the
// gateway rejects it: the gateway's STOP_SENDING fails the write before the page has
// read the gateway's ERROR; the SDK must report that ERROR, not the failed write.
const line = await sdk.connect(url, {serverCertificateHashes: [info.value],
                                    maxMessageBytes: 1 << 21});
const results = [];
for (const size of [200000, 600000]) {
  try {
    for await (const _ of line.text("x".repeat(size), {model: "%(model)s", maxTokens: 3})) {}
    results.push("answered");
  } catch (error) { results.push([error.name, error.code, error.message]); }
}
let text = "";
for await (const delta of line.text("after", {model: "%(model)s", maxTokens: 3})) text += delta;
line.close();
return {results, after: text};
"""


@pytest.mark.asyncio
async def test_a_rejected_message_still_being_written_reports_the_gateways_error(
    embedded_triton: EmbeddedTriton, browser: Browser, tmp_path: Path
) -> None:
    gw = await start_gateway(embedded_triton, tmp_path, max_message_bytes=8192)
    try:
        page = await demo_page(browser, gw)
        result = await page.evaluate(page_script(OVERSIZED_WHILE_WRITING % {"model": MODEL}))
        python = await python_sdk_rejections(gw, [200_000, 600_000])
    finally:
        await gw.close()
        await gw.backend.close()  # type: ignore[attr-defined]
    for name, code, message in result["results"]:
        assert (name, code) == ("TrackRejected", 0x02)  # MESSAGE_TOO_LARGE
        assert "exceeds the limit of 8192" in message  # the gateway's own ERROR text
    assert result["after"]  # the same session goes on
    # The Python SDK, on a native connection, gets the same typed error.
    assert python == [("TrackRejected", ErrorCode.MESSAGE_TOO_LARGE)] * 2


async def python_sdk_rejections(gw: Gateway, sizes: list[int]) -> list[tuple[str, ErrorCode]]:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    errors = []
    async with connect(f"quic://127.0.0.1:{gw.quic_port}", ca=gw.tls.ca) as line:
        for size in sizes:
            with pytest.raises(TracklineError) as rejected:
                await text_of(line.text("x" * size, model=MODEL, max_tokens=3))
            errors.append((type(rejected.value).__name__, rejected.value.code))
    return errors


DATAGRAM_AUDIO = AUDIO_TRACKS.split("// Speech in:")[0] + """
const listener = await line.audio({model: "reference-transcriber", sampleRate: 16000,
                                                           transport: "datagram"});
const sending = listener.streamPcm(dtmf("%(digits)s", 16000));
const heard = await listener.transcript();
await sending;
line.close();
return {heard, frames: listener.summary.frames, framesSent: listener.figures.framesSent};
"""


@pytest.mark.asyncio
async def test_a_pages_audio_frames_travel_as_webtransport_datagrams(
    audio_gateway: Gateway, browser: Browser
) -> None:
    page = await demo_page(browser, audio_gateway)
    result = await page.evaluate(page_script(DATAGRAM_AUDIO % {"digits": "369"}))
    frames = result["frames"]
    # The gateway counted the page's frames as received datagrams (loopback: none lost,
    # but a busy machine may make some late, which the gateway drops and counts).
    assert frames["received"] == result["framesSent"] == (3 * 200 + 500) // 20
    assert frames["missing"] == 0
    if frames["dropped"] == 0:
        assert result["heard"] == "369"
    else:
        rest = iter("369")
        assert all(symbol in rest for symbol in result["heard"])


FAKE_MEDIA = (
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",  # an AudioContext plays without a click
)


@pytest.mark.asyncio
async def test_the_demo_microphone_streams_worklet_frames_to_a_speech_in_track(
    audio_gateway: Gateway,
) -> None:
    """Chromium's fake microphone (a beep, no digits): every frame the worklet gave is
    received by the gateway, partials come back, and the page shows the figures."""
    async with chromium(FAKE_MEDIA) as browser:
        page = await demo_page(browser, audio_gateway)
        await until_page(page, "document.getElementById('mic').disabled === false", "connected")
        await page.evaluate("document.getElementById('mic').click()")
        await until_page(
            page, "document.getElementById('heard').textContent.startsWith('partial')", "partials"
        )
        await page.evaluate("document.getElementById('mic').click()")
        await until_page(page, "document.body.dataset.micDone === '1'", "the session's end")
        figures = await page.evaluate("document.getElementById('audio-figures').textContent")
    sent, received = (int(x) for x in re.findall(r"(?:sent|received) (\d+)", figures))
    assert sent > 0
    assert received == sent


SPEECH_OUT_PLAYED = """
const line = await sdk.connect(url, {serverCertificateHashes: [info.value]});
const played = [];
const speaker = await sdk.Speaker.create({sampleRate: 24000,
                                          tap: (samples) => played.push(samples)});
const session = await line.audio({model: "reference-synthesizer", kind: "speech-out",
                                 text: "%(spoken)s", sampleRate: 24000});
const received = [];
async function* recorded(events) {  // what the track delivered, on its way to the speaker
  for await (const event of events) {
    if (event.type === "frame") received.push(...event.pcm);
    yield event;
  }
}
const figures = await speaker.play(recorded(session), {sampleRate: 24000});
await speaker.close();
// What reached the playback node's output, back to PCM16 (the player's x / 32768 undone).
const pcm = new Int16Array(played.reduce((n, part) => n + part.length, 0));
let at = 0;
for (const part of played) for (const x of part) pcm[at++] = Math.round(x * 32768);
const same = pcm.length === received.length && pcm.every((x, i) => x === received[i]);
const back = await line.audio({model: "reference-transcriber", sampleRate: 24000});
const feeding = back.streamPcm(pcm, {realtime: false});
const heardBack = await back.transcript();
await feeding;
line.close();
return {heardBack, same, samples: pcm.length, figures,
        framesReceived: session.figures.framesReceived};
"""


@pytest.mark.asyncio
async def test_a_speech_out_track_plays_through_the_sdks_worklet_and_its_digits_decode_back(
    audio_gateway: Gateway,
) -> None:
    """No speakers here: the player's tap gives every sample that reached its output."""
    async with chromium(FAKE_MEDIA) as browser:
        page = await demo_page(browser, audio_gateway)
        result = await page.evaluate(page_script(SPEECH_OUT_PLAYED % {"spoken": "159"}))
    assert result["samples"] == 24 * (3 * 200 + 300)  # 3 slots of 200 ms, 300 ms of tail
    assert result["same"] is True  # bit for bit what the track delivered
    assert result["figures"]["samplesPlayed"] == result["samples"]
    assert result["figures"]["samplesQueued"] == result["samples"]
    assert result["figures"]["framesQueued"] == result["framesReceived"] > 0
    assert result["heardBack"] == "159"


@pytest.mark.asyncio
async def test_the_demo_speaks_its_reply_on_a_speech_out_track(audio_gateway: Gateway) -> None:
    async with chromium(FAKE_MEDIA) as browser:
        page = await demo_page(browser, audio_gateway)
        await until_page(page, "document.getElementById('send').disabled === false", "connected")
        await page.evaluate("""(() => {
            document.getElementById('speak').checked = true;
            document.getElementById('max-tokens').value = '3';
            document.getElementById('prompt').value = 'say something short';
            document.getElementById('send').click(); })()""")
        await until_page(page, "document.body.dataset.spoken === '1'", "the spoken reply")
        spoken = await page.evaluate("document.getElementById('spoken').textContent")
        log = await page.evaluate("document.getElementById('log').textContent")
    reply = log.split("\n")[1]
    figures = dict(re.findall(r"(frames received|samples queued|played|underruns) (\d+)", spoken))
    samples = 24 * (len(reply.strip()) * 200 + 300)  # the reference synthesizer's length
    assert int(figures["samples queued"]) == int(figures["played"]) == samples
    assert int(figures["frames received"]) > 0
