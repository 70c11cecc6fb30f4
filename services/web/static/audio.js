// Audio in the page: the microphone as PCM s16le chunks at a chosen rate, a file decoded to PCM,
// PCM as a WAV file (a recorded job's audio), and the playback of a live session's re-timed audio.

export const CHUNK_MS = 20;

function toInt16(floats) {
  const out = new Int16Array(floats.length);
  for (let i = 0; i < floats.length; i++) out[i] = Math.max(-1, Math.min(1, floats[i])) * 32767;
  return out;
}

/** The microphone at `rate` Hz (the AudioContext resamples), `onChunk(Int16Array)` every CHUNK_MS. */
export async function startMicrophone(rate, onChunk) {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
  const context = new AudioContext({ sampleRate: rate });
  await context.audioWorklet.addModule("/static/pcm-worklet.js");
  const source = context.createMediaStreamSource(stream);
  const capture = new AudioWorkletNode(context, "pcm-capture");
  const mute = context.createGain();
  mute.gain.value = 0;  // the worklet must be pulled by the graph; nothing is heard
  source.connect(capture).connect(mute).connect(context.destination);
  const step = (rate * CHUNK_MS) / 1000;
  let pending = new Float32Array(0);
  capture.port.onmessage = (event) => {
    const joined = new Float32Array(pending.length + event.data.length);
    joined.set(pending);
    joined.set(event.data, pending.length);
    let offset = 0;
    for (; offset + step <= joined.length; offset += step) onChunk(toInt16(joined.subarray(offset, offset + step)));
    pending = joined.slice(offset);
  };
  await context.resume();
  return async () => {
    capture.port.onmessage = null;
    stream.getTracks().forEach((t) => t.stop());
    await context.close();
  };
}

/** An audio file (anything the browser decodes) as mono Int16 PCM at `rate`. */
export async function decodeFile(file, rate) {
  const context = new OfflineAudioContext(1, 1, rate);
  const buffer = await context.decodeAudioData(await file.arrayBuffer());
  const mono = new Float32Array(buffer.length);
  for (let c = 0; c < buffer.numberOfChannels; c++) {
    const data = buffer.getChannelData(c);
    for (let i = 0; i < data.length; i++) mono[i] += data[i] / buffer.numberOfChannels;
  }
  return toInt16(mono);
}

/** PCM s16le mono as a WAV file. */
export function wavFile(chunks, rate) {
  const samples = chunks.reduce((n, c) => n + c.length, 0);
  const view = new DataView(new ArrayBuffer(44 + samples * 2));
  const text = (at, s) => [...s].forEach((ch, i) => view.setUint8(at + i, ch.charCodeAt(0)));
  text(0, "RIFF"); view.setUint32(4, 36 + samples * 2, true); text(8, "WAVE");
  text(12, "fmt "); view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
  view.setUint32(24, rate, true); view.setUint32(28, rate * 2, true); view.setUint16(32, 2, true); view.setUint16(34, 16, true);
  text(36, "data"); view.setUint32(40, samples * 2, true);
  let at = 44;
  for (const c of chunks) for (let i = 0; i < c.length; i++, at += 2) view.setInt16(at, c[i], true);
  return new File([view.buffer], "recording.wav", { type: "audio/wav" });
}

/** Plays a live session's audio, frame by frame, on one clock: each frame's PCM right after the previous. */
export class FramePlayer {
  constructor(rate) {
    this.rate = rate;
    this.context = new AudioContext({ sampleRate: rate });
    this.next = 0;
  }

  play(pcm) {
    if (!pcm.byteLength) return;
    const samples = new Int16Array(pcm.buffer, pcm.byteOffset, pcm.byteLength / 2);
    const buffer = this.context.createBuffer(1, samples.length, this.rate);
    const data = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) data[i] = samples[i] / 32768;
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    // 60 ms of jitter buffer: frames arrive paced, but not to the millisecond.
    const now = this.context.currentTime;
    if (this.next < now + 0.02 || this.next > now + 0.5) this.next = now + 0.06;
    source.start(this.next);
    this.next += buffer.duration;
  }

  flush() { this.next = 0; }

  close() { this.context.close(); }
}

/** Root mean square of s16 PCM, 0..1. */
export function rms(pcm) {
  const samples = new Int16Array(pcm.buffer, pcm.byteOffset, pcm.byteLength / 2);
  let sum = 0;
  for (let i = 0; i < samples.length; i++) sum += (samples[i] / 32768) ** 2;
  return samples.length ? Math.sqrt(sum / samples.length) : 0;
}
