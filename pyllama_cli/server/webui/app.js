// pyllama's chat page: conversations in localStorage, answers streamed from /v1/chat/completions,
// Markdown rendered and sanitized by the server's POST /render. Model text only ever reaches the
// page as textContent or as that sanitized HTML.
"use strict";

const STORE = {settings: "pyllama.settings", chats: "pyllama.conversations", current: "pyllama.current",
  key: "pyllama.apiKey", theme: "pyllama.theme", model: "pyllama.model"};
const THEMES = ["auto", "light", "dark"];
const RENDER_EVERY_MS = 400;  // how often a streaming answer is re-rendered as Markdown

const $ = (id) => document.getElementById(id);
const state = {chats: [], current: null, models: [], nCtx: null, running: null, settings: {}};

// ------------------------------------------------------------------ storage

function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value === null ? fallback : value;
  } catch (_) {
    return fallback;
  }
}

function store(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (err) {
    setStatus("Could not save in this browser: " + err.message, true);
  }
}

function saveChats() {
  store(STORE.chats, state.chats.map((chat) => ({...chat, messages: chat.messages.map(storedMessage)})));
  store(STORE.current, state.current && state.current.id);
}

function storedMessage(m) {
  const out = {role: m.role, content: m.content};
  for (const k of ["reasoning", "stats", "error"]) if (m[k]) out[k] = m[k];
  return out;
}

// ------------------------------------------------------------------ the API

function authHeaders() {
  const key = load(STORE.key, "");
  return key ? {Authorization: "Bearer " + key} : {};
}

// fetch with the key; a 401 asks for the key and tries again.
async function api(path, options = {}) {
  for (;;) {
    const headers = {...(options.headers || {}), ...authHeaders()};
    if (options.body) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {...options, headers});
    if (response.status !== 401) return response;
    const message = await errorText(response);
    await askKey(load(STORE.key, "") ? message : "");
  }
}

async function errorText(response) {
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

async function loadModels() {
  const response = await api("v1/models");
  if (!response.ok) throw new Error(await errorText(response));
  state.models = (await response.json()).data.map((m) => m.id);
  const picker = $("model");
  picker.replaceChildren(...state.models.map((id) => new Option(id, id)));
  const remembered = load(STORE.model, null);
  picker.value = state.models.includes(remembered) ? remembered : state.models[0];
  picker.hidden = state.models.length < 2;
  // With several models, /props would load the one it names: it is asked after that model has answered.
  if (state.models.length < 2) await loadProps();
}

async function loadProps() {
  const query = state.models.length > 1 ? "?model=" + encodeURIComponent($("model").value) : "";
  const response = await api("props" + query);
  state.nCtx = response.ok ? (await response.json()).default_generation_settings.n_ctx : null;
}

// Renders go one at a time: the server bounds how many a client may have in flight.
const rendered = new Map();
let renderChain = Promise.resolve();

function renderMarkdown(text) {
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

// ------------------------------------------------------------------ settings and theme

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

// ------------------------------------------------------------------ conversations

function newChat() {
  const chat = {id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat",
    created: Date.now(), messages: []};
  state.chats.unshift(chat);
  return chat;
}

function selectChat(chat) {
  stop();
  state.current = chat;
  saveChats();
  drawList();
  drawMessages();
  document.body.classList.remove("show-sidebar");
  $("input").focus();
}

function drawList() {
  const list = $("conversations");
  list.replaceChildren(...state.chats.map((chat) => {
    const item = el("li", chat === state.current ? "chat current" : "chat");
    const open = el("button", "title", chat.title);
    open.type = "button";
    open.onclick = () => selectChat(chat);
    const rename = button("Rename", () => renameChat(chat, item, open), "quiet small");
    const remove = button("Delete", () => {
      if (remove.dataset.armed) return deleteChat(chat);
      remove.dataset.armed = "1";
      remove.textContent = "Delete?";
      setTimeout(() => { delete remove.dataset.armed; remove.textContent = "Delete"; }, 3000);
    }, "quiet small danger");
    item.append(open, rename, remove);
    return item;
  }));
  $("title").textContent = state.current.title;
}

function renameChat(chat, item, open) {
  const input = el("input", "rename");
  input.value = chat.title;
  input.setAttribute("aria-label", "Conversation name");
  const finish = (keep) => {
    if (keep && input.value.trim()) chat.title = input.value.trim();
    saveChats();
    drawList();
  };
  input.onkeydown = (e) => {
    if (e.key === "Enter") finish(true);
    if (e.key === "Escape") { e.stopPropagation(); finish(false); }
  };
  input.onblur = () => finish(true);
  item.replaceChild(input, open);
  input.focus();
  input.select();
}

function deleteChat(chat) {
  state.chats = state.chats.filter((c) => c !== chat);
  if (!state.chats.length) newChat();
  selectChat(state.chats.includes(state.current) ? state.current : state.chats[0]);
}

// The same JSON as `pyllama chat`'s /save: the system message first, if any, then the turns.
function exportChat() {
  const chat = state.current;
  const system = systemPrompt(chat);
  const messages = [...(system ? [{role: "system", content: system}] : []),
    ...chat.messages.filter((m) => !m.error).map((m) => ({role: m.role, content: m.content}))];
  const blob = new Blob([JSON.stringify(messages, null, 2) + "\n"], {type: "application/json"});
  const link = el("a");
  link.href = URL.createObjectURL(blob);
  link.download = (chat.title.replace(/[^\w.-]+/g, "_").replace(/^[._]+/, "") || "chat") + ".json";
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

function importChat(file) {
  file.text().then((text) => {
    const messages = checkedMessages(JSON.parse(text));
    const chat = newChat();
    chat.title = file.name.replace(/\.json$/i, "") || "Imported chat";
    if (messages.length && messages[0].role === "system") chat.system = messages.shift().content;
    chat.messages = messages;
    selectChat(chat);
    setStatus("Imported " + file.name);
  }).catch((err) => setStatus("Cannot import " + file.name + ": " + err.message, true));
}

// What /load accepts: a list of {role, content}, a system message only first, then user and assistant.
function checkedMessages(data) {
  if (!Array.isArray(data)) throw new Error("not a list of messages");
  return data.map((m, i) => {
    if (!m || typeof m.content !== "string" || typeof m.role !== "string") {
      throw new Error(`message ${i} needs a "role" and a text "content"`);
    }
    if (!(m.role === "user" || m.role === "assistant" || (m.role === "system" && i === 0))) {
      throw new Error(`message ${i} has the role "${m.role}", which is not one a chat takes`);
    }
    return {role: m.role, content: m.content};
  });
}

function systemPrompt(chat) {
  return chat.system !== undefined ? chat.system : state.settings.system;
}

// ------------------------------------------------------------------ drawing messages

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, onclick, className) {
  const b = el("button", className, label);
  b.type = "button";
  b.onclick = onclick;
  return b;
}

function drawMessages() {
  const box = $("messages");
  const chat = state.current;
  box.replaceChildren(...chat.messages.map((m, i) => messageNode(chat, m, i)));
  if (!chat.messages.length) box.append(el("p", "hint", "Ask anything. Enter sends, Shift+Enter adds a new line, " +
    "Esc stops the answer."));
  box.scrollTop = box.scrollHeight;
}

function messageNode(chat, m, index) {
  const node = el("article", "message " + m.role);
  node.dataset.index = index;
  if (m.role === "user") {
    node.append(el("div", "body plain", m.content),
      actions(button("Edit", () => editMessage(chat, index, node), "quiet small edit"),
        button("Copy", (e) => copy(m.content, e.target), "quiet small copy")));
    return node;
  }
  if (m.reasoning) node.append(reasoningNode(m.reasoning));
  const body = el("div", "body");
  node.append(body);
  showAnswer(body, m);
  node.append(el("p", "stats", statsText(m)));
  const last = index === chat.messages.length - 1;
  node.append(actions(button("Copy", (e) => copy(m.content, e.target), "quiet small copy"),
    ...(last ? [button("Regenerate", regenerate, "quiet small regenerate")] : [])));
  return node;
}

function reasoningNode(text) {
  const details = el("details", "reasoning");
  details.append(el("summary", null, "Reasoning"), el("div", "plain", text));
  return details;
}

function actions(...buttons) {
  const bar = el("div", "actions");
  bar.append(...buttons);
  return bar;
}

function showAnswer(body, m) {
  body.classList.toggle("error", Boolean(m.error));
  if (m.error) return void (body.textContent = m.error);
  if (rendered.has(m.content)) return void showHTML(body, rendered.get(m.content));
  body.textContent = m.content;
  body.classList.add("plain");
  if (m.content) {
    renderMarkdown(m.content).then((html) => {
      if (body.isConnected && m.content === body.dataset.pending) showHTML(body, html);
    }, () => {});
    body.dataset.pending = m.content;
  }
}

// `html` comes from the server's sanitizer; the copy buttons are added here, as nodes.
function showHTML(body, html) {
  body.classList.remove("plain");
  body.innerHTML = html;
  for (const pre of body.querySelectorAll("pre")) {
    const code = pre.textContent;
    const wrap = el("div", "code");
    pre.replaceWith(wrap);
    wrap.append(button("Copy", (e) => copy(code, e.target), "quiet small copy-code"), pre);
  }
}

function statsText(m) {
  const s = m.stats;
  if (!s) return "";
  const parts = [s.tokens + " tokens"];
  if (s.tps) parts.push(s.tps.toFixed(1) + " t/s");
  if (s.ttft !== undefined) parts.push("TTFT " + Math.round(s.ttft) + " ms");
  if (s.context) parts.push("context " + s.context + (s.nCtx ? "/" + s.nCtx : ""));
  if (s.stopped) parts.push("stopped");
  return parts.join(" · ");
}

function editMessage(chat, index, node) {
  if (state.running) return;
  const box = el("textarea", "edit-box");
  box.value = chat.messages[index].content;
  box.rows = Math.min(12, box.value.split("\n").length + 1);
  const resend = () => {
    if (!box.value.trim()) return;
    chat.messages = chat.messages.slice(0, index);
    chat.messages.push({role: "user", content: box.value});
    drawMessages();
    answer(chat);
  };
  box.onkeydown = (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); resend(); }
    if (e.key === "Escape") { e.stopPropagation(); drawMessages(); }
  };
  node.replaceChildren(box, actions(button("Send", resend, "small"), button("Cancel", drawMessages, "quiet small")));
  box.focus();
}

async function copy(text, target) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {  // no clipboard API outside a secure context (plain http to another machine)
    const area = el("textarea");
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  const label = target.textContent;
  target.textContent = "Copied";
  setTimeout(() => { target.textContent = label; }, 1200);
}

function setStatus(text, isError) {
  $("status").textContent = text || "";
  $("status").classList.toggle("error", Boolean(isError));
}

// ------------------------------------------------------------------ asking and streaming

function send(event) {
  if (event) event.preventDefault();
  const text = $("input").value;
  if (!text.trim() || state.running) return;
  const chat = state.current;
  if (!chat.messages.length && chat.title === "New chat") chat.title = text.trim().split("\n")[0].slice(0, 40);
  chat.messages.push({role: "user", content: text});
  $("input").value = "";
  drawList();
  drawMessages();
  answer(chat);
}

function regenerate() {
  const chat = state.current;
  if (state.running) return;
  if (chat.messages.length && chat.messages[chat.messages.length - 1].role === "assistant") chat.messages.pop();
  drawMessages();
  answer(chat);
}

function stop() {
  if (state.running) state.running.controller.abort();
}

function requestBody(chat) {
  const s = state.settings;
  const system = systemPrompt(chat);
  const history = chat.messages.filter((m) => !m.error && (m.content || m.role === "user"))
    .map((m) => ({role: m.role, content: m.content}));
  const body = {model: $("model").value || undefined, stream: true, stream_options: {include_usage: true},
    messages: [...(system ? [{role: "system", content: system}] : []), ...history]};
  if (s.temperature !== "") body.temperature = Number(s.temperature);
  if (s.top_p !== "") body.top_p = Number(s.top_p);
  if (s.max_tokens !== "") body.max_tokens = Number(s.max_tokens);
  return {...body, ...(s.extra ? JSON.parse(s.extra) : {})};
}

async function answer(chat) {
  const m = {role: "assistant", content: ""};
  const body = requestBody(chat);
  chat.messages.push(m);
  saveChats();
  drawMessages();
  const node = $("messages").lastElementChild;
  const run = {controller: new AbortController(), chat, m, node, started: performance.now(), chunks: 0};
  state.running = run;
  setRunning(true);
  setStatus("");
  try {
    const response = await api("v1/chat/completions", {method: "POST", body: JSON.stringify(body),
      signal: run.controller.signal});
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response, (chunk) => onChunk(run, chunk));
    finish(run, false);
  } catch (err) {
    if (err.name === "AbortError") finish(run, true);
    else fail(run, err.message);
  }
}

// Server-sent events: `data: {json}` lines, blank lines between events, `data: [DONE]` at the end.
async function readEvents(response, onData) {
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

function onChunk(run, chunk) {
  if (chunk.error) throw new Error(chunk.error.message);
  if (chunk.usage) run.usage = chunk.usage;
  const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
  const text = delta.content || "";
  const reasoning = delta.reasoning_content || "";
  if (!text && !reasoning) return;
  const now = performance.now();
  if (run.first === undefined) run.first = now;
  run.last = now;
  run.chunks += 1;
  if (reasoning) run.m.reasoning = (run.m.reasoning || "") + reasoning;
  run.m.content += text;
  // The page is redrawn once a frame however fast tokens come, so it stays responsive.
  if (!run.frame) run.frame = requestAnimationFrame(() => { run.frame = 0; drawRunning(run); });
  if (text) scheduleRender(run);
}

// The streaming answer: its Markdown as last rendered, then the text that came since, as text.
function drawRunning(run) {
  if (state.running !== run || !run.node.isConnected) return;
  if (run.m.reasoning) {
    let details = run.node.querySelector("details.reasoning");
    if (!details) run.node.querySelector(".body").before(details = reasoningNode(""));
    details.querySelector(".plain").textContent = run.m.reasoning;
  }
  const body = run.node.querySelector(".body");
  if (run.tail) run.tail.textContent = run.m.content.slice(run.renderedLength);
  else body.textContent = run.m.content;
  const box = $("messages");
  if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
}

// While streaming, the answer is re-rendered as Markdown a few times a second.
function scheduleRender(run) {
  if (run.timer) return;
  run.timer = setTimeout(() => {
    const text = run.m.content;
    renderMarkdown(text).then((html) => {
      if (state.running !== run || !run.m.content.startsWith(text)) return;
      const body = run.node.querySelector(".body");
      showHTML(body, html);
      run.renderedLength = text.length;
      run.tail = el("span", "plain tail");
      body.append(run.tail);
      drawRunning(run);
      saveChats();  // a reload mid-answer keeps what came so far
    }, () => {}).finally(() => { run.timer = null; });
  }, RENDER_EVERY_MS);
}

function finish(run, stopped) {
  const u = run.usage;
  const tokens = u ? u.completion_tokens : run.chunks;
  const seconds = run.first !== undefined && run.last > run.first ? (run.last - run.first) / 1000 : 0;
  run.m.stats = {tokens, ttft: run.first !== undefined ? run.first - run.started : undefined,
    tps: seconds && tokens > 1 ? (tokens - 1) / seconds : 0, stopped,
    context: u ? u.total_tokens : undefined, nCtx: state.nCtx};
  done(run);
}

function fail(run, message) {
  if (!run.m.content) run.m.error = "Error: " + message;
  else run.m.stats = {tokens: run.chunks, stopped: true};
  setStatus(message, true);
  done(run);
}

async function done(run) {
  clearTimeout(run.timer);
  cancelAnimationFrame(run.frame);
  if (state.nCtx === null && run.m.stats) {  // first answer of this model (or the page opened while it loaded)
    await loadProps().catch(() => {});
    run.m.stats.nCtx = state.nCtx;
  }
  state.running = null;
  setRunning(false);
  saveChats();
  if (state.current === run.chat) drawMessages();
}

function setRunning(running) {
  $("send").hidden = running;
  $("stop").hidden = !running;
  document.body.classList.toggle("running", running);
}

// ------------------------------------------------------------------ start

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
  };
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
}

start();
