"""What a `pyllama perplexity` run asks for, settled before a model loads.

Free of llama.cpp imports: the command's --help reads the defaults from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError

DEFAULT_CHUNK_CTX = 512  # llama-perplexity's default -c
DEFAULT_HELLASWAG_TASKS = 400  # llama-perplexity's default --hellaswag-tasks

PERPLEXITY, KLD, HELLASWAG, WINOGRANDE = "ppl", "kld", "hellaswag", "winogrande"
_FLAG_MODES = {"--hellaswag": HELLASWAG, "--winogrande": WINOGRANDE, "--kl-divergence": KLD}


@dataclass(frozen=True)
class Evaluation:
    """One `pyllama perplexity` run: which evaluation, on which files, in what chunks."""

    mode: str  # PERPLEXITY, KLD, HELLASWAG or WINOGRANDE
    path: Path | None  # the text (PERPLEXITY) or the task file; None for KLD, which reads `base`
    base: Path | None  # the KL-divergence base: written by PERPLEXITY, read by KLD
    n_ctx: int | None  # -c when given; else DEFAULT_CHUNK_CTX, or the base file's for KLD
    chunks: int  # at most this many chunks (-1 = all)
    n_tasks: int  # tasks to draw (HELLASWAG, WINOGRANDE)

    @property
    def chunk_ctx(self) -> int:
        """Tokens per chunk: -c, else llama-perplexity's 512."""
        return DEFAULT_CHUNK_CTX if self.n_ctx is None else self.n_ctx


def evaluation(*, file: Path | None, kld: bool, base: Path | None, hellaswag: Path | None, winogrande: Path | None,
               n_ctx: int | None, chunks: int, n_hellaswag: int, n_winogrande: int) -> Evaluation:
    """Check the flags of a run and settle what it evaluates (`n_ctx`: -c, None when not given).

    Raises:
        UsageError: --chunks 0 or -c 0 (nothing to score; llama-perplexity refuses -c 0 too, which
            used to mean 512 here), or a mixture pick_mode refuses.
    """
    if chunks == 0:
        raise UsageError("--chunks 0 leaves nothing to score", hint="give a number of chunks, or -1 for all")
    mode = pick_mode(file, kld, base, hellaswag, winogrande)
    if n_ctx == 0:
        raise UsageError("-c 0: perplexity needs a context size above 0",
                         hint=f"leave out -c for llama-perplexity's {DEFAULT_CHUNK_CTX} tokens per chunk")
    return Evaluation(mode, file or hellaswag or winogrande, base, n_ctx, chunks,
                      n_winogrande if mode == WINOGRANDE else n_hellaswag)


def pick_mode(file: Path | None, kld: bool, base: Path | None, hellaswag: Path | None,
              winogrande: Path | None) -> str:
    """Which of the four evaluations the flags ask for; refuse mixtures.

    Raises:
        UsageError: two evaluations at once, an input that goes with another one, or no input.
    """
    picked = [name for name, on in (("--hellaswag", hellaswag), ("--winogrande", winogrande),
                                    ("--kl-divergence", kld)) if on]
    if len(picked) > 1:
        raise UsageError(f"{' and '.join(picked)} cannot be combined", hint="run one evaluation at a time")
    if kld and base is None:
        raise UsageError("--kl-divergence needs --kl-divergence-base FILE",
                         hint="make the base file first: pyllama perplexity -m BASE.gguf -f TEXT "
                              "--kl-divergence-base FILE")
    if picked and file is not None:
        raise UsageError(f"{picked[0]} does not read -f", hint=f"drop -f; {picked[0]} has its own input")
    if (hellaswag or winogrande) and base is not None:
        raise UsageError("--kl-divergence-base goes with -f or --kl-divergence, not with a task file")
    if picked:
        return _FLAG_MODES[picked[0]]
    if file is None:
        raise UsageError("no text to score", hint="pass -f TEXT_FILE (or --hellaswag/--winogrande FILE, "
                                                  "or --kl-divergence with --kl-divergence-base FILE)")
    return PERPLEXITY
