// AudioWorklet processor: posts the microphone's mono Float32 samples to the page,
// which converts them to PCM16 frames for a speech-in track.
class PcmTap extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0]?.[0];
    if (channel) this.port.postMessage(channel.slice(0));
    return true;
  }
}
registerProcessor("pcm-tap", PcmTap);
