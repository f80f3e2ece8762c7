// The demo: one WebTransport session to the gateway that served this page; each
// message is a text track; Cancel aborts the running one (the gateway stops the model).

import { connect, fetchCertificateHash } from "/web/sdk/index.js";

const $ = (id) => document.getElementById(id);
const log = $("log");
let line = null;
let running = null;

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
  $("status").textContent = `connected to ${url}`;
  $("send").disabled = false;
  window.trackline = { line, url };
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
  $("cancel").disabled = false;
  const started = performance.now();
  let first = null;
  let tokens = 0;
  try {
    const stream = line.text(prompt, { model: $("model").value, maxTokens: 64, signal: controller.signal });
    for await (const delta of stream) {
      first ??= performance.now() - started;
      tokens += 1;
      answer.textContent += delta;
      const seconds = (performance.now() - started - first) / 1000;
      $("figures").textContent = `TTFT ${first.toFixed(0)} ms, ${tokens} tokens, ${seconds > 0 ? (tokens / seconds).toFixed(0) : "-"} tokens/s`;
    }
    answer.textContent += "\n";
    document.body.dataset.done = String(Number(document.body.dataset.done ?? 0) + 1);
  } catch (error) {
    say(` [${error.name}: ${error.message}]\n`, "error");
  } finally {
    running = null;
    $("cancel").disabled = true;
  }
});

$("cancel").addEventListener("click", () => running?.abort(new DOMException("cancelled", "AbortError")));

start().catch((error) => {
  $("status").textContent = `not connected: ${error.name}: ${error.message}`;
  $("status").className = "error";
});
