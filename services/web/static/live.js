// A live session over one WebSocket to services/web (services/web/live_bridge.py has the protocol):
// PCM up from the microphone or a file, frames (H.264 with WebCodecs where the browser has it, JPEG
// otherwise) and their re-timed audio down; Clear; the latency measured on this page's clock.
import { apiKey, showMessage } from "./api.js";
import { CHUNK_MS, FramePlayer, decodeFile, rms, startMicrophone } from "./audio.js";

const $ = (id) => document.getElementById(id);
const RATE = 16000;
const PROBE_CODEC = "avc1.42C01F";  // x264's constrained baseline, as the live workers send
// Close codes after which the session lives on and the page resumes it: the socket dropped (1006),
// the web server or a gateway restarted (1001, 1012, 1013) or failed (1011).
const RESUMABLE = new Set([1001, 1006, 1011, 1012, 1013]);
const RESUME_FOR_MS = 40000;  // the live worker ends a session nobody resumes after 60 s

/** The codec string of an Annex B keyframe's SPS ("avc1.PPCCLL"); null without one. */
function avcCodec(data) {
  for (let i = 0; i + 4 < data.length; i++) {
    if (data[i] === 0 && data[i + 1] === 0 && data[i + 2] === 1 && (data[i + 3] & 0x1f) === 7) {
      const hex = (b) => b.toString(16).padStart(2, "0");
      return `avc1.${hex(data[i + 4])}${hex(data[i + 5])}${hex(data[i + 6])}`;
    }
  }
  return null;
}

async function webCodecsH264() {
  if (!("VideoDecoder" in window)) return false;
  try { return (await VideoDecoder.isConfigSupported({ codec: PROBE_CODEC })).supported; } catch { return false; }
}

function median(values) {
  if (!values.length) return NaN;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

export class LiveView {
  constructor(avatars) {
    this.avatars = avatars;
    this.canvas = $("live-canvas");
    this.context2d = this.canvas.getContext("2d", { willReadFrequently: true });
    this.message = $("live-message");
    this.ws = null;
    this.reset();
    $("live-start").addEventListener("click", () => this.start());
    $("live-talk").addEventListener("click", () => this.toggleTalk());
    $("live-play").addEventListener("click", () => this.playFile());
    $("live-clear").addEventListener("click", () => this.clear());
    $("live-stop").addEventListener("click", () => this.stop());
  }

  reset() {
    this.session = null;
    this.resumeToken = null;
    this.lastIndex = -1;     // the last frame received: where a resumed stream goes on from
    this.stopping = false;
    this.resuming = null;    // {until, attempts} while the page resumes after a dropped socket
    this.framesDrawn = 0;
    this.lastFrame = null;
    this.decoding = new Map();  // H.264 timestamp -> the header of the frame the decoder has not output yet
    this.latencies = [];
    this.utterance = 0;      // the utterance the page's next chunk belongs to (the worker counts from 1)
    this.sent = new Map();   // utterance -> [[samples sent so far, time sent], ...]
    this.speechSeen = new Map();  // utterance -> speech frames drawn
    this.openUtterance = false;
    this.stopMic = null;
    this.playing = null;
  }

  buttons(active) {
    for (const id of ["live-talk", "live-play", "live-clear", "live-stop"]) $(id).disabled = !active;
    $("live-start").disabled = active;
  }

  setState(text) { $("live-state").textContent = text; }

  async start() {
    const avatarId = $("live-avatar").value;
    if (!avatarId) { showMessage(this.message, "upload an avatar first (Avatars)", true); return; }
    let codec = $("live-codec").value;
    if (codec === "auto") codec = (await webCodecsH264()) ? "h264" : "jpeg";
    if (codec === "h264" && !("VideoDecoder" in window)) {
      showMessage(this.message, "this browser has no WebCodecs: choose JPEG", true);
      return;
    }
    this.reset();
    this.codec = codec;
    this.player = new FramePlayer(RATE);
    showMessage(this.message, "starting the session...");
    this.setState("starting");
    this.connect({ type: "start", api_key: apiKey(), avatar_id: avatarId, codec, sample_rate: RATE });
  }

  /** One WebSocket to the bridge; `first` is its start or resume message. */
  connect(first) {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${scheme}//${location.host}/api/live`);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => ws.send(JSON.stringify(first));
    ws.onmessage = (event) => (typeof event.data === "string" ? this.onText(JSON.parse(event.data)) : this.onFrame(event.data));
    ws.onclose = (event) => this.onClose(event);
  }

  onText(message) {
    if (message.type === "session" && this.resuming) {
      this.resuming = null;  // the same session, on a new socket: the stream goes on from a keyframe
      if (this.codec === "h264") { if (this.decoder.state !== "closed") this.decoder.close(); this.makeDecoder(); }
      this.buttons(true);
      this.setState("idle");
      showMessage(this.message, `session ${this.session.id} resumed`);
    } else if (message.type === "session") {
      const s = message.session;
      this.session = s;
      this.resumeToken = s.resume_token;  // in memory only: a resume needs it with the key
      this.fps = s.video.fps;
      this.canvas.width = s.width;
      this.canvas.height = s.height;
      $("live-video").textContent = `${s.width}x${s.height} ${this.codec === "h264" ? "H.264 (WebCodecs)" : "JPEG"} at ${s.video.fps} fps`;
      if (this.codec === "h264") this.makeDecoder();
      this.buttons(true);
      this.setState("idle");
      showMessage(this.message, `session ${s.id} open`);
    } else if (message.type === "stats") {
      $("live-server-latency").textContent = `p50 ${(message.latency_p50_seconds * 1000).toFixed(0)} ms, p95 ${(message.latency_p95_seconds * 1000).toFixed(0)} ms; skipped ${message.frames_skipped}, dropped ${message.frames_dropped}`;
    } else if (message.type === "event") {
      if (message.kind === "PLAYBACK_FINISHED") this.player.flush();
    } else if (message.type === "error") {
      showMessage(this.message, `${message.code}: ${message.message}`, true);
    }
  }

  makeDecoder() {
    this.decoderCodec = null;
    this.decoder = new VideoDecoder({
      output: (frame) => {
        // The decoder outputs in its own time: the frame's timestamp says which header it shows.
        const header = this.decoding.get(frame.timestamp);
        for (const timestamp of this.decoding.keys()) if (timestamp <= frame.timestamp) this.decoding.delete(timestamp);
        this.context2d.drawImage(frame, 0, 0, this.canvas.width, this.canvas.height);
        frame.close();
        this.drawn(header);
      },
      error: (error) => showMessage(this.message, `the H.264 decoder failed (${error.message}): start again with JPEG`, true),
    });
  }

  onFrame(buffer) {
    const view = new DataView(buffer);
    const headerBytes = view.getUint32(0, true);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 4, headerBytes)));
    const data = new Uint8Array(buffer, 4 + headerBytes, header.video_bytes);
    const audio = new Uint8Array(buffer.slice(4 + headerBytes + header.video_bytes));
    this.lastIndex = header.index;
    header.arrived = performance.now();
    header.rms = rms(audio);
    this.player.play(audio);
    this.measure(header);
    if (this.codec === "h264") {
      if (this.decoder.state !== "configured" || (header.keyframe && avcCodec(data) !== this.decoderCodec)) {
        if (!header.keyframe) return;  // wait for a keyframe to (re)configure
        this.decoderCodec = avcCodec(data) || PROBE_CODEC;
        this.decoder.configure({ codec: this.decoderCodec, optimizeForLatency: true });
      }
      const timestamp = Math.round((header.index * 1e6) / this.fps);
      this.decoding.set(timestamp, header);
      this.decoder.decode(new EncodedVideoChunk({ type: header.keyframe ? "key" : "delta", timestamp, data }));
    } else {
      createImageBitmap(new Blob([data], { type: "image/jpeg" })).then((image) => {
        this.context2d.drawImage(image, 0, 0, this.canvas.width, this.canvas.height);
        image.close();
        this.drawn(header);
      });
    }
  }

  /** `header`: the frame now on the canvas (its index, speech and audio level), for the page's state and
   * the `lipline-frame` event. */
  drawn(header) {
    if (!this.ws) return;  // a picture decoded after the socket closed: the session is over
    this.framesDrawn += 1;
    this.lastFrame = header || null;
    $("live-frames").textContent = String(this.framesDrawn);
    this.setState(this.lastFrame && this.lastFrame.speech ? `speaking (utterance ${this.lastFrame.utterance})` : "idle");
    this.canvas.dispatchEvent(new CustomEvent("lipline-frame", { detail: this.lastFrame }));
  }

  /** Speech frame j of an utterance shows its audio up to (j + 1) / fps: the latency is the frame's
   * arrival less the time the chunk that completed that audio was sent (as services/gateway/live_client.py). */
  measure(header) {
    if (!header.speech) return;
    const j = this.speechSeen.get(header.utterance) || 0;
    this.speechSeen.set(header.utterance, j + 1);
    const need = ((j + 1) / this.fps) * RATE;
    const sent = this.sent.get(header.utterance) || [];
    const chunk = sent.find(([samples]) => samples >= need - 1e-6);
    if (!chunk) return;
    this.latencies.push(header.arrived - chunk[1]);
    if (this.latencies.length > 100) this.latencies.shift();
    $("live-latency").textContent = `${median(this.latencies).toFixed(0)} ms (median of the last ${this.latencies.length} speech frames)`;
  }

  send(chunk) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    if (!this.openUtterance) { this.utterance += 1; this.openUtterance = true; this.sent.set(this.utterance, []); }
    const list = this.sent.get(this.utterance);
    const total = (list.length ? list[list.length - 1][0] : 0) + chunk.length;
    list.push([total, performance.now()]);
    this.ws.send(chunk.buffer);
  }

  endUtterance(kind) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify({ type: kind }));
    this.openUtterance = false;
  }

  async toggleTalk() {
    if (this.stopMic) {
      await this.stopTalking();
      this.endUtterance("end");
      return;
    }
    try {
      this.stopMic = await startMicrophone(RATE, (chunk) => this.send(chunk));
      $("live-talk").textContent = "Stop talking";
    } catch (error) {
      showMessage(this.message, `the microphone could not be opened: ${error.message}`, true);
    }
  }

  async stopTalking() {
    if (!this.stopMic) return;
    const stop = this.stopMic;
    this.stopMic = null;
    $("live-talk").textContent = "Talk";
    await stop();
  }

  async playFile() {
    const file = $("live-file").files[0];
    if (!file) { showMessage(this.message, "choose an audio file first", true); return; }
    let pcm;
    try { pcm = await decodeFile(file, RATE); } catch (error) {
      showMessage(this.message, `the browser could not decode ${file.name}: ${error.message}`, true);
      return;
    }
    const step = (RATE * CHUNK_MS) / 1000;
    const t0 = performance.now();
    const token = {};
    this.playing = token;
    for (let i = 0, k = 0; i < pcm.length && this.playing === token; i += step, k++) {
      const wait = t0 + k * CHUNK_MS - performance.now();  // real time, never faster
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      this.send(pcm.slice(i, i + step));
    }
    if (this.playing === token) { this.playing = null; this.endUtterance("end"); }
  }

  async clear() {
    this.playing = null;
    await this.stopTalking();
    this.endUtterance("clear");
    this.player.flush();
    showMessage(this.message, "cleared: back to idle");
  }

  stop() {
    this.playing = null;
    this.stopping = true;
    this.stopTalking();
    if (this.ws) this.ws.close(1000);
    else if (this.resuming) this.finish({ code: 1000, reason: "" });
  }

  onClose(event) {
    const resumable = this.session && !this.stopping && !this.message.classList.contains("error");
    if (resumable && (RESUMABLE.has(event.code) || this.resuming)) {
      this.resume(event);
      return;
    }
    this.finish(event);
  }

  /** Open a new socket and resume the session after `event` closed the last one; retried with
   * back-off for RESUME_FOR_MS, the microphone's chunks meanwhile dropped (real time goes on). */
  resume(event) {
    this.ws = null;
    const now = performance.now();
    if (!this.resuming) this.resuming = { until: now + RESUME_FOR_MS, attempts: 0 };
    if (now > this.resuming.until) { this.resuming = null; this.finish(event); return; }
    const delay = Math.min(2000, 250 * 2 ** this.resuming.attempts);
    this.resuming.attempts += 1;
    this.buttons(false);
    $("live-stop").disabled = false;
    this.setState("reconnecting");
    showMessage(this.message, `the connection dropped (${event.code}): resuming session ${this.session.id}...`);
    setTimeout(() => {
      if (!this.resuming || this.stopping) return;
      this.connect({ type: "resume", api_key: apiKey(), session_id: this.session.id, resume_token: this.resumeToken, last_frame: this.lastIndex });
    }, delay);
  }

  finish(event) {
    this.stopTalking();
    this.playing = null;
    this.buttons(false);
    this.setState("no session");
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    if (this.player) this.player.close();
    if (RESUMABLE.has(event.code)) showMessage(this.message, `the connection closed (${event.code}) and the session could not be resumed: start again`, true);
    else if (event.code === 1000 || event.code === 4000) {
      if (!this.message.classList.contains("error")) showMessage(this.message, "session ended");
    } else if (!this.message.classList.contains("error")) showMessage(this.message, `the session's connection closed (${event.code} ${event.reason})`, true);
    this.ws = null;
  }
}
