// Avatars: upload (with progress), the list with thumbnails, delete. The gateway keeps no image to
// show, so the thumbnail is drawn here from the file at upload time and kept in this browser's
// localStorage under the avatar's id (an avatar uploaded elsewhere shows its initial instead).
import { api, mib, showError, showMessage, upload } from "./api.js";

const $ = (id) => document.getElementById(id);
const THUMB = "lipline.thumb.";
const THUMB_SIZE = 160;

async function thumbnailOf(file) {
  const url = URL.createObjectURL(file);
  try {
    let source;
    if (file.type.startsWith("video/")) {
      source = document.createElement("video");
      source.muted = true;
      source.src = url;
      await new Promise((ok, fail) => { source.onloadeddata = ok; source.onerror = fail; });
    } else {
      source = new Image();
      source.src = url;
      await source.decode();
    }
    const canvas = document.createElement("canvas");
    const w = source.videoWidth || source.naturalWidth, h = source.videoHeight || source.naturalHeight;
    const scale = THUMB_SIZE / Math.max(w, h);
    canvas.width = Math.round(w * scale);
    canvas.height = Math.round(h * scale);
    canvas.getContext("2d").drawImage(source, 0, 0, canvas.width, canvas.height);
    return canvas.toDataURL("image/jpeg", 0.8);
  } catch {
    return "";
  } finally {
    URL.revokeObjectURL(url);
  }
}

export class Avatars {
  constructor(config) {
    this.config = config;
    this.list = [];
    this.listeners = [];
    this.message = $("avatar-message");
    this.listFailed = false;  // the message shows a failed refresh (cleared by the next good one), not an upload's error
    $("avatar-upload").addEventListener("click", () => this.uploadSelected());
    $("avatar-refresh").addEventListener("click", () => this.refresh().catch(() => {}));
  }

  onChange(listener) { this.listeners.push(listener); }

  async refresh() {
    try {
      const reply = await api("GET", "/api/avatars");
      this.list = reply.avatars || [];
      this.render();
      if (this.listFailed) showMessage(this.message, "");  // this refresh's own earlier error, now over
      this.listFailed = false;
      const showsAnError = this.message.classList.contains("error");  // an upload's or a delete's: left for the user
      if (!this.list.length && !showsAnError) showMessage(this.message, "no avatars yet: upload a photo or a short video");
    } catch (error) {
      if (error.code === "UNAUTHENTICATED") { this.list = []; this.render(); }  // nothing shown for a refused key
      showError(this.message, error);
      this.listFailed = true;
      throw error;
    }
  }

  async uploadSelected() {
    const file = $("avatar-file").files[0];
    if (!file) { showMessage(this.message, "choose a photo or a video first", true); return; }
    if (file.size > this.config.max_avatar_bytes) {
      showMessage(this.message, `${file.name} is ${mib(file.size)}: larger than the limit of ${mib(this.config.max_avatar_bytes)} for an avatar upload`, true);
      return;
    }
    const bar = $("avatar-progress"), text = $("avatar-progress-text");
    bar.hidden = false;
    bar.value = 0;
    showMessage(this.message, `uploading ${file.name}...`);
    const thumb = await thumbnailOf(file);
    const name = $("avatar-name").value.trim() || file.name;
    try {
      const avatar = await upload(`/api/avatars?name=${encodeURIComponent(name)}`, file, (f) => {
        bar.value = Math.round(f * 100);
        text.textContent = f < 1 ? `${Math.round(f * 100)} %` : "uploaded; finding the face...";
      });
      if (thumb) localStorage.setItem(THUMB + avatar.id, thumb);
      showMessage(this.message, `avatar ${avatar.name || avatar.id} ready: ${avatar.frame_count} frame(s), face found in ${avatar.faces_found}`);
      text.textContent = "";
      await this.refresh();
    } catch (error) {
      text.textContent = "";
      showError(this.message, error);
    } finally {
      bar.hidden = true;
    }
  }

  async remove(avatar) {
    try {
      await api("DELETE", `/api/avatars/${encodeURIComponent(avatar.id)}`);
      localStorage.removeItem(THUMB + avatar.id);
      showMessage(this.message, `deleted ${avatar.name || avatar.id}`);
      await this.refresh();
    } catch (error) {
      showError(this.message, error);
    }
  }

  render() {
    const ul = $("avatar-list");
    ul.replaceChildren();
    for (const a of this.list) {
      const li = document.createElement("li");
      li.className = "avatar";
      li.dataset.id = a.id;
      const thumb = localStorage.getItem(THUMB + a.id);
      let picture;
      if (thumb) {
        picture = document.createElement("img");
        picture.src = thumb;
        picture.alt = a.name;
      } else {
        picture = document.createElement("div");
        picture.className = "placeholder";
        picture.textContent = (a.name || "?").slice(0, 1).toUpperCase();
      }
      const title = document.createElement("div");
      title.textContent = a.name || a.id;
      const meta = document.createElement("div");
      meta.className = "meta";
      meta.textContent = `${a.width}x${a.height}, ${a.frame_count} frame(s)`;
      const del = document.createElement("button");
      del.type = "button";
      del.className = "delete";
      del.textContent = "Delete";
      del.addEventListener("click", () => this.remove(a));
      li.append(picture, title, meta, del);
      ul.append(li);
    }
    for (const select of document.querySelectorAll(".avatar-select")) {
      const chosen = select.value;
      select.replaceChildren(...this.list.map((a) => new Option(`${a.name || a.id} (${a.width}x${a.height})`, a.id)));
      if (this.list.some((a) => a.id === chosen)) select.value = chosen;
    }
    this.listeners.forEach((f) => f(this.list));
  }
}
