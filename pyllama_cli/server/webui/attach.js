// Images for the next message: the Image button, paste and drag-and-drop. Offered only when the served
// model can see (the modalities /v1/models and /props report). They go as OpenAI image_url parts with
// data: URLs, before the message's text, and stay in the stored message, so its thumbnails survive a reload.

import {$, state, el, button, setStatus} from "./util.js";

// What the server decodes (docs/multimodal.md); anything else would be a 400 after the upload.
const TYPES = ["image/png", "image/jpeg", "image/gif", "image/bmp"];

export function setVision(vision) {
  state.vision = Boolean(vision);
  $("attach").hidden = !state.vision;
  if (!state.vision && state.attachments.length) takeAttachments();
}

export function wireAttachments() {
  $("attach").onclick = () => $("attach-file").click();
  $("attach-file").onchange = (e) => {
    addFiles(e.target.files);
    e.target.value = "";
  };
  $("input").addEventListener("paste", (e) => {
    const files = [...((e.clipboardData && e.clipboardData.files) || [])];
    if (!files.length) return;  // plain text pastes as usual
    e.preventDefault();
    addFiles(files);
  });
  const main = document.querySelector("main");
  main.addEventListener("dragover", (e) => {
    if (!state.vision || !e.dataTransfer.types.includes("Files")) return;
    e.preventDefault();
    main.classList.add("dropping");
  });
  main.addEventListener("dragleave", (e) => {
    if (!main.contains(e.relatedTarget)) main.classList.remove("dropping");
  });
  main.addEventListener("drop", (e) => {
    main.classList.remove("dropping");
    if (!e.dataTransfer.files.length) return;
    e.preventDefault();
    addFiles(e.dataTransfer.files);
  });
}

function addFiles(files) {
  for (const file of files) {
    if (!state.vision) return setStatus("This model cannot see images (it was started without --mmproj).", true);
    if (!TYPES.includes(file.type)) {
      setStatus(`Cannot attach ${file.name}: only PNG, JPEG, GIF and BMP images are taken.`, true);
      continue;
    }
    const reader = new FileReader();
    reader.onload = () => {
      state.attachments.push(reader.result);
      drawAttachments();
    };
    reader.onerror = () => setStatus(`Cannot read ${file.name}.`, true);
    reader.readAsDataURL(file);
  }
}

// The attachments of the message being written, each with a button that removes it.
function drawAttachments() {
  $("attachments").replaceChildren(...state.attachments.map((url, i) => {
    const item = el("figure", "attachment");
    item.append(thumbnail(url), button("×", () => {
      state.attachments.splice(i, 1);
      drawAttachments();
    }, "quiet small remove"));
    item.lastChild.setAttribute("aria-label", "Remove this image");
    return item;
  }));
  $("attachments").hidden = !state.attachments.length;
}

// The images of the message being sent; the composer is empty again.
export function takeAttachments() {
  const images = state.attachments;
  state.attachments = [];
  drawAttachments();
  return images;
}

export function thumbnail(url) {
  const img = el("img", "thumb");
  img.src = url;
  img.alt = "attached image";
  return img;
}

// A stored user message as the API takes it: its images first, then its text.
export function apiContent(m) {
  if (!m.images || !m.images.length) return m.content;
  return [...m.images.map((url) => ({type: "image_url", image_url: {url}})), {type: "text", text: m.content}];
}
