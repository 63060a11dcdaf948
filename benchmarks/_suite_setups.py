"""What each file of llama-server's test suite expects of the server it runs against (external mode):
the model fixture standing in for the suite's download and the flags of the file's ServerPreset, as
llama-server spells them (pyllama takes the same spellings). Used by llama_server_suite.py.

`fresh`: each test gets a new server (the file's tests read counters from zero, or wait for it to
idle). `per_test`: flags some tests set on top of (or instead of) the file's, by test-name prefix.
`env`: variables the server is started with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The flags of the suite's `tinyllama2` preset.
TINYLLAMA2 = ("--alias", "tinyllama-2", "-c", "512", "-b", "32", "-np", "2", "-n", "64", "--seed", "42",
              "--temp", "0.8")
# The public files CI runs (quick, one shared server each).
CI_FILES = ("unit/test_chat_completion.py", "unit/test_completion.py", "unit/test_tokenize.py",
            "unit/test_basic.py", "unit/test_security.py")


@dataclass(frozen=True)
class Setup:
    fixture: str = "tiny"  # tiny (the synthetic llama), reranker
    flags: tuple[str, ...] = TINYLLAMA2
    fresh: bool = False
    per_test: dict[str, tuple[str, ...]] = field(default_factory=dict)  # prefix -> flags replacing `flags`
    env: dict[str, str] = field(default_factory=dict)
    router: bool = False  # the file's preset is llama-server's router (run with --router)


def _with(*extra: str, base: tuple[str, ...] = TINYLLAMA2, drop: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`base` with flags replaced or added: `extra` is FLAG VALUE pairs or lone switches."""
    out = list(base)
    for flag in drop:
        i = out.index(flag)
        del out[i:i + 2]
    it = iter(extra)
    for flag in it:
        if flag in out and flag.startswith("-") and not flag.startswith("--no") and flag not in ("--metrics",):
            i = out.index(flag)
            out[i + 1] = next(it)
        else:
            out.append(flag)
    return tuple(out)


_BERT_BGE_SMALL = ("--alias", "bert-bge-small", "-c", "512", "-b", "128", "-ub", "128", "-np", "2", "--seed", "42",
                   "--embeddings")
_STORIES15M = ("--alias", "stories15m-moe", "-c", "2048", "-b", "1024", "-np", "1", "-n", "64", "--temp", "0",
               "--seed", "42")

SETUPS: dict[str, Setup] = {
    "unit/test_basic.py": Setup(per_test={"test_server_model_aliases_and_tags": _with(
        "--alias", "tinyllama-2,fim,code", "--tags", "chat,fim,small")}),
    "unit/test_security.py": Setup(flags=_with("--api-key", "sk-this-is-the-secret-key")),
    "unit/test_template.py": Setup(flags=_with("-np", "1")),
    # llama-server's built-in tools (read/write files, run shell commands) on loopback, as the file asks;
    # pyllama has no --tools, so its server does not start and the file's tests count as failed
    "unit/test_tools_builtin.py": Setup(flags=_with("--tools", "all")),
    "unit/test_compat_anthropic.py": Setup(flags=_with("--alias", "tinyllama-2-anthropic", "-np", "1", "-c", "8192",
                                                       "-b", "2048")),
    "unit/test_tool_call.py": Setup(flags=_with("--alias", "tinyllama-2-tool-call", "-np", "1", "-c", "8192", "-b",
                                                "2048")),
    "unit/test_compat_gcp.py": Setup(fresh=True, env={"AIP_MODE": "PREDICTION"}),
    "unit/test_ctx_shift.py": Setup(flags=_with("-c", "512", "-np", "2", "-n", "128"),
                                    per_test={"test_ctx_shift_enabled": _with("-n", "128", "--context-shift")}),
    "unit/test_kv_keep_only_active.py": Setup(flags=_with("-np", "2", "-n", "4", "--temp", "0", "--slots",
                                                          "--cache-ram", "100", "--kv-unified")),
    "unit/test_metrics.py": Setup(fresh=True, flags=_with("--metrics"),
                                  per_test={"test_metrics_disabled": TINYLLAMA2,
                                            "test_metrics_prompt_processed_and_cached": _with("--metrics", "-np", "1"),
                                            "test_metrics_slots_idle": _with("--metrics", "--slots"),
                                            "test_metrics_embedding": (*_BERT_BGE_SMALL, "--metrics")}),
    "unit/test_sleep.py": Setup(fresh=True, flags=_with("--sleep-idle-seconds", "1"),
                                per_test={"test_server_sleep_read_only": _with("--sleep-idle-seconds", "1", "--metrics"),
                                          "test_server_sleep_metrics": _with("--sleep-idle-seconds", "1", "--metrics")}),
    "unit/test_slot_save.py": Setup(flags=_with("--temp", "0", "--slot-save-path", "{work}")),
    "unit/test_speculative.py": Setup(flags=(*_STORIES15M, "--model-draft", "{model}", "--spec-type", "draft-simple",
                                             "--spec-draft-n-min", "4", "--spec-draft-n-max", "8", "-fa", "off")),
    "unit/test_embedding.py": Setup(flags=(*_BERT_BGE_SMALL, "--pooling", "last")),
    "unit/test_rerank.py": Setup(fixture="reranker", flags=("--alias", "jina-reranker", "-c", "512", "-b", "512",
                                                            "-np", "1", "--seed", "42", "--rerank")),
    "unit/test_lora.py": Setup(flags=(*_STORIES15M, "--lora", "{lora}")),
    "unit/test_infill.py": Setup(flags=("--alias", "tinyllama-infill", "-c", "2048", "-b", "1024", "-np", "1", "-n",
                                        "64", "--temp", "0", "--seed", "42")),
    "unit/test_proxy.py": Setup(per_test={"test_mcp_proxy": _with("--ui-mcp-proxy")}),  # not test_mcp_no_proxy
    "unit/test_router.py": Setup(router=True, flags=(), per_test={
        "test_router_props": ("--models-max", "2", "--no-models-autoload"),
        "test_router_models_max_evicts_lru": ("--models-max", "2"),
        "test_router_queue_coalesces": ("--models-max", "2"),
        "test_router_queue": ("--models-max", "1"),
        "test_router_download_model": ("--models-max", "1"),
        "test_router_no_models_autoload": ("--no-models-autoload",),
        "test_router_api_key_required": ("--api-key", "sk-router-secret")}),
}


def setup_of(file: str) -> Setup:
    """The setup of a suite file (or of one of its tests, by node id)."""
    return SETUPS.get(file.split("::")[0], Setup())


# llama-server switches pyllama has no flag for, because pyllama has the behaviour always on (/slots) or
# per request only (context shift in the server); /metrics is on by default in pyllama, off in llama-server.
_LLAMA_SERVER_ONLY = ("--slots", "--context-shift")


def pyllama_flags(flags: tuple[str, ...]) -> list[str]:
    """The same setup as pyllama serve spells it."""
    out = [flag for flag in flags if flag not in _LLAMA_SERVER_ONLY]
    return out if "--metrics" in out else [*out, "--no-metrics"]


def flags_for(setup: Setup, test_id: str) -> tuple[str, ...]:
    """The flags a test runs with: its per_test entry (by name prefix) or the file's."""
    name = test_id.split("::")[-1]
    return next((flags for prefix, flags in setup.per_test.items() if name.startswith(prefix)), setup.flags)
