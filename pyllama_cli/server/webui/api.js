// The server's public API, with the key when it needs one; Markdown renders one at a time.

import {STORE, $, state, load, store} from "./util.js";
import {setModalities} from "./attach.js";

function authHeaders() {
  const key = load(STORE.key, "");
  return key ? {Authorization: "Bearer " + key} : {};
}

// fetch with the key; a 401 asks for the key and tries again.
export async function api(path, options = {}) {
  for (;;) {
    const headers = {...(options.headers || {}), ...authHeaders()};
    if (options.body) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {...options, headers});
    if (response.status !== 401) return response;
    const message = await errorText(response);
    await askKey(load(STORE.key, "") ? message : "");
  }
}

export async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || response.statusText;
  } catch (_) {
    return response.status + " " + response.statusText;
  }
}

function askKey(problem) {
  const dialog = $("key-dialog");
  $("key-error").textContent = problem ? "The server said: " + problem : "";
  $("key-input").value = "";
  return new Promise((resolve) => {
    dialog.onclose = () => {
      const key = $("key-input").value.trim();
      if (!key) return void dialog.showModal();  // the page cannot work without it
      store(STORE.key, key);
      resolve();
    };
    if (!dialog.open) dialog.showModal();
  });
}

export async function loadModels() {
  const response = await api("v1/models");
  if (!response.ok) throw new Error(await errorText(response));
  const data = (await response.json()).data;
  state.models = data.map((m) => m.id);
  // A model's modalities are known once it is loaded (its `meta`); /props says them for the one it loads.
  state.modalitiesOf = Object.fromEntries(data.map((m) => [m.id, m.meta && m.meta.modalities]));
  const picker = $("model");
  picker.replaceChildren(...state.models.map((id) => new Option(id, id)));
  const remembered = load(STORE.model, null);
  picker.value = state.models.includes(remembered) ? remembered : state.models[0];
  // Always shown, so the page says which model answers; with one model there is nothing to pick.
  picker.disabled = state.models.length < 2;
  setModalities(state.modalitiesOf[picker.value]);
  // With several models, /props would load the one it names: it is asked after that model has answered.
  if (state.models.length < 2) await loadProps();
}

export async function loadProps() {
  const query = state.models.length > 1 ? "?model=" + encodeURIComponent($("model").value) : "";
  const response = await api("props" + query);
  const props = response.ok ? await response.json() : null;
  state.nCtx = props ? props.default_generation_settings.n_ctx : null;
  if (props && props.modalities) {
    state.modalitiesOf[$("model").value] = props.modalities;
    setModalities(props.modalities);
  }
}

// Renders go one at a time: the server bounds how many a client may have in flight.
export const rendered = new Map();
let renderChain = Promise.resolve();

export function renderMarkdown(text) {
  if (rendered.has(text)) return Promise.resolve(rendered.get(text));
  const job = renderChain.then(async () => {
    const response = await api("render", {method: "POST", body: JSON.stringify({text})});
    if (!response.ok) throw new Error(await errorText(response));
    const {html} = await response.json();
    if (rendered.size > 200) rendered.delete(rendered.keys().next().value);
    rendered.set(text, html);
    return html;
  });
  renderChain = job.catch(() => {});
  return job;
}

// Server-sent events: `data: {json}` lines, blank lines between events, `data: [DONE]` at the end.
export async function readEvents(response, onData) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value;
    const lines = buffer.split("\n");
    buffer = lines.pop();
    for (const line of lines) {
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") return;
      onData(JSON.parse(data));
    }
  }
}
