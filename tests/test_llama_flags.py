"""llama.cpp's KV cache, sampler, context and placement flags: values reach llama.cpp, bad values are one error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli

FAST = ("-t", "1", "-c", "256", "-p", "Hello", "-s", "7")
TYPES = "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"


def complete(model: Path, *args: str) -> tuple[int, str, list[str]]:
    result = run_cli("complete", "-m", str(model), *FAST, *args)
    return result.exit_code, result.stdout, result.stderr.strip().splitlines()


# ---------------------------------------------------------------- KV cache


@pytest.mark.parametrize(("flags", "lines"), [
    (("-ctk", "q3_k"), ["Error: -ctk 'q3_k' is not a KV cache type", f"Hint: allowed values: {TYPES}"]),
    (("--cache-type-v", "int8"), ["Error: -ctv 'int8' is not a KV cache type", f"Hint: allowed values: {TYPES}"]),
    (("-ctv", "q8_0", "-fa", "off"), ["Error: a quantized V cache (-ctv q8_0) needs flash attention, and -fa is off",
                                      "Hint: use -fa on (or auto), or a V cache type of f32, f16 or bf16"]),
])
def test_a_bad_cache_type_is_one_error_naming_the_flag(tiny_model: Path, flags: tuple[str, ...],
                                                       lines: list[str]) -> None:
    code, out, err = complete(tiny_model, "-n", "1", *flags)
    assert (code, out, err) == (1, "", lines)


def test_the_cache_types_reach_llama_cpp(tiny_model: Path) -> None:
    code, _, err = complete(tiny_model, "-n", "2", "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on", "--verbose")
    line = next(line for line in err if line.startswith("llama_kv_cache: size ="))
    assert code == 0 and "K (q8_0)" in line and "V (q4_0)" in line
    # -fa auto turns flash attention on for a quantized V cache, as llama.cpp does
    code, _, err = complete(tiny_model, "-n", "2", "-ctv", "q8_0", "--verbose")
    assert code == 0 and any("V (q8_0)" in line for line in err)


@pytest.mark.parametrize(("flags", "size"), [(("-ctk", "f32", "-ctv", "f32"), "4096.0"), ((), "2048.0"),
                                             (("-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"), "576.0")])
def test_the_memory_check_counts_the_chosen_cache_types(tiny_model: Path, flags: tuple[str, ...], size: str) -> None:
    # 2 layers x 2 KV heads x 64 values per token, for K and V: 2 KiB a token in f32, 1 KiB in f16, 288 B in q4_0
    code, _, err = complete(tiny_model, "-n", "1", *flags, "-c", "2147483647")
    assert code == 1 and err[0].startswith(f"Error: a context of 2147483647 tokens needs a {size} GiB KV cache")


def test_swa_full_and_no_kv_offload_load(tiny_model: Path) -> None:
    assert complete(tiny_model, "-n", "2", "--swa-full", "-nkvo")[0] == 0
    assert complete(tiny_model, "-n", "2", "--no-kv-offload", "-kvo")[0] == 0


# ---------------------------------------------------------------- samplers


@pytest.mark.parametrize(("flags", "lines"), [
    (("--samplers", "top_k;warmth"), ["Error: --samplers: unknown sampler 'warmth'"]),
    (("--sampler-seq", "kpq"), ["Error: --sampler-seq 'kpq': unknown sampler letter 'q'"]),
    (("--dry-penalty-last-n", "-1"), ["Error: --dry-penalty-last-n -1: must be 0 or more"]),
    (("--xtc-probability", "nan"), ["Error: --xtc-probability nan: not a finite number"]),
])
def test_a_bad_sampler_value_is_one_error_naming_the_flag(tiny_model: Path, flags: tuple[str, ...],
                                                          lines: list[str]) -> None:
    code, out, err = complete(tiny_model, "-n", "1", *flags)
    assert (code, out, err[:1]) == (1, "", lines) and err[1].startswith("Hint: ")


def test_sampler_names_take_llama_cpps_aliases(tiny_model: Path) -> None:
    by_name = complete(tiny_model, "-n", "12", "--samplers", "top-k;Nucleus;temp", "--top-k", "5", "--top-p", "0.5")
    by_letter = complete(tiny_model, "-n", "12", "--sampler-seq", "kpt", "--top-k", "5", "--top-p", "0.5")
    assert by_name[0] == 0 and by_name[1] == by_letter[1]


def test_each_new_sampler_changes_the_sample(tiny_model: Path) -> None:
    # tiny's next-token distributions are nearly flat, so every active stage changes a seeded sample
    base = complete(tiny_model, "-n", "24", "--top-k", "0", "--min-p", "0", "--top-p", "1")[1]
    for flags in (("--xtc-probability", "1",
                  "--xtc-threshold", "0.001"), ("--top-n-sigma", "0.5"), ("--dynatemp-range", "0.7"),
                  ("--samplers", "temperature;adaptive_p", "--adaptive-target", "0.9")):
        code, out, _ = complete(tiny_model, "-n", "24", "--top-k", "0", "--min-p", "0", "--top-p", "1", *flags)
        assert code == 0 and out != base, flags
    # tiny's greedy text falls into a loop ("m m m ..."), which DRY breaks
    greedy = complete(tiny_model, "-n", "40", "--temp", "0")[1]
    assert greedy.endswith(" m m m m m")
    assert complete(tiny_model, "-n", "40", "--temp", "0", "--dry-multiplier", "1")[1][:40] != greedy[:40]


def test_dry_sequence_breaker_none_and_repeats(tiny_model: Path) -> None:
    from pyllama_cli.options.sampler_chain import dry_breakers

    assert dry_breakers(None) == ("\n", ":", '"', "*")
    assert dry_breakers(["a", "b"]) == ("a", "b")
    assert dry_breakers(["none"]) == ()
    assert complete(tiny_model, "-n", "4", "--dry-multiplier", "0.8", "--dry-sequence-breaker", "none")[0] == 0


def test_chat_set_takes_the_new_sampler_fields(tiny_model: Path) -> None:
    script = ("/set dry_sequence_breakers [\"\\n\", 1]\n/set dry_sequence_breakers {\n/set samplers kq\n"
              "/set xtc_probability 1.5\n/set samplers top_k;temp\n/set dry_multiplier 0.8\n"
              '/set dry_sequence_breakers ["\\n", ":"]\n/set top_nsigma 1.5\n')
    result = run_cli("chat", "-m", str(tiny_model), "-t", "1", "-c", "256", stdin=script)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("Hint:")]
    assert result.exit_code == 1 and lines[:8] == [
        "Error: dry_sequence_breakers needs a JSON array of strings, not '[\"\\\\n\", 1]'",
        "Error: dry_sequence_breakers needs a JSON array of strings, not '{'",
        "Error: samplers 'kq': unknown sampler letter 'q'",
        "Error: xtc_probability must be between 0 and 1, not 1.5",
        "samplers = 'top_k', 'temperature'",
        "dry_multiplier = 0.8",
        "dry_sequence_breakers = '\\n', ':'",
        "top_n_sigma = 1.5",
    ]


def test_server_reports_the_sampler_fields_it_ran_with() -> None:
    from pyllama_cli.server.job_rules import GenerationFields, chain_fields

    req = GenerationFields.model_validate({"dry_multiplier": 0.8, "dry_base": 0.5, "xtc_probability": 0.5,
                                           "samplers": "kt", "dry_sequence_breakers": ["\n"]})
    assert chain_fields(req) == {"dry_multiplier": 0.8, "xtc_probability": 0.5, "samplers": ("top_k", "temperature"),
                                 "dry_sequence_breakers": ("\n",)}
    assert json.loads(GenerationFields(samplers=["top_k"]).model_dump_json())["samplers"] == ["top_k"]


# ---------------------------------------------------------------- context


@pytest.mark.parametrize(("flags", "lines"), [
    (("--rope-scaling", "cubic"), ["Error: --rope-scaling 'cubic' is not a RoPE scaling method",
                                   "Hint: allowed values: none, linear, yarn"]),
    (("--rope-scale", "0"), ["Error: --rope-scale 0: must be above 0", "Hint: e.g. --rope-scale 2 doubles the context"]),
    (("--keep", "-2"), ["Error: --keep -2: must be -1 (the whole prompt) or 0 or more",
                        "Hint: the number of prompt tokens a context shift keeps"]),
])
def test_a_bad_context_value_is_one_error_naming_the_flag(tiny_model: Path, flags: tuple[str, ...],
                                                          lines: list[str]) -> None:
    assert complete(tiny_model, "-n", "1", *flags) == (1, "", lines)


def test_rope_flags_reach_the_context(tiny_model: Path) -> None:
    code, _, err = complete(tiny_model, "-n", "2", "--rope-scaling", "yarn", "--rope-scale", "4", "--verbose")
    assert code == 0 and "llama_context: freq_scale            = 0.25" in err
    code, _, err = complete(tiny_model, "-n", "2", "--rope-freq-base", "5000", "--verbose")
    assert code == 0 and "llama_context: freq_base             = 5000.0" in err


def test_a_context_shift_generates_past_the_context(tiny_model: Path) -> None:
    # llama.cpp rounds a context up to a multiple of 256 tokens: FAST's -c 256 is the smallest
    code, _, err = complete(tiny_model, "-n", "300", "--context-shift", "--keep", "2", "--ignore-eos", "--json")
    assert code == 0 and json.loads(err[-1])["generated_tokens"] == 300
    code, _, err = complete(tiny_model, "-n", "300", "--ignore-eos", "--json")
    assert json.loads(err[-1])["generated_tokens"] == 254  # 2 prompt tokens, and the last position left free


# ---------------------------------------------------------------- placement


@pytest.fixture(scope="session")
def moe_model(models_dir: Path) -> Path:
    from tests.fixtures.make_gguf import TINY_MOE, write_llama_gguf

    return write_llama_gguf(models_dir / "tiny-moe.gguf", TINY_MOE)


def overridden(err: list[str]) -> list[str]:
    return [line for line in err if "buffer type overridden to" in line]


def test_cpu_moe_and_n_cpu_moe_place_the_expert_weights(moe_model: Path) -> None:
    exps = [f"tensor blk.{i}.ffn_{kind}_exps.weight (1 MiB f32) buffer type overridden to CPU"
            for i in (0, 1) for kind in ("gate", "down", "up")]
    code, _, err = complete(moe_model, "-n", "2", "--cpu-moe", "--verbose")
    assert code == 0 and overridden(err) == exps
    code, _, err = complete(moe_model, "-n", "2", "-ncmoe", "1", "--verbose")
    assert code == 0 and overridden(err) == exps[:3]
    code, _, err = complete(moe_model, "-n", "2", "-ot", r"blk\.1\.ffn_up_exps=CPU,attn_q=CPU", "--verbose")
    assert code == 0 and overridden(err) == [
        "tensor blk.0.attn_q.weight (0 MiB f32) buffer type overridden to CPU",
        "tensor blk.1.attn_q.weight (0 MiB f32) buffer type overridden to CPU",
        "tensor blk.1.ffn_up_exps.weight (1 MiB f32) buffer type overridden to CPU"]


@pytest.mark.parametrize(("flags", "lines"), [
    (("-ot", "exps"), ["Error: -ot 'exps' has no '='", "Hint: give PATTERN=BUFTYPE, e.g. -ot 'exps=CPU'"]),
    (("-ot", "exps=VRAM9"), ["Error: -ot: unknown buffer type 'VRAM9'"]),
    (("-ncmoe", "-1"), ["Error: --n-cpu-moe -1: must be 0 or more"]),
    (("-sm", "diagonal"), ["Error: -sm 'diagonal' is not a split mode", "Hint: allowed values: none, layer, row, tensor"]),
])
def test_a_bad_placement_is_one_error_naming_the_flag(tiny_model: Path, flags: tuple[str, ...],
                                                      lines: list[str]) -> None:
    code, out, err = complete(tiny_model, "-n", "1", *flags)
    assert (code, out) == (1, "") and err[:len(lines)] == lines
    assert len(err) == 2 and err[1].startswith("Hint: ")


# ---------------------------------------------------------------- LLAMA_ARG_* variables


def test_llama_arg_variables_set_flags_and_the_command_line_beats_them(tiny_model: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_ARG_CACHE_TYPE_K", "q8_0")
    monkeypatch.setenv("LLAMA_ARG_N_CPU_MOE", "-3")
    monkeypatch.setenv("LLAMA_ARG_ROPE_FREQ_BASE", "5000")
    code, _, err = complete(tiny_model, "-n", "1", "--n-cpu-moe", "0", "-ctv", "q4_0", "--verbose")
    assert code == 0 and any("K (q8_0)" in line and "V (q4_0)" in line for line in err)
    assert "llama_context: freq_base             = 5000.0" in err
    code, _, err = complete(tiny_model, "-n", "1", "-ctk", "f16", "--rope-freq-base", "0")
    assert code == 1 and err[0] == "Error: --n-cpu-moe -3: must be 0 or more"  # the variable, where no flag is given
    monkeypatch.delenv("LLAMA_ARG_N_CPU_MOE")
    code, _, err = complete(tiny_model, "-n", "1", "-ctk", "f16", "--verbose")
    assert code == 0 and any("K (f16)" in line for line in err)
    monkeypatch.setenv("LLAMA_ARG_MODEL", str(tiny_model))  # a container recipe's model, no -m
    result = run_cli("complete", *FAST, "-n", "2")
    assert result.exit_code == 0 and result.stdout


def test_serve_reads_llama_servers_variables() -> None:
    import typer

    from pyllama_cli import cli

    serve = typer.main.get_command(cli.build_app("serve")).get_command(None, "serve")  # type: ignore[attr-defined]
    envvars = {p.name: p.envvar for p in serve.params}
    names = ["host", "port", "parallel", "model_path", "hf_repo"]
    assert [envvars[name] for name in names] == [
        "LLAMA_ARG_HOST", "LLAMA_ARG_PORT", "LLAMA_ARG_N_PARALLEL", "LLAMA_ARG_MODEL", "LLAMA_ARG_HF_REPO"]


# ---------------------------------------------------------------- bench


def test_bench_sweeps_override_groups_and_shows_them_as_llama_bench_does(moe_model: Path) -> None:
    result = run_cli("bench", "-m", str(moe_model), "-t", "1", "-r", "1", "-p", "8", "-n", "0", "-o", "json",
                     "-ot", "exps=CPU,,attn_q=CPU;attn_k=CPU", "-ctk", "f16,q8_0", "-ctv", "q8_0", "-fa", "on")
    rows = json.loads(result.stdout)
    assert result.exit_code == 0 and [(r["tensor_buft_overrides"], r["type_k"], r["type_v"]) for r in rows] == [
        ("exps=CPU", "f16", "q8_0"), ("exps=CPU", "q8_0", "q8_0"), ("none", "f16", "q8_0"), ("none", "q8_0", "q8_0"),
        ("attn_q=CPU;attn_k=CPU", "f16", "q8_0"), ("attn_q=CPU;attn_k=CPU", "q8_0", "q8_0")]
    md = run_cli("bench", "-m", str(moe_model), "-t", "1", "-r", "1", "-p", "8", "-n", "0", "-ot", "exps=CPU",
                 "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on")
    assert md.stdout.splitlines()[0] == (
        "| model                          |       size |     params | backend    | threads | type_k | type_v |  fa "
        "| ot                    |            test |                  t/s |   peak RSS |")


def test_models_preset_takes_cache_types_and_the_new_samplers(tmp_path: Path) -> None:
    from pyllama_cli.errors import UsageError
    from pyllama_cli.server.router.presets import load_presets

    preset = tmp_path / "models.ini"
    preset.write_text("[*]\nctk = q8_0\ncache-type-v = q4_0\ndry-multiplier = 0.8\n[tiny]\nxtc-probability = 0.5\n"
                      "dynatemp-exp = 1.5\n")
    assert load_presets(preset).settings_for("tiny") == {
        "cache_type_k": "q8_0", "cache_type_v": "q4_0", "dry_multiplier": 0.8, "xtc_probability": 0.5,
        "dynatemp_exponent": 1.5}
    preset.write_text("[*]\nctv = q3_k\n")
    with pytest.raises(UsageError) as bad:
        load_presets(preset)
    assert bad.value.message == f"{preset}:2: ctv = 'q3_k' is not one of {TYPES}"
