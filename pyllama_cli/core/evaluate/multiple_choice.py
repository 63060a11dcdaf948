"""HellaSwag and Winogrande scores, computed the way llama-perplexity computes them.

Both read llama-perplexity's task files. Each task is a few token sequences that share a prefix;
the prefix is evaluated once for all of them (one KV sequence per choice), several tasks share a
decode, and a choice's score is the mean log-probability of its scored tokens. The task sampling
uses the same mt19937(1) draws as llama.cpp, so `--hellaswag-tasks N` picks the same tasks.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ContextOverflow, InputError
from ..interrupt import StopFlag, catch_sigint
from ..model.native import Batch, Context, Model, lib
from ..model.settings import LoadSettings
from .perplexity import read_text

N_SEQ = 4  # llama-perplexity's context for these scores: 4 sequences, unified KV cache, 4 * -c cells
_Z95 = 1.95996398454
_MIN_TRAILING = 3  # Winogrande: score only the words after the blank when both choices leave more tokens than this


# ---------------------------------------------------------------- task files


@dataclass
class Task:
    """One multiple-choice task, as the token sequences of its choices."""

    number: int  # position in the input file, from 1
    answer: int  # index of the right choice, from 0
    seqs: list[np.ndarray] = field(default_factory=list)
    prefix: int = 0  # tokens all choices share
    # Winogrande: tokens of the sentence up to the end of each choice word (scoring starts after them).
    bases: list[int] = field(default_factory=list)

    @property
    def required(self) -> int:
        """KV cells the task takes: the shared prefix once, then each choice's own tokens."""
        return self.prefix + sum(len(s) - self.prefix for s in self.seqs)


@dataclass
class HellaSwagTask:
    context: str
    answer: int
    endings: list[str]


@dataclass
class WinograndeTask:
    first: str  # the sentence before the blank
    second: str  # the sentence after the blank
    choices: tuple[str, str]
    answer: int  # 1 or 2


def parse_hellaswag(text: str) -> list[HellaSwagTask]:
    """Six lines per task: context, index of the right ending (0-3), the four endings.

    Raises:
        InputError: a line count that is not a multiple of 6, or a bad answer line.
    """
    lines = text.split("\n")
    if lines[-1] == "":  # a newline after the last line ends it; it does not start another
        lines.pop()
    if len(lines) % 6:
        raise InputError(f"a HellaSwag file has 6 lines per task; this one has {len(lines)} lines",
                         hint="each task: context, right ending index (0-3), then the 4 endings")
    tasks = []
    for i in range(0, len(lines), 6):
        try:
            answer = int(lines[i + 1])
        except ValueError:
            answer = -1
        if not 0 <= answer <= 3:
            raise InputError(f"HellaSwag task {i // 6 + 1} (line {i + 2}): the right ending must be 0-3, "
                             f"got {lines[i + 1]!r}")
        tasks.append(HellaSwagTask(lines[i], answer, lines[i + 2:i + 6]))
    return tasks


@dataclass
class WinograndeFile:
    tasks: list[WinograndeTask]
    skipped: int  # rows that are not tasks (a header, no `_`, an answer other than 1 or 2)
    unread_last: bool  # the final line held a task that llama-perplexity's reader does not reach


def parse_winogrande(text: str) -> WinograndeFile:
    """Winogrande CSV rows `index,sentence with _,choice1,choice2,answer(1|2)`.

    Rows llama-perplexity skips (a header, no `_`, a bad answer) are counted, not fatal. Its reader
    also stops before a final line with no newline after it (the -f reader has already dropped one
    trailing newline); that line is left out here too, so that task counts and the random task
    selection are the same as llama-perplexity's.
    """
    lines = text.split("\n")
    last = lines.pop()
    tasks = [t for t in map(_winogrande_row, lines) if t is not None]
    return WinograndeFile(tasks, len(lines) - len(tasks), _winogrande_row(last) is not None)


def _winogrande_row(line: str) -> WinograndeTask | None:
    commas, quoted = [], False
    for i, ch in enumerate(line):
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            commas.append(i)
            if len(commas) == 4:
                break
    if len(commas) != 4:
        return None
    c0, c1, c2, c3 = commas
    sentence = line[c0 + 2:c1 - 1] if line[c0 + 1:c0 + 2] == '"' else line[c0 + 1:c1]
    if "_" not in sentence:
        return None
    number = re.match(r"\s*([+-]?\d+)", line[c3 + 1:])  # what `stream >> int` accepts
    answer = int(number.group(1)) if number else 0
    if answer not in (1, 2):
        return None
    first, _, second = sentence.partition("_")
    return WinograndeTask(first, second, (line[c1 + 1:c2], line[c2 + 1:c3]), answer)


# ---------------------------------------------------------------- task sampling (llama.cpp's draws)


def _mt19937(seed: int) -> random.Random:
    """Python's Mersenne Twister in the state std::mt19937(seed) starts from."""
    state = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        prev = state[-1]
        state.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
    rng = random.Random()
    rng.setstate((3, (*state, 624), None))
    return rng


def _uniform_below(rng: random.Random, n: int) -> int:
    """libstdc++'s uniform_int_distribution(0, n-1) over a 32-bit engine (Lemire's method)."""
    product = rng.getrandbits(32) * n
    low = product & 0xFFFFFFFF
    if low < n:
        threshold = ((1 << 32) - n) % n
        while low < threshold:
            product = rng.getrandbits(32) * n
            low = product & 0xFFFFFFFF
    return product >> 32


def select_hellaswag(tasks: list[HellaSwagTask], n: int) -> list[tuple[int, HellaSwagTask]]:
    """(file position from 1, task) for `n` tasks in llama-perplexity's random order (always shuffled)."""
    rng = _mt19937(1)
    left = list(enumerate(tasks, 1))
    return [left.pop(_uniform_below(rng, len(left))) for _ in range(min(n, len(tasks)))]


def select_winogrande(tasks: list[WinograndeTask], n: int) -> list[tuple[int, WinograndeTask]]:
    """(file position from 1, task) for `n` random tasks (all, in file order, when n is 0 or too large)."""
    numbered = list(enumerate(tasks, 1))
    if n <= 0 or n >= len(tasks):
        return numbered
    rng = _mt19937(1)
    f32 = np.float32
    scale = f32(1) / (f32(1) + f32(0xFFFFFFFF))
    aux = list(range(len(tasks)))
    picked = []
    for _ in range(n):
        # llama.cpp draws in float32; the product can round up to len(aux), which we clamp.
        j = min(int(scale * f32(rng.getrandbits(32)) * f32(len(aux))), len(aux) - 1)
        picked.append(numbered[aux[j]])
        aux[j] = aux[-1]
        aux.pop()
    return picked


def pick_tasks(path: Path, winogrande: bool, n: int, warn: Callable[[str], None]) -> tuple[str, list[tuple[int, Any]]]:
    """The benchmark's name and `n` tasks drawn from its file as llama-perplexity draws them (see the
    select functions); `warn` hears of a Winogrande line that is not used.

    Raises:
        InputError: an unreadable file, or one without tasks.
    """
    text = read_text(path).decode("utf-8", errors="surrogateescape")
    if winogrande:
        parsed = parse_winogrande(text)
        if parsed.unread_last:
            warn(f"the last line of {path} is not used: llama-perplexity stops before a last line with no "
                 "newline after it (end the file with an empty line to use it)")
        name, picked = "Winogrande", select_winogrande(parsed.tasks, n)
    else:
        name, picked = "HellaSwag", select_hellaswag(parse_hellaswag(text), n)
    if not picked:
        raise InputError(f"no {name} tasks in {path}", hint="check the file format (see --help)")
    return name, picked


# ---------------------------------------------------------------- tokenizing into tasks


def _common_prefix(seqs: list[np.ndarray]) -> int:
    n = min(len(s) for s in seqs)
    same = np.all([s[:n] == seqs[0][:n] for s in seqs[1:]], axis=0) if n else np.zeros(0, bool)
    return int(np.argmin(same)) if not same.all() else n


def hellaswag_tasks(model: Model, picked: list[tuple[int, HellaSwagTask]]) -> list[Task]:
    out = []
    for number, hs in picked:
        seqs = [model.tokenize(f"{hs.context} {e}".encode(), add_special=True) for e in hs.endings]
        task = Task(number, hs.answer, seqs, _common_prefix(seqs))
        if any(len(s) <= task.prefix for s in seqs):
            raise InputError(f"HellaSwag task {number}: an ending adds no tokens after what all endings share",
                             hint="check the task's four ending lines")
        out.append(task)
    return out


def winogrande_tasks(model: Model, picked: list[tuple[int, WinograndeTask]]) -> list[Task]:
    out = []
    for number, wg in picked:
        seqs = [model.tokenize((wg.first + c + wg.second).encode(), add_special=True) for c in wg.choices]
        bases = [len(model.tokenize((wg.first + c).encode(), add_special=True)) for c in wg.choices]
        task = Task(number, wg.answer - 1, seqs, _common_prefix(seqs), bases)
        if any(len(s) <= task.prefix for s in seqs):
            raise InputError(f"Winogrande task {number}: its two choices give the same tokens")
        out.append(task)
    return out


# ---------------------------------------------------------------- evaluation


@dataclass
class _Pass:
    """Tasks that share one evaluation, their batch entries and the (row, target) pairs to score."""

    tasks: list[Task]
    entries: list[tuple[int, int, tuple[int, ...], bool]] = field(default_factory=list)
    pairs: list[list[list[tuple[int, int]]]] = field(default_factory=list)  # [task][choice] -> pairs


def _layout_task(p: _Pass, task: Task, s0: int, skip_last: bool) -> list[list[int]]:
    """Add a task's tokens to the pass; return each choice's output row for every position from prefix-1."""
    row0 = sum(e[3] for e in p.entries)
    k = len(task.seqs)
    for i in range(task.prefix):
        p.entries.append((int(task.seqs[0][i]), i, tuple(range(s0, s0 + k)), i == task.prefix - 1))
    rows, n_out = [], 1
    for s, seq in enumerate(task.seqs):
        own = [row0]  # position prefix-1: the shared last prefix token
        for i in range(task.prefix, len(seq)):
            out = not (skip_last and i == len(seq) - 1)
            p.entries.append((int(seq[i]), i, (s0 + s,), out))
            own.append(row0 + n_out if out else -1)
            n_out += out
        rows.append(own)
    return rows


def _hellaswag_pairs(task: Task, rows: list[list[int]]) -> list[list[tuple[int, int]]]:
    # Every token after the shared prefix, the first one predicted by the prefix's last token.
    return [[(rows[s][j], int(seq[task.prefix + j])) for j in range(len(seq) - task.prefix)]
            for s, seq in enumerate(task.seqs)]


def _winogrande_pairs(task: Task, rows: list[list[int]]) -> list[list[tuple[int, int]]]:
    both_long = all(len(s) - task.prefix > _MIN_TRAILING for s in task.seqs)
    pairs = []
    for s, seq in enumerate(task.seqs):
        # With enough words after the blank, score only those (the choice word itself is skipped).
        base = max(task.bases[s], task.prefix) if both_long else task.prefix
        last = 1 if len(seq) - base > 1 else 0  # the final token (usually ".") is not scored
        own = [(rows[s][j - task.prefix + 1], int(seq[j + 1])) for j in range(base - 1, len(seq) - 1 - last)]
        if s == 1 and not both_long and own:
            # llama-perplexity reads this first log-prob from the first choice's last output (a known
            # quirk, kept so the scores match its published numbers).
            own[0] = (rows[0][-1], own[0][1])
        pairs.append(own)
    return pairs


def _plan_passes(tasks: list[Task], n_ctx: int, skip_last: bool, winogrande: bool) -> Iterator[_Pass]:
    i = 0
    while i < len(tasks):
        p, used = _Pass([]), 0
        while i < len(tasks) and used + tasks[i].required <= n_ctx:
            task = tasks[i]
            s0 = sum(len(t.seqs) for t in p.tasks)
            if s0 + len(task.seqs) > N_SEQ:
                break
            rows = _layout_task(p, task, s0, skip_last)
            p.pairs.append(_winogrande_pairs(task, rows) if winogrande else _hellaswag_pairs(task, rows))
            p.tasks.append(task)
            used += task.required
            i += 1
        if not p.tasks:
            raise ContextOverflow(f"task {tasks[i].number} needs {tasks[i].required} tokens; the context holds "
                                  f"{n_ctx}", hint=f"raise -c (now {n_ctx // N_SEQ}; the context is 4x -c)")
        yield p


def _score_pass(ctx: Context, batch: Batch, p: _Pass) -> list[list[float]]:
    """Decode a pass (in n_batch pieces) and return each choice's mean log-prob, per task."""
    flat = [pair for task_pairs in p.pairs for choice in task_pairs for pair in choice]
    rows = np.array([r for r, _ in flat], np.int64)
    targets = np.array([t for _, t in flat], np.int32)
    logprob = np.empty(len(flat), np.float32)
    ctx.clear_memory()
    row0 = 0
    for start in range(0, len(p.entries), ctx.n_batch):
        batch.clear()
        for token, pos, seqs, out in p.entries[start:start + ctx.n_batch]:
            batch.add(token, pos, seqs, out)
        ctx.decode(batch)
        n_out = sum(e[3] for e in p.entries[start:start + ctx.n_batch])
        hit = (rows >= row0) & (rows < row0 + n_out)
        if hit.any():
            logits = np.ctypeslib.as_array(lib.llama_get_logits(ctx.handle), shape=(n_out, ctx.model.n_vocab))
            logprob[hit] = _log_probs_f32(logits[rows[hit] - row0], targets[hit])
        row0 += n_out
    scores, k = [], 0
    for task_pairs in p.pairs:
        task_scores = []
        for choice in task_pairs:
            # A float sum taken in order, divided by the count: the 6 printed decimals then agree too.
            total = np.cumsum(logprob[k:k + len(choice)], dtype=np.float32)[-1]
            task_scores.append(float(total / np.float32(len(choice))))
            k += len(choice)
        scores.append(task_scores)
    return scores


def _log_probs_f32(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Log-probs of the targets in llama-perplexity's float arithmetic (float exps summed in order)."""
    top = logits.max(axis=1)
    total = np.cumsum(np.exp(logits - top[:, None]), axis=1, dtype=np.float32)[:, -1]
    return (logits[np.arange(len(logits)), targets] - top) - np.log(total)


@dataclass
class TaskResult:
    index: int  # 1-based position in the evaluation order
    number: int  # 1-based position in the task file
    scores: list[float]  # mean log-prob per choice
    chosen: int  # 0-based
    answer: int  # 0-based
    n_correct: int  # so far
    n_done: int

    @property
    def accuracy(self) -> float:
        return self.n_correct / self.n_done


def score_tasks(model: Model, settings: LoadSettings, tasks: list[Task], n_ctx: int, *,
                winogrande: bool) -> Iterator[TaskResult]:
    """Evaluate the tasks in order, yielding each one's scores and the running accuracy.

    Raises:
        ContextOverflow: a task longer than the context.
        Interrupted: Ctrl-C.
    """
    total = N_SEQ * n_ctx
    stop = StopFlag()
    n_correct = n_done = 0
    with Context(model, settings, n_ctx=total, n_seq_max=N_SEQ, kv_unified=True) as ctx, \
            Batch(ctx.n_batch, N_SEQ) as batch, catch_sigint(stop), ctx.abortable():
        ctx.abort_check = stop.__bool__
        for p in _plan_passes(tasks, total, skip_last=not winogrande, winogrande=winogrande):
            for task, scores in zip(p.tasks, _score_pass(ctx, batch, p)):
                # The first best choice wins ties; Winogrande prefers choice 2 unless choice 1 is strictly better.
                chosen = (0 if scores[0] > scores[1] else 1) if winogrande else int(np.argmax(scores))
                n_correct += chosen == task.answer
                n_done += 1
                yield TaskResult(n_done, task.number, scores, chosen, task.answer, n_correct, n_done)


# ---------------------------------------------------------------- statistics and lines


def wilson_interval(p: float, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (llama-perplexity's HellaSwag interval)."""
    z = _Z95 * _Z95 / n
    half = z * math.sqrt(n * (4.0 * p * (1 - p) + z)) / (2 * _Z95)
    return (p + z * 0.5 - half) / (1.0 + z), (p + z * 0.5 + half) / (1.0 + z)


def accuracy_uncertainty(p: float, n: int) -> float:
    """Standard error of an accuracy, sqrt(p(1-p)/(n-1)) (llama-perplexity's Winogrande ±)."""
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else 0.0


HELLASWAG_HEADER = "task\tacc_norm\t95% confidence interval"


def hellaswag_line(r: TaskResult) -> str:
    low, high = wilson_interval(r.accuracy, r.n_done)
    return f"{r.index}\t{100 * r.accuracy:3.8f}%\t[{100 * low:3.4f}%, {100 * high:3.4f}%]"


def winogrande_line(r: TaskResult) -> str:
    return (f"{r.index}\t{100.0 * r.n_correct / r.n_done:.4f}\t{r.scores[0]:10.6f}  {r.scores[1]:10.6f}"
            f"  {r.chosen + 1}  {r.answer + 1}")


def results_json(name: str, model_path: Path, results: list[TaskResult]) -> dict[str, Any]:
    """The `--json` document of a run: the final accuracy with its uncertainty and interval, and every task."""
    last = results[-1]
    low, high = wilson_interval(last.accuracy, last.n_done)
    return {
        "model": str(model_path), "benchmark": name.lower(), "tasks": last.n_done,
        "accuracy": last.accuracy, "uncertainty": accuracy_uncertainty(last.accuracy, last.n_done),
        "ci95": [low, high],
        "results": [{"task": r.index, "file_task": r.number, "scores": r.scores, "chosen": r.chosen,
                     "answer": r.answer, "correct": r.chosen == r.answer} for r in results],
    }


def final_line(name: str, r: TaskResult) -> str:
    p = float(np.float32(r.n_correct / r.n_done))
    return f"Final {name} score({r.n_done} tasks): {100 * p:.4f} +/- {100 * accuracy_uncertainty(p, r.n_done):.4f}"
