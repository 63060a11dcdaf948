"""`-hf user/repo[:quant]` resolution against a fake Hub on 127.0.0.1, and offline mode."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fixtures.fake_hf import FakeHub
from tests.fixtures.make_gguf import TINY, write_quantized, write_split_gguf
from tests.helpers import run_cli

REPO = "org/tiny-GGUF"


@pytest.fixture(scope="module")
def hub(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """A repo with several quants of the tiny model and a two-part split F16 model."""
    src = tmp_path_factory.mktemp("hub-files")
    files = {
        "tiny-F32.gguf": tiny_model,
        "tiny-Q8_0.gguf": write_quantized(tiny_model, src / "q8.gguf", "Q8_0"),
        "tiny-Q4_K_M.gguf": write_quantized(tiny_model, src / "q4km.gguf", "Q4_K_M"),
    }
    parts = write_split_gguf(src / "split", replace(TINY, ftype="F16"), 2)
    files["tiny-F16-00001-of-00002.gguf"] = parts[0]
    files["tiny-F16-00002-of-00002.gguf"] = parts[1]
    with FakeHub() as fake:
        fake.add_repo(REPO, {**files, "README.md": b"# tiny\n"})
        fake.add_repo("org/noq4-GGUF", {"b-Q8_0.gguf": files["tiny-Q8_0.gguf"], "a-F32.gguf": tiny_model})
        fake.add_repo("org/gated-GGUF", {"g-Q8_0.gguf": files["tiny-Q8_0.gguf"]}, gated=True, token="secret")
        yield fake


@pytest.fixture
def endpoint(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.clear_requests()
    return hub


def info_json(*args: str) -> dict:
    result = run_cli("info", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_quant_tag_downloads_that_file_into_the_hf_cache(endpoint: FakeHub, isolated_user_dirs: Path) -> None:
    data = info_json("-hf", f"{REPO}:Q8_0")
    assert data["quantization"] == "Q8_0"
    path = Path(data["path"])
    assert path.name == "tiny-Q8_0.gguf"
    assert path.is_relative_to(isolated_user_dirs / "hf" / "hub" / "models--org--tiny-GGUF")
    assert ("GET", f"/{REPO}/resolve/main/tiny-Q8_0.gguf") in endpoint.requests


def test_offline_after_download_makes_no_request(endpoint: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    info_json("-hf", f"{REPO}:Q8_0")
    endpoint.clear_requests()
    assert info_json("-hf", f"{REPO}:Q8_0", "--offline")["quantization"] == "Q8_0"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert info_json("-hf", f"{REPO}:q8_0")["quantization"] == "Q8_0"
    assert endpoint.requests == []


def test_absent_quant_lists_the_quants_present(endpoint: FakeHub) -> None:
    result = run_cli("info", "-hf", f"{REPO}:Q3_K_S")
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: {REPO} has no GGUF file for quant 'Q3_K_S'"
    assert f"Hint: quants in {REPO}: F16, F32, Q4_K_M, Q8_0 (use -hf {REPO}:QUANT)" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_tag_prefers_q4_k_m(endpoint: FakeHub) -> None:
    assert Path(info_json("-hf", REPO)["path"]).name == "tiny-Q4_K_M.gguf"


def test_no_tag_without_q4_k_m_takes_the_first_gguf(endpoint: FakeHub) -> None:
    assert Path(info_json("-hf", "org/noq4-GGUF")["path"]).name == "a-F32.gguf"


def test_tag_is_case_insensitive(endpoint: FakeHub) -> None:
    assert info_json("-hf", f"{REPO}:q4_k_m")["quantization"] == "Q4_K_M"


def test_hf_file_picks_an_exact_file(endpoint: FakeHub) -> None:
    assert Path(info_json("-hf", REPO, "-hff", "tiny-F32.gguf")["path"]).name == "tiny-F32.gguf"


def test_split_model_downloads_every_part(endpoint: FakeHub) -> None:
    data = info_json("-hf", f"{REPO}:F16")
    assert Path(data["path"]).name == "tiny-F16-00001-of-00002.gguf"
    assert data["split_count"] == 2
    assert data["parameters"] == 1_705_216
    gets = {p for m, p in endpoint.requests if m == "GET"}
    assert f"/{REPO}/resolve/main/tiny-F16-00002-of-00002.gguf" in gets


def test_unknown_repo(endpoint: FakeHub) -> None:
    result = run_cli("info", "-hf", "org/missing-GGUF")
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: Hugging Face repo not found: org/missing-GGUF"
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("how", "undo"), [("flag", "without --offline"), ("env", "with HF_HUB_OFFLINE unset")])
def test_offline_with_nothing_cached(how: str, undo: str, endpoint: FakeHub, isolated_user_dirs: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if how == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = run_cli("info", "-hf", f"{REPO}:Q8_0", *(["--offline"] if how == "flag" else []))
    assert result.exit_code == 1
    cache = isolated_user_dirs / "hf" / "hub"
    assert result.first_stderr_line == f"Error: offline mode: {REPO} is not in the local Hugging Face cache ({cache})"
    assert f"Hint: run once {undo} to download it: -hf {REPO}:Q8_0" in result.stderr
    assert endpoint.requests == []


def test_gated_repo_needs_a_token(endpoint: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_cli("info", "-hf", "org/gated-GGUF")
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: org/gated-GGUF is gated: your token has no access to it"
    assert info_json("-hf", "org/gated-GGUF", "--hf-token", "secret")["quantization"] == "Q8_0"


def test_unreachable_hub_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    result = run_cli("info", "-hf", f"{REPO}:Q8_0")
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: cannot reach http://127.0.0.1:9 to resolve {REPO}"
    assert "--offline" in result.stderr


def test_no_model_lists_cached_models(endpoint: FakeHub) -> None:
    info_json("-hf", f"{REPO}:Q8_0")
    result = run_cli("info")
    assert result.exit_code == 1
    assert f"-hf {REPO} -hff tiny-Q8_0.gguf" in result.stderr
