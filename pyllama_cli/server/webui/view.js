// Drawing a conversation's messages. Model text goes in as textContent or as the server's sanitized HTML.

import {$, state, el, button, copy} from "./util.js";
import {rendered, renderMarkdown} from "./api.js";
import {regenerate, answer} from "./stream.js";
import {thumbnail, clipChip} from "./media.js";

export function drawMessages() {
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
    if (m.images) {
      const images = el("div", "images");
      images.append(...m.images.map(thumbnail));
      node.append(images);
    }
    if (m.audio) {
      const clips = el("div", "clips");
      clips.append(...m.audio.map((clip) => clipChip(clip)));
      node.append(clips);
    }
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

export function reasoningNode(text) {
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
export function showHTML(body, html) {
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
    const {images, audio} = chat.messages[index];  // an edit changes the text; the media stay
    chat.messages = chat.messages.slice(0, index);
    chat.messages.push({role: "user", content: box.value, ...(images ? {images} : {}), ...(audio ? {audio} : {})});
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
