// pyllama's chat page: settings, theme, keys, and start-up. Conversations live in localStorage,
// answers stream from /v1/chat/completions, and Markdown is rendered and sanitized by the server's
// POST /render: model text only ever reaches the page as textContent or as that sanitized HTML.

import {STORE, $, state, load, store, setStatus} from "./util.js";
import {api, loadModels} from "./api.js";
import {newChat, selectChat, drawList, exportChat, importChat, generating, saveChats} from "./chats.js";
import {drawMessages} from "./view.js";
import {send, stop, reattach} from "./stream.js";
import {setModalities, wireAttachments} from "./attach.js";

const THEMES = ["auto", "light", "dark"];

function readSettings() {
  state.settings = {system: "", temperature: "", top_p: "", max_tokens: "", extra: "", ...load(STORE.settings, {})};
}

function openSettings() {
  const s = state.settings;
  $("set-system").value = s.system;
  $("set-temperature").value = s.temperature;
  $("set-top-p").value = s.top_p;
  $("set-max-tokens").value = s.max_tokens;
  $("set-extra").value = s.extra;
  $("settings-error").textContent = "";
  $("settings").showModal();
}

function saveSettings(event) {
  event.preventDefault();
  const extra = $("set-extra").value.trim();
  if (extra) {
    let parsed;
    try {
      parsed = JSON.parse(extra);
    } catch (err) {
      $("settings-error").textContent = "More request fields: " + err.message;
      return;
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
      $("settings-error").textContent = "More request fields must be a JSON object.";
      return;
    }
  }
  state.settings = {system: $("set-system").value, temperature: $("set-temperature").value,
    top_p: $("set-top-p").value, max_tokens: $("set-max-tokens").value, extra};
  store(STORE.settings, state.settings);
  $("settings").close();
}

function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  $("theme").textContent = theme[0].toUpperCase() + theme.slice(1);
  store(STORE.theme, theme);
}

function wire() {
  $("composer").onsubmit = send;
  $("stop").onclick = stop;
  $("input").onkeydown = (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) send(e);
  };
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.running) { e.preventDefault(); stop(); }
  });
  $("new-chat").onclick = () => selectChat(state.current.messages.length ? newChat() : state.current);
  $("import").onclick = () => $("import-file").click();
  $("import-file").onchange = (e) => {
    if (e.target.files[0]) importChat(e.target.files[0]);
    e.target.value = "";
  };
  $("export").onclick = exportChat;
  $("open-settings").onclick = openSettings;
  $("settings-form").onsubmit = saveSettings;
  $("settings-cancel").onclick = () => $("settings").close();
  $("theme").onclick = () => applyTheme(THEMES[(THEMES.indexOf(document.documentElement.dataset.theme) + 1) % 3]);
  $("toggle-sidebar").onclick = () => document.body.classList.toggle("show-sidebar");
  $("model").onchange = () => {
    store(STORE.model, $("model").value);
    state.nCtx = null;
    setModalities(state.modalitiesOf[$("model").value]);
  };
  wireAttachments();
}

function start() {
  applyTheme(THEMES.includes(load(STORE.theme, "auto")) ? load(STORE.theme, "auto") : "auto");
  readSettings();
  state.chats = (load(STORE.chats, []) || []).filter((c) => c && Array.isArray(c.messages));
  const currentId = load(STORE.current, null);
  state.current = state.chats.find((c) => c.id === currentId) || state.chats[0] || newChat();
  wire();
  drawList();
  drawMessages();
  $("input").focus();
  loadModels().catch((err) => setStatus("Cannot reach the server: " + err.message, true));
  resumeAnswers();
}

// An answer that was generating when the page went is read again from its start when its chat is open
// (now, or once opened; the list marks it meanwhile). /v1/streams/lookup is no help here: it names only
// answers still running, and one that finished meanwhile stays readable for the server's grace; a 404
// says it is gone.
function resumeAnswers() {
  if (generating(state.current)) reattach(state.current);
}

start();
