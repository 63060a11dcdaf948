"""What a GGUF holds, read from its header alone (no weights), for `pyllama info`."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ..gguf.ftypes import ftype_name
from ..gguf.reader import GGUFFile, read_gguf
from .resolve import ResolvedModel

# Special-token ids llama.cpp reads from `tokenizer.ggml.<name>_token_id`.
_SPECIAL_TOKENS = ("bos", "eos", "eot", "eom", "unknown", "padding", "separator", "cls", "mask")
_ARRAY_PREVIEW = 8


@dataclass
class ModelInfo:
    path: str
    name: str | None
    architecture: str
    parameters: int
    file_size: int
    quantization: str
    layers: int | None
    embedding_length: int | None
    feed_forward_length: int | None
    head_count: int | None
    head_count_kv: int | None
    context_length: int | None
    vocab_size: int | None
    vocab_type: str | None
    chat_template: bool
    special_tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    split_count: int = 1
    gguf_version: int = 3
    tensor_count: int = 0
    projector: dict[str, Any] | None = None  # a multimodal projector's (mmproj, architecture "clip") facts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_headers(resolved: ResolvedModel) -> list[GGUFFile]:
    return [read_gguf(p) for p in resolved.parts]


def describe_model(resolved: ResolvedModel) -> tuple[ModelInfo, GGUFFile]:
    """Summarise a model from its GGUF header(s); returns the info and the first part's header."""
    headers = read_headers(resolved)
    head = headers[0]
    tensors = [t for h in headers for t in h.tensors]
    tokens = head.get("tokenizer.ggml.tokens")
    info = ModelInfo(
        path=str(resolved.path),
        name=head.get("general.name"),
        architecture=head.architecture,
        parameters=sum(t.n_elements for t in tensors),
        file_size=sum(h.file_size for h in headers),
        quantization=ftype_name(head.get("general.file_type")) or _dominant_type(headers),
        layers=head.arch_key("block_count"),
        embedding_length=head.arch_key("embedding_length"),
        feed_forward_length=_scalar(head.arch_key("feed_forward_length")),
        head_count=_scalar(head.arch_key("attention.head_count")),
        head_count_kv=_scalar(head.arch_key("attention.head_count_kv")),
        context_length=head.arch_key("context_length"),
        vocab_size=len(tokens) if isinstance(tokens, list) else head.arch_key("vocab_size"),
        vocab_type=head.get("tokenizer.ggml.model"),
        chat_template=bool(head.get("tokenizer.chat_template")),
        special_tokens=_special_tokens(head, tokens),
        split_count=len(headers),
        gguf_version=head.version,
        tensor_count=len(tensors),
        projector=projector_facts(head) if head.architecture == "clip" else None,
    )
    return info, head


def projector_facts(head: GGUFFile) -> dict[str, Any]:
    """A projector's type, what it takes, and its image geometry, from libmtmd's `clip.*` keys."""
    vision, audio = bool(head.get("clip.has_vision_encoder")), bool(head.get("clip.has_audio_encoder"))
    kinds = {"vision": head.get("clip.vision.projector_type"), "audio": head.get("clip.audio.projector_type")}
    return {
        "type": head.get("clip.projector_type") or ", ".join(f"{v} ({k})" for k, v in kinds.items() if v),
        "accepts": [name for name, on in (("vision", vision), ("audio", audio)) if on],
        "image_size": head.get("clip.vision.image_size") if vision else None,
        "patch_size": head.get("clip.vision.patch_size") if vision else None,
        "embedding_length": head.get("clip.vision.embedding_length" if vision else "clip.audio.embedding_length"),
        "projection_dim": head.get("clip.vision.projection_dim" if vision else "clip.audio.projection_dim"),
    }


def _scalar(value: Any) -> Any:
    # Some architectures store per-layer arrays (e.g. head counts); report the first layer's value.
    return value[0] if isinstance(value, list) and value else value


def _dominant_type(headers: list[GGUFFile]) -> str:
    counts = Counter(t.type_name for h in headers for t in h.tensors if len(t.shape) >= 2)
    return counts.most_common(1)[0][0] if counts else "unknown"


def _special_tokens(head: GGUFFile, tokens: Any) -> dict[str, dict[str, Any]]:
    found = {}
    for name in _SPECIAL_TOKENS:
        tid = head.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(tid, int):
            text = tokens[tid] if isinstance(tokens, list) and 0 <= tid < len(tokens) else None
            found[name] = {"id": tid, "text": text}
    return found


def metadata_summary(head: GGUFFile) -> dict[str, Any]:
    """Every metadata key; long arrays shortened to their first items and a count."""
    out: dict[str, Any] = {}
    for key, value in head.metadata.items():
        if isinstance(value, list) and len(value) > _ARRAY_PREVIEW:
            out[key] = {
                "type": f"array[{head.array_types.get(key, '?')}]",
                "length": len(value),
                "first": value[:_ARRAY_PREVIEW],
            }
        else:
            out[key] = value
    return out
