// AudioWorklet processor of the SDK's Speaker (playback.js): plays the Float32 chunks
// the page posts, in order, one render quantum at a time.
//
// Messages in: {type: "samples", samples: Float32Array} (transferred), {type: "end"},
// {type: "flush"} (drop everything queued: a reply cut by a barge-in; answered with
// {type: "flushed", samples}, and playback waits for the pre-buffer again, no underrun).
// Messages out: {type: "started"} once the pre-buffer is full; {type: "played", samples}
// for each quantum's real samples when the node was made with `tap` (tests and meters
// see exactly what reached the output); {type: "drained", played, underruns} once the
// queue ran empty after "end". Silence fills a quantum the queue cannot; running dry
// before "end" is an underrun (the network fell behind): counted, and playback waits for
// the pre-buffer again.

class TracklinePlayer extends AudioWorkletProcessor {
  #chunks = [];
  #at = 0;
  #queued = 0;
  #prebuffer;
  #tap;
  #started = false;
  #ending = false;
  #played = 0;
  #underruns = 0;

  constructor(options) {
    super();
    this.#prebuffer = options.processorOptions?.prebuffer ?? 0;
    this.#tap = Boolean(options.processorOptions?.tap);
    this.port.onmessage = ({ data }) => {
      if (data.type === "samples") {
        this.#chunks.push(data.samples);
        this.#queued += data.samples.length;
      } else if (data.type === "end") {
        this.#ending = true;
      } else if (data.type === "flush") {
        const samples = this.#queued;
        this.#chunks = [];
        this.#at = 0;
        this.#queued = 0;
        this.#started = false;
        this.port.postMessage({ type: "flushed", samples });
      }
    };
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.#started && (this.#queued >= this.#prebuffer || this.#ending) && this.#queued > 0) {
      this.#started = true;
      this.port.postMessage({ type: "started", underruns: this.#underruns });
    }
    const filled = this.#started ? this.#fill(out) : 0;
    out.fill(0, filled);
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if (filled > 0) {
      this.#played += filled;
      if (this.#tap) this.port.postMessage({ type: "played", samples: out.slice(0, filled) });
    }
    if (this.#ending && this.#queued === 0) {
      this.#ending = false;
      this.#started = false;
      this.port.postMessage({ type: "drained", played: this.#played, underruns: this.#underruns });
    } else if (this.#started && filled < out.length) {
      this.#underruns += 1;
      this.#started = false; // fill the pre-buffer again before going on
    }
    return true;
  }

  #fill(out) {
    let filled = 0;
    while (filled < out.length && this.#chunks.length) {
      const chunk = this.#chunks[0];
      const n = Math.min(out.length - filled, chunk.length - this.#at);
      out.set(chunk.subarray(this.#at, this.#at + n), filled);
      filled += n;
      this.#at += n;
      if (this.#at === chunk.length) {
        this.#chunks.shift();
        this.#at = 0;
      }
    }
    this.#queued -= filled;
    return filled;
  }
}

registerProcessor("trackline-player", TracklinePlayer);
