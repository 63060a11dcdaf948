// What an attachment is and how it looks: image thumbnails, audio chips, and a user message's content as
// the API takes it. An image is a data: URL (an OpenAI image_url part); a clip is {name, format, data},
// `data` its bare base64 (an input_audio part), `format` wav, mp3 or flac.

import {el, button} from "./util.js";

// What the server decodes (docs/multimodal.md); anything else would be a 400 after the upload.
export const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/bmp"];
const AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
  "audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/flac": "flac", "audio/x-flac": "flac"};
const AUDIO_MIME = {wav: "audio/wav", mp3: "audio/mpeg", flac: "audio/flac"};
export const AUDIO_TYPES = [...Object.keys(AUDIO_FORMATS), ".wav", ".mp3", ".flac"];
// A clip's base64 above this is sent but not kept in localStorage (about 5 MB a site in all): after a
// reload its chip says so and later turns go without it (docs/webui.md).
export const MAX_KEPT_CLIP = 2 * 1024 * 1024;

// "image", "audio", or null for a file the server would refuse.
export function kindOf(file) {
  if (IMAGE_TYPES.includes(file.type)) return "image";
  return audioFormat(file) ? "audio" : null;
}

// input_audio's format: from the MIME type, or from the name where the browser gives no known type.
export function audioFormat(file) {
  if (AUDIO_FORMATS[file.type]) return AUDIO_FORMATS[file.type];
  if (file.type && file.type !== "application/octet-stream") return null;
  const match = /\.(wav|mp3|flac)$/i.exec(file.name);
  return match ? match[1].toLowerCase() : null;
}

export function thumbnail(url) {
  const img = el("img", "thumb");
  img.src = url;
  img.alt = "attached image";
  return img;
}

// A clip: its name, its length once the player has read it, and the browser's own player.
export function clipChip(clip, remove) {
  const chip = el("figure", "clip");
  chip.append(el("span", "name", clip.name));
  if (clip.data) {
    const length = el("span", "duration");
    const player = el("audio");
    player.controls = true;
    player.preload = "metadata";
    player.onloadedmetadata = () => { length.textContent = minutes(player.duration); };
    player.src = `data:${AUDIO_MIME[clip.format]};base64,${clip.data}`;
    chip.append(length, player);
    if (clip.data.length > MAX_KEPT_CLIP) chip.append(el("span", "hint", "too big to keep: gone after a reload"));
  } else {
    chip.append(el("span", "hint", "not kept (too big for this browser's storage)"));
  }
  if (remove) {
    const cross = button("×", remove, "quiet small remove");
    cross.setAttribute("aria-label", "Remove this clip");
    chip.append(cross);
  }
  return chip;
}

function minutes(seconds) {
  if (!Number.isFinite(seconds)) return "";
  const s = Math.round(seconds);
  return Math.floor(s / 60) + ":" + String(s % 60).padStart(2, "0");
}

// A clip as the stored conversation keeps it: without its data when that is too big.
export function keptClip(clip) {
  return clip.data && clip.data.length > MAX_KEPT_CLIP ? {name: clip.name, format: clip.format} : clip;
}

// A stored user message as the API takes it: its images, then its clips, then its text.
export function apiContent(m) {
  const images = m.images || [];
  const clips = (m.audio || []).filter((c) => c.data);  // a clip not kept cannot be sent again
  if (!images.length && !clips.length) return m.content;
  return [...images.map((url) => ({type: "image_url", image_url: {url}})),
    ...clips.map((c) => ({type: "input_audio", input_audio: {data: c.data, format: c.format}})),
    {type: "text", text: m.content}];
}
