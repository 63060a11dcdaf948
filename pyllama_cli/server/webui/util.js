// The page's shared state, browser storage and DOM helpers.

export const STORE = {settings: "pyllama.settings", chats: "pyllama.conversations", current: "pyllama.current",
  key: "pyllama.apiKey", theme: "pyllama.theme", model: "pyllama.model"};

export const $ = (id) => document.getElementById(id);
export const state = {chats: [], current: null, models: [], nCtx: null, running: null, settings: {},
  vision: false, audio: false, attachments: [], modalitiesOf: {}};

export function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value === null ? fallback : value;
  } catch (_) {
    return fallback;
  }
}

export function store(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (err) {
    setStatus("Could not save in this browser: " + err.message, true);
  }
}

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function button(label, onclick, className) {
  const b = el("button", className, label);
  b.type = "button";
  b.onclick = onclick;
  return b;
}

export async function copy(text, target) {
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

export function setStatus(text, isError) {
  $("status").textContent = text || "";
  $("status").classList.toggle("error", Boolean(isError));
}

// A chat's name from its first message: the words a reader sees, not the Markdown that writes them
// (before: the first 40 raw characters, "**robot** wit").
export function chatTitle(text, limit = 40) {
  const plain = text
    .replace(/```[^\n]*\n?/g, " ")                      // code fences (the code inside stays)
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1")          // links and images: their text
    .replace(/<[^>]+>/g, " ")                            // HTML tags
    .replace(/^\s{0,3}(#{1,6}\s+|>\s?|[-*+]\s+|\d+[.)]\s+)/gm, "")  // headings, quotes, list items
    .replace(/(\*\*|__|~~|\*|_|`)(?=\S)([^]*?\S)\1/g, "$2")  // emphasis, strike-through, inline code
    .replace(/\s+/g, " ")
    .trim();
  if (plain.length <= limit) return plain || "New chat";
  const cut = plain.slice(0, limit);
  const space = cut.lastIndexOf(" ");
  return (space > limit / 2 ? cut.slice(0, space) : cut) + "…";
}

