// The page: views, the API key field, and the three parts (avatars, job, live).
import { apiKey, onKeyRefused, setApiKey } from "./api.js";
import { Avatars } from "./avatars.js";
import { JobView } from "./job.js";
import { LiveView } from "./live.js";

const $ = (id) => document.getElementById(id);

function showView(name) {
  for (const view of document.querySelectorAll(".view")) view.hidden = view.dataset.view !== name;
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.view === name);
  document.body.dataset.view = name;
}

async function main() {
  const config = await fetch("/api/config").then((r) => r.json());
  const keyStatus = $("key-status");
  const keyField = $("api-key");
  keyField.value = apiKey();
  const setStatus = (text, bad) => { keyStatus.textContent = text; keyStatus.classList.toggle("bad", bad); };
  if (!apiKey() && config.require_api_key) setStatus("enter your API key", true);
  onKeyRefused((error) => setStatus(`key refused: ${error.message}`, true));

  const avatars = new Avatars(config);
  const job = new JobView(config, avatars);
  const live = new LiveView(avatars);
  window.lipline = { avatars, job, live };  // for the console (and the browser tests)

  $("key-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    setApiKey(keyField.value.trim());
    setStatus("checking...", false);
    try {
      await avatars.refresh();
      setStatus("key accepted", false);
    } catch { /* refusals are shown by onKeyRefused and the avatars view */ }
  });
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showView(tab.dataset.view));
  showView("avatars");
  if (apiKey() || !config.require_api_key) avatars.refresh().catch(() => {});
  document.body.dataset.ready = "true";
}

main();
