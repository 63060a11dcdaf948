"""llama-server's native requests into engine jobs: its prompt forms, infill layout and per-request choices.

The sampling, grammar, stop and budget rules are every API's (server/job_rules.py), so a field
means the same on every route; what differs is how the prompt is given and which of
llama-server's switches (id_slot, cache_prompt, n_probs...) the job carries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...core.serving.engine import Engine
from ...core.serving.jobs import GenerationJob
from ...errors import InputError
from ..errors import APIError
from .. import job_rules as rules
from ..openai.media import media_from_base64, media_prompt_of
from ..settings import ServerSettings
from .schemas import InfillRequest, NativeCompletionRequest, NativeFields

PROMPT_STRING = "prompt_string"  # llama-server's key for the text of a prompt given as an object
MULTIMODAL = "multimodal_data"


@dataclass(frozen=True)
class NativeJobs:
    """The jobs of one native request (one per prompt) and what the answer needs to shape them."""

    jobs: list[GenerationJob]
    request: NativeFields
    n_predict: int  # the budget the request asked for, as generation_settings reports it


def prepare_native(engine: Engine, settings: ServerSettings, req: NativeCompletionRequest) -> NativeJobs:
    return _jobs(engine, settings, req, native_prompts(engine, req.prompt, settings))


def prepare_infill(engine: Engine, settings: ServerSettings, req: InfillRequest) -> NativeJobs:
    requested = rules.requested_tokens(req)
    return _jobs(engine, settings, req, [infill_tokens(engine, req, settings.n_predict if requested is None
                                                       else requested)])


def _jobs(engine: Engine, settings: ServerSettings, req: NativeFields, prompts: list[list[int]]) -> NativeJobs:
    rules.check_slot(engine, req.id_slot)
    sampling = rules.sampling(_bias_as_pairs(req), settings, rules.grammar(req, settings, None), engine)
    requested = rules.requested_tokens(req)
    if requested is None or requested < 0:
        requested = settings.n_predict
    stop = rules.stops(req.stop, settings)
    jobs = [GenerationJob(prompt=tuple(_ids(p)), sampling=sampling, stop=stop,
                          max_tokens=rules.budget(requested, _n_cells(p), engine, settings, "prompt"),
                          n_probs=req.n_probs if req.n_probs > 0 else -1, id_slot=req.id_slot,
                          cache_prompt=req.cache_prompt, progress=req.return_progress,
                          post_sampling=req.post_sampling_probs, lora=rules.job_lora(engine, req.lora),
                          media=None if isinstance(p, list) else p)
            for p in prompts]
    return NativeJobs(jobs, req, requested)


def _ids(prompt: Any) -> list[int]:
    """A prompt's token ids: a list of them, or a MediaPrompt's (images as placeholder ids)."""
    return prompt if isinstance(prompt, list) else prompt.tokens


def _n_cells(prompt: Any) -> int:
    """The KV cells a prompt fills: its ids, or a MediaPrompt's cells (an M-RoPE image takes more cells
    than positions)."""
    return len(prompt) if isinstance(prompt, list) else prompt.n_cells


def _bias_as_pairs(req: NativeFields) -> NativeFields:
    """llama-server's object form of logit_bias may name texts as well as ids ({" the": -100}): as
    [[key, bias]] pairs, where a text biases each of its tokens."""
    if not isinstance(req.logit_bias, dict):
        return req
    pairs = [[int(key) if re.fullmatch(r"-?[0-9]+", key) else key, bias] for key, bias in req.logit_bias.items()]
    return req.model_copy(update={"logit_bias": pairs})


# ---------------------------------------------------------------- prompts


def native_prompts(engine: Engine, prompt: Any, settings: ServerSettings) -> list[list[int]]:
    """Token ids of each prompt, read as llama-server reads `prompt`: a string, an object with
    "prompt_string", token ids, ids and strings mixed (one prompt), or a list of those (one each)."""
    if isinstance(prompt, list) and any(_is_piece(p) and not isinstance(p, str) for p in prompt):
        prompts = [prompt]  # ids, or ids and strings mixed: one prompt (strings alone are one prompt each)
    elif isinstance(prompt, list):
        prompts = prompt
    else:
        prompts = [prompt]
    if not prompts:
        raise APIError(400, "prompt is empty", param="prompt", code="invalid_value")
    out = []
    for p in prompts:
        ids = _one_prompt(engine, p, settings)
        if not ids:
            raise APIError(400, "prompt is empty (no tokens)", param="prompt", code="invalid_value")
        out.append(ids)
    return out


def _is_piece(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _one_prompt(engine: Engine, prompt: Any, settings: ServerSettings) -> list[int]:
    if isinstance(prompt, dict):
        if prompt.get(MULTIMODAL):
            return _media_prompt(engine, prompt, settings)
        prompt = prompt.get(PROMPT_STRING)
    if isinstance(prompt, str):
        return engine.tokenize(prompt, add_special=True, parse_special=True)
    if isinstance(prompt, list) and all(_is_piece(p) for p in prompt):
        return mixed_tokens(engine, prompt, add_special=True)
    raise APIError(400, "prompt must be a string, token ids, a mix of both, an object with \"prompt_string\", "
                   "or a list of those", param="prompt", code="invalid_value")


def _media_prompt(engine: Engine, prompt: dict[str, Any], settings: ServerSettings) -> Any:
    """{"prompt_string": TEXT, "multimodal_data": [BASE64, ...]}: the text's media markers (or the start)
    take the media in order; a MediaPrompt, whose `tokens` are the job's prompt."""
    from ...core.media.prompt import with_markers

    data, text = prompt[MULTIMODAL], prompt.get(PROMPT_STRING)
    if not isinstance(data, list) or not isinstance(text, str):
        raise APIError(400, "multimodal_data must be a list of base64 strings, beside a prompt_string",
                       param="prompt", code="invalid_value")
    media = [media_from_base64(item, f"prompt.multimodal_data[{k}]") for k, item in enumerate(data)]
    try:
        text = with_markers(text, len(media))
    except InputError as exc:
        raise APIError(400, exc.message, param="prompt", code="invalid_value") from None
    return media_prompt_of(engine, text, media, settings, param="prompt")


def mixed_tokens(engine: Engine, pieces: list[Any], *, add_special: bool) -> list[int]:
    """Ids and texts in one sequence: ids as they are, texts tokenized (BOS only before a leading text)."""
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, str):
            ids += engine.tokenize(piece, add_special=add_special and i == 0, parse_special=True)
        else:
            ids.append(piece)
    try:
        engine.check_token_ids(ids)
    except InputError as exc:
        raise APIError(400, exc.message, param="prompt", code="invalid_value") from None
    return ids


# ---------------------------------------------------------------- infill


def infill_tokens(engine: Engine, req: InfillRequest, n_predict: int) -> list[int]:
    """llama-server's fill-in-the-middle layout: extra files (repo-level tokens when the model has
    them), then [pre] prefix prompt [suf] suffix [mid], the prefix and suffix cut to fit a batch."""
    from ...core.text.tokenizer import fim_tokens

    fim = fim_tokens(engine.model)
    missing = [kind for kind in ("pre", "suf", "mid") if kind not in fim]
    if missing:
        # 400, not llama-server's 501: clients retry 5xx answers, and retrying cannot help.
        raise APIError(400, "infill needs a model with fill-in-the-middle tokens; this one lacks "
                       + ", ".join(f"the {kind} token" for kind in missing), code="not_supported")
    n_batch = engine.summary.n_batch
    prefix = _text_or_ids(engine, req.input_prefix)
    suffix = _text_or_ids(engine, req.input_suffix)
    prompt = _text_or_ids(engine, req.prompt)
    prefix = prefix[max(0, len(prefix) - 3 * (n_batch // 4)):]
    suffix = suffix[:max(0, n_batch // 4 - (2 + len(prompt)))]
    extra = _extra_tokens(engine, req, fim)
    head = [engine.model.bos] if engine.model.add_bos else []
    # The end of the extra context, as much as leaves a batch and twice the answer free (llama-server's rule).
    room = max(0, engine.n_ctx - n_batch - 2 * max(n_predict, 0))
    extra = extra[len(extra) - min(room, len(extra)):]
    return [*extra, *head, fim["pre"], *prefix, *prompt, fim["suf"], *suffix, fim["mid"]]


def _text_or_ids(engine: Engine, value: str | list[Any]) -> list[int]:
    if isinstance(value, str):
        return engine.tokenize(value, add_special=False, parse_special=False) if value else []
    return mixed_tokens(engine, value, add_special=False)


def _extra_tokens(engine: Engine, req: InfillRequest, fim: dict[str, int]) -> list[int]:
    def text(s: str) -> list[int]:
        return engine.tokenize(s, add_special=False, parse_special=False)

    out: list[int] = []
    if "rep" in fim:
        out += [fim["rep"], *text("myproject\n")]
    for chunk in req.input_extra:
        out += [fim["sep"], *text(chunk.filename + "\n")] if "sep" in fim else text("\n\n--- snippet ---\n\n")
        out += text(chunk.text)
    if "sep" in fim:
        out += [fim["sep"], *text("filename\n")]
    return out

