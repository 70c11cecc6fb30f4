// A job: pick an avatar, an audio file (or a recording), options; submit; progress and ETA from
// WatchJob; then the MP4 in a <video> and as a download.
import { blob, mib, ndjson, showError, showMessage, upload } from "./api.js";
import { startMicrophone, wavFile } from "./audio.js";

const $ = (id) => document.getElementById(id);
const RECORD_RATE = 16000;
const DONE = new Set(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"]);

function seconds(s) { return s >= 60 ? `${Math.floor(s / 60)} min ${Math.round(s % 60)} s` : `${s.toFixed(1)} s`; }

export class JobView {
  constructor(config, avatars) {
    this.config = config;
    this.avatars = avatars;
    this.recording = null;
    this.recorded = null;
    this.outputUrl = "";
    this.message = $("job-message");
    $("job-submit").addEventListener("click", () => this.submit());
    $("job-record").addEventListener("click", () => this.toggleRecording());
    $("job-audio-file").addEventListener("change", () => { this.recorded = null; $("job-record-status").textContent = ""; });
  }

  async toggleRecording() {
    const status = $("job-record-status");
    if (this.recording) {
      const { stop, chunks } = this.recording;
      this.recording = null;
      await stop();
      this.recorded = wavFile(chunks, RECORD_RATE);
      $("job-record").textContent = "Record";
      status.textContent = `recorded ${(chunks.length * 0.02).toFixed(1)} s (used instead of the file)`;
      return;
    }
    const chunks = [];
    try {
      const stop = await startMicrophone(RECORD_RATE, (c) => chunks.push(c));
      this.recording = { stop, chunks };
      $("job-record").textContent = "Stop recording";
      status.textContent = "recording...";
    } catch (error) {
      showMessage(this.message, `the microphone could not be opened: ${error.message}`, true);
    }
  }

  async submit() {
    const avatarId = $("job-avatar").value;
    const file = this.recorded || $("job-audio-file").files[0];
    if (!avatarId) { showMessage(this.message, "upload an avatar first (Avatars)", true); return; }
    if (!file) { showMessage(this.message, "choose an audio file or record one", true); return; }
    if (file.size > this.config.max_audio_bytes) {
      showMessage(this.message, `${file.name} is ${mib(file.size)}: larger than the limit of ${mib(this.config.max_audio_bytes)} for a job's audio`, true);
      return;
    }
    const params = new URLSearchParams({
      avatar_id: avatarId,
      super_resolution: $("job-sr").checked ? "true" : "false",
      loop: $("job-loop").value,
    });
    $("job-result").hidden = true;
    this.setProgress(0, "uploading the audio...");
    showMessage(this.message, "");
    try {
      const job = await upload(`/api/jobs?${params}`, file, (f) => this.setProgress(0, `uploading the audio: ${Math.round(f * 100)} %`));
      this.setProgress(0, `job ${job.id} queued`);
      await this.follow(job);
    } catch (error) {
      this.setProgress(0, "");
      showError(this.message, error);
    }
  }

  setProgress(fraction, text) {
    $("job-progress").value = Math.round(fraction * 100);
    $("job-progress-text").textContent = text;
  }

  async follow(job) {
    let last = job;
    for await (const event of ndjson(`/api/jobs/${encodeURIComponent(job.id)}/watch`)) {
      last = event;
      const pct = Math.round((event.progress || 0) * 100);
      const eta = event.state === "JOB_STATE_RUNNING" && event.eta_seconds > 0 ? `, about ${seconds(event.eta_seconds)} left` : "";
      const stage = event.stage ? ` (${event.stage})` : "";
      this.setProgress(event.progress || 0, `${pct} %${stage}${eta}`);
      if (DONE.has(event.state)) break;
    }
    if (last.state !== "JOB_STATE_SUCCEEDED") {
      showMessage(this.message, `job ${last.state.replace("JOB_STATE_", "").toLowerCase()}: ${last.error || "no reason given"}`, true);
      return;
    }
    this.setProgress(1, `100 %: ${last.audio_seconds.toFixed(2)} s of audio rendered in ${seconds(last.elapsed_seconds)}`);
    const mp4 = await blob(`/api/jobs/${encodeURIComponent(job.id)}/output`);
    if (this.outputUrl) URL.revokeObjectURL(this.outputUrl);
    this.outputUrl = URL.createObjectURL(new Blob([mp4], { type: "video/mp4" }));
    const video = $("job-video");
    video.src = this.outputUrl;
    const link = $("job-download");
    link.href = this.outputUrl;
    link.download = `lipline-${job.id}.mp4`;
    $("job-result").hidden = false;
    showMessage(this.message, `done: ${mib(mp4.size)} MP4`);
  }
}
