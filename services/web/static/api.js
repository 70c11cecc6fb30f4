// The page's calls to services/web: the API key travels in the X-Api-Key header (never in a URL),
// and is kept in this tab's sessionStorage only (gone when the tab closes).

const KEY_STORE = "lipline.apiKey";
const keyListeners = [];

export function apiKey() { return sessionStorage.getItem(KEY_STORE) || ""; }
export function setApiKey(key) { sessionStorage.setItem(KEY_STORE, key); }

/** A gateway (or web server) refusal: `code` is the gRPC status name, `message` the gateway's words. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Called with every UNAUTHENTICATED answer (the page's key field shows it). */
export function onKeyRefused(listener) { keyListeners.push(listener); }

function refused(error) {
  if (error.code === "UNAUTHENTICATED") keyListeners.forEach((f) => f(error));
  return error;
}

async function errorOf(response) {
  let body = {};
  try { body = await response.json(); } catch { /* not JSON: a proxy's page */ }
  const message = body.error || `${response.status} ${response.statusText}`;
  return refused(new ApiError(response.status, body.code || String(response.status), message));
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { "X-Api-Key": key, ...extra } : extra;
}

export async function api(method, path, body) {
  const response = await fetch(path, { method, body, headers: headers() });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

/** POST a file with upload progress (fetch has none): onProgress(fraction). */
export function upload(path, file, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", path);
    for (const [k, v] of Object.entries(headers({ "Content-Type": "application/octet-stream" }))) xhr.setRequestHeader(k, v);
    xhr.upload.onprogress = (e) => { if (e.lengthComputable) onProgress(e.loaded / e.total); };
    xhr.onload = () => {
      let body = {};
      try { body = JSON.parse(xhr.responseText); } catch { /* empty */ }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else reject(refused(new ApiError(xhr.status, body.code || String(xhr.status), body.error || `${xhr.status} ${xhr.statusText}`)));
    };
    xhr.onerror = () => reject(new ApiError(0, "UNAVAILABLE", "the web server could not be reached"));
    xhr.send(file);
  });
}

/** The lines of an NDJSON response as objects, as they arrive (WatchJob). */
export async function* ndjson(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let newline;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, newline).trim();
      buffer = buffer.slice(newline + 1);
      if (!line) continue;
      const item = JSON.parse(line);
      if (item.error) throw refused(new ApiError(0, item.code, item.error));
      yield item;
    }
  }
}

/** A response body as a Blob (the MP4: a <video> cannot send the key header itself). */
export async function blob(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await errorOf(response);
  try {
    return await response.blob();
  } catch {
    // The server cuts a download it cannot finish (a damaged output, the gateway gone): keep nothing.
    throw new ApiError(0, "", "the download broke off before its end, so nothing was kept: try again (the web server's log says why)");
  }
}

export function showMessage(element, text, isError = false) {
  element.textContent = text;
  element.classList.toggle("error", isError);
}

export function showError(element, error) {
  const code = error.code && error.code !== String(error.status) ? `${error.code}: ` : "";
  showMessage(element, `${code}${error.message}`, true);
}

export function mib(bytes) { return `${(bytes / 2 ** 20).toFixed(bytes < 2 ** 20 ? 2 : 1)} MiB`; }
