"""--fit (-fit, -fitt, -fitc) and `info --fit`: with -c unset, the context is reduced from the trained one
until the projected memory leaves the -fitt margin free, choosing what llama.cpp's fit chooses.

With no GPU the budget is the host's total memory less the margin, so a test sets its budget B MiB by
passing -fitt TOTAL-B."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import run_cli

N_CTX_TRAIN = 262144  # 256 MiB of f16 KV cache for TINY's shape: more than the budgets below


@pytest.fixture(scope="module")
def long_model(models_dir: Path) -> Path:
    return write_llama_gguf(models_dir / "long-ctx.gguf", replace(TINY, n_ctx_train=N_CTX_TRAIN, name="pyllama-long"))


def margin_for_budget(budget_mib: int) -> str:
    """The -fitt value that leaves `budget_mib` MiB of this host's memory to the model and its context."""
    total_mib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    return str(total_mib - budget_mib)


def context_of(log: str) -> int:
    """The size of the context llama.cpp created last (its log line, under --verbose)."""
    return int(re.findall(r"llama_context: n_ctx += (\d+)", log)[-1])


def test_info_fit_reports_the_reduced_context_and_why(long_model: Path) -> None:
    r = run_cli("info", "-m", str(long_model), "--fit", "-fitt", margin_for_budget(150))
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "n_ctx: 71680"
    assert lines[2].startswith("why: projected to use 522 MiB of host memory vs. ")
    assert lines[-1] == "why: context size reduced from 262144 to 71680"


def test_info_fit_json_keeps_the_trained_context_when_it_fits(long_model: Path) -> None:
    import json

    r = run_cli("info", "-m", str(long_model), "--fit", "--json", "-fitt", margin_for_budget(600))
    plan = json.loads(r.stdout)
    assert (plan["n_ctx"], plan["n_ctx_train"]) == (N_CTX_TRAIN, N_CTX_TRAIN)
    assert plan["reasons"][-1].endswith("no changes needed")


def test_fit_never_goes_under_fit_ctx(long_model: Path) -> None:
    r = run_cli("info", "-m", str(long_model), "--fit", "-fitt", margin_for_budget(150), "-fitc", "131072")
    assert r.stdout.splitlines()[0] == "n_ctx: 131072"


def test_a_set_context_is_not_fitted(long_model: Path) -> None:
    r = run_cli("info", "-m", str(long_model), "--fit", "-fitt", margin_for_budget(150), "-c", "1024")
    assert r.stdout.splitlines()[0] == "n_ctx: 1024"
    assert r.stdout.splitlines()[-1] == "why: context size set by -c to 1024: no change"


def test_complete_loads_the_fitted_context_and_fit_off_keeps_the_trained_one(long_model: Path) -> None:
    fitted = run_cli("complete", "-m", str(long_model), "-p", "hi", "-n", "1", "--verbose", "-fitt",
                     margin_for_budget(150))
    assert fitted.exit_code == 0, fitted.stderr
    assert "fit: context size reduced from 262144 to 71680" in fitted.stderr
    assert context_of(fitted.stderr) == 71680
    small = str(write_llama_gguf(long_model.with_name("ctx-8192.gguf"), replace(TINY, n_ctx_train=8192)))
    off = run_cli("complete", "-m", small, "-p", "hi", "-n", "1", "--verbose", "-fit", "off", "-fitt",
                  margin_for_budget(1), "-fitc", "256")
    assert off.exit_code == 0, off.stderr
    assert "fit:" not in off.stderr
    assert context_of(off.stderr) == 8192


@pytest.mark.parametrize(("args", "error"), [
    (("-fit", "maybe"), "Error: --fit 'maybe': unknown value"),
    (("-fitt", "1k"), "Error: -fitt '1k': must be MiB values 0 or more, separated by commas"),
    (("-fitt", "-5"), "Error: -fitt '-5': must be MiB values 0 or more, separated by commas"),
    (("-fitc", "-1"), "Error: --fit-ctx -1: must be a context size, 0 or more"),
])
def test_bad_fit_values_are_one_line_errors(tiny_model: Path, args: tuple[str, ...], error: str) -> None:
    r = run_cli("complete", "-m", str(tiny_model), "-p", "hi", "-n", "1", *args)
    assert r.exit_code != 0
    assert r.stderr.splitlines()[0] == error


# --- llama.cpp's own fit (skipped unless LLAMA_CPP_BIN has llama-completion) ---------------------------

def _completion() -> Path | None:
    folder = os.environ.get("LLAMA_CPP_BIN")
    tool = Path(folder) / "llama-completion" if folder else None
    return tool if tool and tool.exists() else None


@pytest.mark.reference
@pytest.mark.skipif(_completion() is None, reason="set LLAMA_CPP_BIN to a folder with llama-completion")
@pytest.mark.parametrize(("budget_mib", "flags"), [
    (150, ()), (300, ()), (420, ()), (200, ("-ub", "128")),
    (200, ("-ctk", "q8_0", "-ctv", "q8_0")), (250, ("-ctk", "q4_0", "-ctv", "q4_0")),
])
def test_fit_chooses_llama_cpps_context_size(long_model: Path, budget_mib: int, flags: tuple[str, ...]) -> None:
    """A trained context of 262144 tokens (522 MiB projected with an f16 cache) in a budget of 150-420 MiB:
    both reduce it to the same size, counting the ubatch and the cache types."""
    margin = margin_for_budget(budget_mib)
    ref = subprocess.run([str(_completion()), "-m", str(long_model), "-fitt", margin, *flags, "-p", "hi", "-n", "1",
                          "-no-cnv", "--verbose", "-t", "1"], capture_output=True, text=True, errors="replace", timeout=120)
    assert ref.returncode == 0, ref.stderr[-2000:]
    expected = context_of(ref.stderr)
    assert expected < N_CTX_TRAIN  # the budget did make llama.cpp reduce it
    ours = run_cli("complete", "-m", str(long_model), "-fitt", margin, *flags, "-p", "hi", "-n", "1", "--verbose",
                   "-t", "1")
    assert ours.exit_code == 0, ours.stderr
    assert context_of(ours.stderr) == expected
    info = run_cli("info", "-m", str(long_model), "--fit", "-fitt", margin, *flags)
    assert info.stdout.splitlines()[0] == f"n_ctx: {expected}"


def test_fit_target_and_fit_from_llama_arg_variables(long_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_ARG_FIT_TARGET", margin_for_budget(150))
    r = run_cli("complete", "-m", str(long_model), "-p", "hi", "-n", "1", "--verbose", "-c", "512")
    assert context_of(r.stderr) == 512  # a set context is never fitted
    monkeypatch.setenv("LLAMA_ARG_FIT", "off")
    r = run_cli("info", "-m", str(long_model), "--fit", "-fitt", margin_for_budget(150))
    assert r.stdout.splitlines()[0] == "n_ctx: 71680"  # info --fit previews the fit, whatever -fit says
    monkeypatch.delenv("LLAMA_ARG_FIT")
    r = run_cli("complete", "-m", str(long_model), "-p", "hi", "-n", "1", "--verbose")
    assert "fit: context size reduced from 262144 to 71680" in r.stderr
