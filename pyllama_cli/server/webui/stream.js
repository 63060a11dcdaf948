// Asking: a streamed answer read from /v1/chat/completions, stop, regenerate, and the stats.
// Each answer is sent with its chat's id as X-Conversation-Id, so the server keeps generating it when the
// page goes away; the message keeps that id (`stream`) until it ends, and a reloaded page reattaches to
// GET /v1/stream from byte 0 (docs/streams.md). Stop is a DELETE, since a closed connection no longer is.

import {$, state, el, setStatus, chatTitle} from "./util.js";
import {api, errorText, loadProps, renderMarkdown, readEvents} from "./api.js";
import {saveChats, drawList, systemPrompt} from "./chats.js";
import {drawMessages, reasoningNode, showHTML} from "./view.js";
import {takeAttachments} from "./attach.js";
import {apiContent} from "./media.js";

const RENDER_EVERY_MS = 400;  // how often a streaming answer is re-rendered as Markdown

export function send(event) {
  if (event) event.preventDefault();
  const text = $("input").value;
  if ((!text.trim() && !state.attachments.length) || state.running) return;
  const chat = state.current;
  const media = takeAttachments();
  if (!chat.messages.length && chat.title === "New chat") chat.title = text.trim() ? chatTitle(text) : media.images ? "Image" : "Audio";
  chat.messages.push({role: "user", content: text, ...media});
  $("input").value = "";
  drawList();
  drawMessages();
  answer(chat);
}

export function regenerate() {
  const chat = state.current;
  if (state.running) return;
  if (chat.messages.length && chat.messages[chat.messages.length - 1].role === "assistant") chat.messages.pop();
  drawMessages();
  answer(chat);
}

export function stop() {
  const run = state.running;
  if (!run) return;
  run.controller.abort();
  if (run.m.stream) api("v1/stream?conv_id=" + encodeURIComponent(run.m.stream), {method: "DELETE"}).catch(() => {});
}

const streamPath = (id) => "v1/stream?conv_id=" + encodeURIComponent(id) + "&from=0";

function requestBody(chat) {
  const s = state.settings;
  const system = systemPrompt(chat);
  const history = chat.messages.filter((m) => !m.error && (m.content || m.role === "user"))
    .map((m) => ({role: m.role, content: apiContent(m)}));
  const body = {model: $("model").value || undefined, stream: true, stream_options: {include_usage: true},
    messages: [...(system ? [{role: "system", content: system}] : []), ...history]};
  if (s.temperature !== "") body.temperature = Number(s.temperature);
  if (s.top_p !== "") body.top_p = Number(s.top_p);
  if (s.max_tokens !== "") body.max_tokens = Number(s.max_tokens);
  // The extra fields first: the page's own (stream, messages, model) always win.
  return {...(s.extra ? JSON.parse(s.extra) : {}), ...body};
}

export function answer(chat) {
  const m = {role: "assistant", content: "", stream: chat.id};
  const body = requestBody(chat);
  chat.messages.push(m);
  saveChats();
  drawMessages();
  return follow(chat, m, () => api("v1/chat/completions", {method: "POST", body: JSON.stringify(body),
    headers: {"X-Conversation-Id": chat.id}, signal: state.running.controller.signal}));
}

// The last answer of `chat` again, from the start of its stream: it was generating when the page went.
export function reattach(chat) {
  const m = chat.messages[chat.messages.length - 1];
  if (!m || !m.stream || state.running) return;
  const kept = m.content;  // what came before the page went: all there is if the server no longer has it
  m.content = "";
  delete m.reasoning;
  drawMessages();
  return follow(chat, m, () => api(streamPath(m.stream), {signal: state.running.controller.signal}), kept);
}

// `kept`: the text a reattached answer had, put back if the server no longer has its stream.
async function follow(chat, m, request, kept) {
  const node = $("messages").lastElementChild;
  const run = {controller: new AbortController(), chat, m, node, started: performance.now(), chunks: 0};
  state.running = run;
  setRunning(true);
  drawList();
  setStatus("");
  try {
    const response = await request();
    if (kept !== undefined && response.status === 404) {
      m.content = kept;
      return fail(run, "the answer was no longer on the server");
    }
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response, (chunk) => onChunk(run, chunk));
    finish(run, false);
  } catch (err) {
    if (err.name === "AbortError") finish(run, true);
    else fail(run, err.message);
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
  delete run.m.stream;
  clearTimeout(run.timer);
  cancelAnimationFrame(run.frame);
  if (state.nCtx === null && run.m.stats) {  // first answer of this model (or the page opened while it loaded)
    await loadProps().catch(() => {});
    run.m.stats.nCtx = state.nCtx;
  }
  state.running = null;
  setRunning(false);
  saveChats();
  drawList();
  if (state.current === run.chat) drawMessages();
}

function setRunning(running) {
  $("send").hidden = running;
  $("stop").hidden = !running;
  document.body.classList.toggle("running", running);
}
