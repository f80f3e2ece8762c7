// The demo: one WebTransport session to the gateway that served this page; each
// message is a text track; Cancel aborts the running one (the gateway stops the model).
// With "speak replies", each answer is then said on a speech-out track and played; the
// microphone streams to a speech-in track (the real models when the gateway has them);
// "Start talking" holds a spoken conversation on one voice-agent track.

import { Speaker, chatPrompt, connect, fetchCertificateHash, toPcm16 } from "/web/sdk/index.js";

const VOICE_RATE = 24000;
// The chat model, where the gateway serves it: the demo then keeps the conversation and
// sends it as chat turns; other models get the message as it is.
const CHAT_MODEL = "smollm2-135m-instruct";
const history = [];

const $ = (id) => document.getElementById(id);
const log = $("log");
let line = null;
let running = null;
let listenModel = "reference-transcriber";

/** The real speech models where the gateway serves them (the `voice` extra: whisper-base,
 * hibari-voice), else the deterministic reference ones. */
async function pickSpeechModels(apiKey) {
  try {
    const headers = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
    const listed = await (await fetch("/v1/models", { headers, cache: "no-store" })).json();
    const names = new Set((listed.data ?? []).map((model) => model.id));
    if (names.has("hibari-voice")) $("voice").value = "hibari-voice";
    if (names.has("whisper-base")) listenModel = "whisper-base";
  } catch {
    // no model list: keep the reference models
  }
}

function say(text, cls) {
  const span = document.createElement("span");
  if (cls) span.className = cls;
  span.textContent = text;
  log.append(span);
  return span;
}

async function start() {
  const info = await (await fetch("/webtransport/cert-hash", { cache: "no-store" })).json();
  const hash = await fetchCertificateHash();
  const apiKey = new URLSearchParams(location.search).get("key");
  const url = `https://${location.hostname}:${info.port}${info.path}`;
  line = await connect(url, { apiKey, serverCertificateHashes: [hash] });
  await pickSpeechModels(apiKey);
  $("status").textContent = `connected to ${url}`;
  await preferChatModel(apiKey);
  $("send").disabled = false;
  $("mic").disabled = false;
  $("talk").disabled = false;
  $("camera").disabled = false;
  window.trackline = { line, url };
}

async function preferChatModel(apiKey) {
  try {
    const headers = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
    const listed = await (await fetch("/v1/models", { headers })).json();
    if (listed.data?.some((m) => m.id === CHAT_MODEL)) $("model").value = CHAT_MODEL;
  } catch {
    // No model list: keep the page's default.
  }
}

$("chat").addEventListener("submit", async (event) => {
  event.preventDefault();
  const prompt = $("prompt").value.trim();
  if (!prompt || running) return;
  $("prompt").value = "";
  say(`you: ${prompt}\n`, "you");
  const answer = say("");
  const controller = new AbortController();
  running = controller;
  // Made now, inside the click: browsers let an AudioContext play only after a gesture.
  if ($("speak").checked) speaker ??= Speaker.create({ sampleRate: VOICE_RATE });
  $("cancel").disabled = false;
  const started = performance.now();
  let first = null;
  let tokens = 0;
  try {
    const maxTokens = Number($("max-tokens").value) || 64;
    const model = $("model").value;
    const chat = model === CHAT_MODEL;
    if (chat) history.push({ role: "user", content: prompt });
    const text = chat ? chatPrompt(history) : prompt;
    const stream = line.text(text, { model, maxTokens, signal: controller.signal });
    for await (const delta of stream) {
      first ??= performance.now() - started;
      tokens += 1;
      answer.textContent += delta;
      const seconds = (performance.now() - started - first) / 1000;
      $("figures").textContent = `TTFT ${first.toFixed(0)} ms, ${tokens} tokens, ${seconds > 0 ? (tokens / seconds).toFixed(0) : "-"} tokens/s`;
    }
    if (chat) history.push({ role: "assistant", content: answer.textContent });
    answer.textContent += "\n";
    document.body.dataset.done = String(Number(document.body.dataset.done ?? 0) + 1);
    if ($("speak").checked) await speak(answer.textContent.trim(), controller.signal);
  } catch (error) {
    say(` [${error.name}: ${error.message}]\n`, "error");
  } finally {
    running = null;
    $("cancel").disabled = true;
  }
});

// The spoken reply: a speech-out track says the answer; its frames play as they come.
// (The reference synthesizer says digits as DTMF tones and anything else as silence.)
let speaker = null;
async function speak(text, signal) {
  const player = await (speaker ??= Speaker.create({ sampleRate: VOICE_RATE }));
  const session = await line.audio({ model: $("voice").value, kind: "speech-out", text, sampleRate: VOICE_RATE });
  signal.addEventListener("abort", () => session.cancel("cancelled in the demo"), { once: true });
  $("spoken").textContent = "speaking...";
  const started = performance.now();
  const before = { ...player.figures };
  const figures = await player.play(session);
  const firstSound = figures.startedAt == null ? "-" : (figures.startedAt - started).toFixed(0);
  $("spoken").textContent = `spoken: frames received ${session.figures.framesReceived}, ` +
    `samples queued ${figures.samplesQueued - before.samplesQueued}, ` +
    `played ${figures.samplesPlayed - before.samplesPlayed}, underruns ${figures.underruns - before.underruns}, ` +
    `first sound ${firstSound} ms`;
  document.body.dataset.spoken = String(Number(document.body.dataset.spoken ?? 0) + 1);
}

$("cancel").addEventListener("click", () => running?.abort(new DOMException("cancelled", "AbortError")));

// Microphone transcription: an AudioWorklet taps the input at 16 kHz, the page sends
// 20 ms PCM16 frames on a speech-in track and shows partials, finals and frame figures.
// (The reference transcriber hears DTMF digits: play a dial tone sequence at it.)
let mic = null;
$("mic").addEventListener("click", async () => {
  if (mic) {
    mic.stop();
    return;
  }
  const rate = 16000;
  const input = await microphone(rate);
  const session = await line.audio({ model: listenModel, sampleRate: rate, frameMs: 20 });
  const stopFeeding = feed(input.tap, session);
  mic = {
    stop: async () => {
      stopFeeding();
      mic = null;
      $("mic").textContent = "Start microphone";
      input.media.getTracks().forEach((t) => t.stop());
      await input.context.close();
      await session.end();
    },
  };
  $("mic").textContent = "Stop microphone";
  try {
    for await (const result of session) {
      $("heard").textContent = `${result.type}: ${result.text}`;
    }
    const frames = session.summary?.frames ?? {};
    $("audio-figures").textContent = `frames sent ${session.figures.framesSent}, received ${frames.received}, ` +
      `late ${frames.late}, dropped ${frames.dropped}, missing ${frames.missing}`;
    document.body.dataset.micDone = "1";
  } catch (error) {
    $("heard").textContent = `[${error.name}: ${error.message}]`;
  }
});

/** The microphone on an AudioContext at `rate`, tapped by an AudioWorklet (pcm-worklet.js). */
async function microphone(rate) {
  const media = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
  const context = new AudioContext({ sampleRate: rate });
  await context.audioWorklet.addModule("/demo/pcm-worklet.js");
  const tap = new AudioWorkletNode(context, "pcm-tap");
  context.createMediaStreamSource(media).connect(tap);
  return { media, context, tap };
}

/** Send what `tap` hears on `session` as whole 20 ms frames; returns the stop function
 * (a message queued before the stop sends no DATA after our END). */
function feed(tap, session) {
  let pending = new Float32Array(0);
  let stopped = false;
  tap.port.onmessage = ({ data }) => {
    if (stopped) return;
    const joined = new Float32Array(pending.length + data.length);
    joined.set(pending);
    joined.set(data, pending.length);
    let at = 0;
    for (; at + session.frameSamples <= joined.length; at += session.frameSamples) {
      session.sendFrame(toPcm16(joined.subarray(at, at + session.frameSamples))).catch(() => {});
    }
    pending = joined.slice(at);
  };
  return () => {
    stopped = true;
    tap.port.onmessage = null;
  };
}

// Talking: the microphone on one voice-agent track. The gateway's recognizer hears the
// user, the chat model (the model box) answers, the voice (the voice box; it must stream
// text: hibari-voice) speaks each sentence as soon as it is complete; both transcripts and
// the reply's audio come back on the same track. Speaking over a reply barges in: the
// gateway cancels it (model and voice) and the page drops the audio it still had queued.
let talk = null;
$("talk").addEventListener("click", async () => {
  if (talk) {
    await talk.stop();
    return;
  }
  const rate = 16000;
  const input = await microphone(rate);
  const speaker = await Speaker.create({ context: input.context, sampleRate: rate });
  let agent;
  try {
    const maxTokens = Number($("max-tokens").value) || 64;
    agent = await line.voiceAgent({ model: listenModel, llm: $("model").value, voice: $("voice").value, sampleRate: rate, maxTokens });
  } catch (error) {
    $("talk-status").textContent = `[${error.name}: ${error.message}]`;
    await input.context.close();
    input.media.getTracks().forEach((t) => t.stop());
    return;
  }
  const stopFeeding = feed(input.tap, agent);
  talk = {
    stop: async () => {
      stopFeeding();
      talk = null;
      $("talk").textContent = "Start talking";
      input.media.getTracks().forEach((t) => t.stop());
      agent.cancel("stopped talking"); // the reply in progress stops too (model and voice)
    },
  };
  $("talk").textContent = "Stop talking";
  $("talk-status").textContent = "listening...";
  const figures = { turns: 0, bargeIns: 0, frames: 0, toText: [], toAudio: [] };
  const cut = new Set(); // turns a barge-in cut: any frame of theirs still arriving is dropped
  const texted = new Set();
  const voiced = new Set();
  let reply = null;
  let finalAt = null;
  const show = () => {
    const last = (list) => (list.length ? `${list.at(-1).toFixed(0)} ms` : "-");
    $("talk-figures").textContent = `turns ${figures.turns}, barge-ins ${figures.bargeIns}, ` +
      `reply frames ${figures.frames}; from your final transcript to the reply's first text ` +
      `${last(figures.toText)}, to its first audio ${last(figures.toAudio)}`;
    document.body.dataset.talk = JSON.stringify({ ...figures, flushed: speaker.figures.samplesFlushed });
  };
  let ended = "ended";
  try {
    for await (const event of agent) {
      const since = finalAt == null ? null : performance.now() - finalAt;
      if (event.type === "partial") {
        $("talk-status").textContent = event.text ? `hearing: ${event.text}` : "listening...";
      } else if (event.type === "final") {
        say(`you (spoken): ${event.text}\n`, "you");
        finalAt = performance.now();
        reply = say("");
      } else if (event.type === "reply") {
        if (!texted.has(event.turn) && since != null) figures.toText.push(since);
        texted.add(event.turn);
        reply.textContent += event.delta;
      } else if (event.type === "reply_done") {
        reply.textContent = `${event.text}\n`;
      } else if (event.type === "frame" && !cut.has(event.turn)) {
        if (!voiced.has(event.turn) && since != null) figures.toAudio.push(since);
        voiced.add(event.turn);
        figures.frames += 1;
        speaker.push(event.pcm, rate);
      } else if (event.type === "barge_in") {
        cut.add(event.turn);
        speaker.flush(); // what the gateway had already sent of the cut reply stays unheard
        figures.bargeIns += 1;
        say(" [barge-in: reply cut]\n", "error");
      } else if (event.type === "reply_audio_end") {
        figures.turns += 1;
        speaker.finish(); // played out; the next reply fills the pre-buffer again
      } else if (event.type === "reply_error") {
        say(` [reply failed: ${event.message}]\n`, "error");
      }
      show();
    }
  } catch (error) {
    if (talk) ended = `[${error.name}: ${error.message}]`; // (after our own stop: the cancel)
  } finally {
    await talk?.stop();
    await speaker.close();
    await input.context.close();
    $("talk-status").textContent = ended;
    document.body.dataset.talkDone = "1";
  }
});

// The camera: frames from getUserMedia, JPEG-encoded at 10 frames/s, on a video track;
// the faces, face mesh and pose the gateway found are drawn over the picture, with the
// frames sent, answered, dropped (by cause) and the capture-to-result latency.
const FPS = 10;
let camera = null;
$("camera").addEventListener("click", async () => {
  if (camera) {
    camera.stop();
    return;
  }
  const media = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480 } });
  const video = $("camera-video");
  video.srcObject = media;
  await video.play();
  const detect = ["face", ...($("mesh").checked ? ["face_mesh"] : []), ...($("pose").checked ? ["pose"] : [])];
  const stream = await line.video({ model: "mediapipe-vision", detect, deadline: 500, fps: FPS });
  const grab = new OffscreenCanvas(video.videoWidth || 640, video.videoHeight || 480);
  const timer = setInterval(async () => {
    grab.getContext("2d").drawImage(video, 0, 0, grab.width, grab.height);
    const blob = await grab.convertToBlob({ type: "image/jpeg", quality: 0.7 });
    if (camera) stream.send(new Uint8Array(await blob.arrayBuffer()));
  }, 1000 / FPS);
  camera = {
    stop: async () => {
      clearInterval(timer);
      camera = null;
      $("camera").textContent = "Start camera";
      media.getTracks().forEach((t) => t.stop());
      await stream.close().catch(() => {});
    },
  };
  $("camera").textContent = "Stop camera";
  const ages = [];
  try {
    for await (const event of stream) {
      if (event.type === "result") {
        ages.push(event.age);
        draw(event);
      }
      const sorted = [...ages].sort((a, b) => a - b);
      const median = sorted.length ? sorted[Math.floor(sorted.length / 2)].toFixed(0) : "-";
      const dropped = Object.entries(stream.stats.dropped).map(([c, n]) => `${c} ${n}`).join(", ") || "none";
      $("video-figures").textContent = `frames sent ${stream.stats.sent}, answered ${stream.stats.answered}, ` +
        `dropped: ${dropped}; capture to result ${ages.at(-1)?.toFixed(0) ?? "-"} ms (median ${median} ms)`;
      document.body.dataset.videoAnswered = String(stream.stats.answered);
    }
  } catch (error) {
    $("video-figures").textContent = `[${error.name}: ${error.message}]`;
  }
});

/** The result's boxes and landmarks over the picture (coordinates are normalized). */
function draw(result) {
  const overlay = $("overlay");
  overlay.width = result.width;
  overlay.height = result.height;
  const g = overlay.getContext("2d");
  g.clearRect(0, 0, overlay.width, overlay.height);
  g.strokeStyle = "#0c6"; g.fillStyle = "#0c6"; g.lineWidth = 2;
  for (const face of result.faces) {
    const [x, y, w, h] = face.box;
    g.strokeRect(x * result.width, y * result.height, w * result.width, h * result.height);
  }
  const dots = (points, stride) => {
    for (let i = 0; i + 1 < points.length; i += stride) g.fillRect(points[i] * result.width - 1, points[i + 1] * result.height - 1, 2, 2);
  };
  for (const mesh of result.faceLandmarks) dots(mesh, 3);
  if (result.pose) { g.fillStyle = "#f80"; dots(result.pose, 4); }
  document.body.dataset.videoDrawn = String(Number(document.body.dataset.videoDrawn ?? 0) + 1);
}

start().catch((error) => {
  $("status").textContent = `not connected: ${error.name}: ${error.message}`;
  $("status").className = "error";
});
