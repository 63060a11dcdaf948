// Images and audio clips for the next message: the attach button, paste and drag-and-drop. Offered for
// what the chosen model takes (the modalities /v1/models and /props report): images when it sees, clips
// when it hears; a file it cannot take is refused here, with a line that says why, before any request.
// They stay in the stored message, so its thumbnails and chips survive a reload (media.js).

import {$, state, el, button, setStatus} from "./util.js";
import {IMAGE_TYPES, AUDIO_TYPES, kindOf, audioFormat, thumbnail, clipChip} from "./media.js";

const IMAGES = "PNG, JPEG, GIF or BMP images";
const CLIPS = "WAV, MP3 or FLAC clips";

// `modalities`: {vision, audio} of the chosen model, or undefined while they are not known.
export function setModalities(modalities) {
  state.vision = Boolean(modalities && modalities.vision);
  state.audio = Boolean(modalities && modalities.audio);
  state.modalitiesKnown = Boolean(modalities);  // a router's model says them once it is loaded
  const attach = $("attach");
  attach.hidden = !state.vision && !state.audio;
  attach.textContent = state.vision && state.audio ? "Attach" : state.audio ? "Audio" : "Image";
  attach.title = `Attach ${takes()} (or paste or drop one)`;
  $("attach-file").accept = [...(state.vision ? IMAGE_TYPES : []), ...(state.audio ? AUDIO_TYPES : [])].join(",");
  const fit = state.attachments.filter((a) => (a.url ? state.vision : state.audio));
  if (fit.length !== state.attachments.length) {
    state.attachments = fit;
    drawAttachments();
  }
}

function takes() {
  return [state.vision ? IMAGES : "", state.audio ? CLIPS : ""].filter(Boolean).join(" or ");
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
    if (!e.dataTransfer.types.includes("Files")) return;
    e.preventDefault();  // a dropped file is taken or refused here, never opened in place of the page
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

// Why `file` cannot go to this model, or "" when it can.
function refusal(file) {
  if (!state.vision && !state.audio) {
    return state.modalitiesKnown ? "This model takes no images or audio (it has no projector, --mmproj)."
      : "This model is not loaded yet, so what it takes is not known: send it a message first.";
  }
  const kind = kindOf(file);
  if (kind === "image" && !state.vision) return `Cannot attach ${file.name}: this model cannot see images; it takes ${takes()}.`;
  if (kind === "audio" && !state.audio) return `Cannot attach ${file.name}: this model cannot hear audio; it takes ${takes()}.`;
  return kind ? "" : `Cannot attach ${file.name}: this model takes ${takes()}.`;
}

function addFiles(files) {
  for (const file of files) {
    const problem = refusal(file);
    if (problem) {
      setStatus(problem, true);
      continue;
    }
    const reader = new FileReader();
    reader.onload = () => {
      const url = reader.result;
      state.attachments.push(kindOf(file) === "image" ? {url}
        : {name: file.name, format: audioFormat(file), data: url.slice(url.indexOf(",") + 1)});
      drawAttachments();
    };
    reader.onerror = () => setStatus(`Cannot read ${file.name}.`, true);
    reader.readAsDataURL(file);
  }
}

// The attachments of the message being written, each with a button that removes it.
function drawAttachments() {
  const remove = (i) => () => {
    state.attachments.splice(i, 1);
    drawAttachments();
  };
  $("attachments").replaceChildren(...state.attachments.map((a, i) => {
    if (!a.url) return clipChip(a, remove(i));
    const item = el("figure", "attachment");
    item.append(thumbnail(a.url), button("×", remove(i), "quiet small remove"));
    item.lastChild.setAttribute("aria-label", "Remove this image");
    return item;
  }));
  $("attachments").hidden = !state.attachments.length;
}

// The media of the message being sent, as its stored fields; the composer is empty again.
export function takeAttachments() {
  const taken = state.attachments;
  state.attachments = [];
  drawAttachments();
  const images = taken.filter((a) => a.url).map((a) => a.url);
  const audio = taken.filter((a) => !a.url);
  return {...(images.length ? {images} : {}), ...(audio.length ? {audio} : {})};
}
