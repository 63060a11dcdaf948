// Conversations in localStorage, and their export and import as `pyllama chat`'s /save JSON.

import {STORE, $, state, store, el, button, setStatus} from "./util.js";
import {drawMessages} from "./view.js";
import {stop, reattach} from "./stream.js";
import {keptClip} from "./media.js";

export function saveChats() {
  store(STORE.chats, state.chats.map((chat) => ({...chat, messages: chat.messages.map(storedMessage)})));
  store(STORE.current, state.current && state.current.id);
}

function storedMessage(m) {
  const out = {role: m.role, content: m.content};
  for (const k of ["images", "reasoning", "stats", "error", "stream"]) if (m[k]) out[k] = m[k];
  if (m.audio) out.audio = m.audio.map(keptClip);
  return out;
}

export function newChat() {
  const chat = {id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat",
    created: Date.now(), messages: []};
  state.chats.unshift(chat);
  return chat;
}

export function selectChat(chat) {
  stop();
  state.current = chat;
  saveChats();
  drawList();
  drawMessages();
  document.body.classList.remove("show-sidebar");
  $("input").focus();
  setTimeout(() => reattach(chat), 0);  // once a stopped answer has let go of the page
}

// A chat whose last answer was still generating on the server (its stream id is kept until it ends).
export function generating(chat) {
  const last = chat.messages[chat.messages.length - 1];
  return Boolean(last && last.stream);
}

export function drawList() {
  const list = $("conversations");
  list.replaceChildren(...state.chats.map((chat) => {
    const item = el("li", (chat === state.current ? "chat current" : "chat") + (generating(chat) ? " generating" : ""));
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
export function exportChat() {
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

export function importChat(file) {
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

export function systemPrompt(chat) {
  return chat.system !== undefined ? chat.system : state.settings.system;
}
