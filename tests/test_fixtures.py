"""The test-support fixtures themselves: synthetic GGUF models and the fake Hub."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gguf
import httpx
import pytest
from huggingface_hub import HfApi, hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, RemoteEntryNotFoundError, RepositoryNotFoundError

from tests.fixtures.fake_hf import FAKE_COMMIT, FakeHub
from tests.fixtures.make_gguf import (
    CHATML_TEMPLATE,
    IM_END_ID,
    IM_START_ID,
    TINY,
    count_parameters,
    split_file_names,
    write_llama_gguf,
    write_quantized,
    write_split_gguf,
)

# "hello world" with BOS: <s>, "▁hello", "▁world".
HELLO_WORLD_IDS = [1, 263, 264]


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("fixture-models") / "tiny.gguf", TINY)


@pytest.fixture(scope="module")
def tiny_llm(tiny_gguf: Path):
    # One thread: llama.cpp workers spin while waiting, which crawls on a busy 2-core machine.
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(tiny_gguf), n_ctx=256, n_threads=1, verbose=False)


def _greedy(llm, prompt: str = "hello world") -> dict:
    return llm(prompt, max_tokens=16, temperature=0.0)


# --- make_gguf ---------------------------------------------------------------


def test_tiny_metadata_reads_back(tiny_gguf: Path) -> None:
    reader = gguf.GGUFReader(tiny_gguf)
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.ALL_F32
    assert _field(reader, "llama.block_count") == 2
    assert _field(reader, "llama.embedding_length") == 256
    assert _field(reader, "llama.attention.head_count_kv") == 2
    assert _field(reader, "llama.rope.dimension_count") == 64
    assert _field(reader, "llama.vocab_size") == 1024
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == 1024
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3] == "<0x00>" and tokens[258] == "<0xFF>"
    assert tokens[IM_START_ID] == "<|im_start|>" and tokens[IM_END_ID] == "<|im_end|>"
    assert len(set(tokens)) == len(tokens)
    assert _field(reader, "tokenizer.ggml.eot_token_id") == IM_END_ID
    assert _field(reader, "tokenizer.chat_template") == CHATML_TEMPLATE
    assert len(reader.tensors) == 21


def test_tiny_shapes_match_llama_layout(tiny_gguf: Path) -> None:
    shapes = {t.name: list(t.shape) for t in gguf.GGUFReader(tiny_gguf).tensors}
    # GGUF lists dimensions innermost first: {n_embd, n_vocab} for the embeddings.
    assert shapes["token_embd.weight"] == [256, 1024]
    assert shapes["blk.0.attn_k.weight"] == [256, 128]
    assert shapes["blk.1.ffn_down.weight"] == [512, 256]
    assert shapes["output.weight"] == [256, 1024]
    assert count_parameters(TINY) == 1_705_216


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path, tiny_gguf: Path) -> None:
    again = write_llama_gguf(tmp_path / "again.gguf", TINY)
    other = write_llama_gguf(tmp_path / "other.gguf", replace(TINY, seed=1))
    assert again.read_bytes() == tiny_gguf.read_bytes()
    assert other.read_bytes() != tiny_gguf.read_bytes()


def test_f16_keeps_norms_f32(tmp_path: Path) -> None:
    path = write_llama_gguf(tmp_path / "f16.gguf", replace(TINY, ftype="F16"))
    reader = gguf.GGUFReader(path)
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32


def test_split_files_follow_gguf_split_layout(tmp_path: Path) -> None:
    parts = write_split_gguf(tmp_path / "tiny", TINY, 3)
    assert [p.name for p in parts] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert parts == split_file_names(tmp_path / "tiny.gguf", 3)
    readers = [gguf.GGUFReader(p) for p in parts]
    assert [_field(r, "split.no") for r in readers] == [0, 1, 2]
    assert {_field(r, "split.count") for r in readers} == {3}
    assert {_field(r, "split.tensors.count") for r in readers} == {21}
    assert [len(r.tensors) for r in readers] == [7, 7, 7]
    assert "general.architecture" in readers[0].fields
    assert "general.architecture" not in readers[1].fields


# --- llama.cpp loads what make_gguf writes -------------------------------------


def test_llama_cpp_tokenizes_into_words(tiny_llm) -> None:
    ids = tiny_llm.tokenize(b"hello world")
    assert ids == HELLO_WORLD_IDS
    assert [tiny_llm.detokenize([i]) for i in ids[1:]] == [b" hello", b" world"]
    assert tiny_llm.tokenize(b"<|im_start|><|im_end|>", add_bos=False, special=True) == [IM_START_ID, IM_END_ID]


def test_greedy_generation_is_deterministic(tiny_llm) -> None:
    first, second = _greedy(tiny_llm), _greedy(tiny_llm)
    assert first["usage"]["completion_tokens"] == 16
    assert first["choices"][0]["text"] == second["choices"][0]["text"]


def test_split_model_loads_and_matches_single_file(tmp_path: Path, tiny_llm) -> None:
    import llama_cpp

    first_part = write_split_gguf(tmp_path / "tiny", TINY, 3)[0]
    split_llm = llama_cpp.Llama(model_path=str(first_part), vocab_only=False, n_ctx=64, n_threads=1, verbose=False)
    assert split_llm.tokenize(b"hello world") == HELLO_WORLD_IDS
    assert _greedy(split_llm)["choices"][0]["text"] == _greedy(tiny_llm)["choices"][0]["text"]


@pytest.mark.parametrize(("type_name", "file_type"), [("Q8_0", 7), ("Q4_0", 2), ("Q4_K_M", 15)])
def test_quantized_copy_loads(tmp_path: Path, tiny_gguf: Path, type_name: str, file_type: int) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    out = write_quantized(tiny_gguf, tmp_path / f"tiny-{type_name}.gguf", type_name)
    assert _field(gguf.GGUFReader(out), "general.file_type") == file_type
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=64, n_threads=1, verbose=False)
    assert llm.tokenize(b"hello world") == HELLO_WORLD_IDS


# --- fake_hf -------------------------------------------------------------------


@pytest.fixture
def hub():
    with FakeHub() as running:
        running.add_repo("org/tiny-GGUF", {"tiny.gguf": b"GGUF-bytes", "README.md": b"# tiny\n", "sub/a.txt": b"a"})
        running.add_repo("org/gated-GGUF", {"m.gguf": b"secret"}, gated=True, token="hf_right")
        yield running


def test_listing_and_model_info(hub: FakeHub) -> None:
    api = HfApi(endpoint=hub.url, token=False)
    assert api.list_repo_files("org/tiny-GGUF") == ["README.md", "sub/a.txt", "tiny.gguf"]
    assert hub.requests == [("GET", "/api/models/org/tiny-GGUF/tree/main")]
    tree = {entry.path: entry for entry in api.list_repo_tree("org/tiny-GGUF", recursive=True)}
    assert tree["tiny.gguf"].size == 10 and tree["tiny.gguf"].lfs is not None
    assert tree["README.md"].lfs is None and "sub" in tree
    info = api.model_info("org/tiny-GGUF", files_metadata=True)
    assert info.sha == FAKE_COMMIT
    assert {s.rfilename: s.size for s in info.siblings} == {"README.md": 7, "sub/a.txt": 1, "tiny.gguf": 10}


def test_refs_name_the_branch_and_its_commit(hub: FakeHub) -> None:
    """llama.cpp's -hf asks a repo's refs first (llama_server_suite.py runs llama-server against the fake Hub)."""
    refs = httpx.get(f"{hub.url}/api/models/org/tiny-GGUF/refs", timeout=10).json()
    assert refs["branches"] == [{"name": "main", "ref": "refs/heads/main", "targetCommit": FAKE_COMMIT}]
    assert httpx.get(f"{hub.url}/api/models/org/missing/refs", timeout=10).status_code == 404


def test_download_then_cache_hit(hub: FakeHub, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = hf_hub_download("org/tiny-GGUF", "tiny.gguf", endpoint=hub.url, cache_dir=cache, token=False)
    assert Path(path).read_bytes() == b"GGUF-bytes"
    assert hub.requests == [("HEAD", "/org/tiny-GGUF/resolve/main/tiny.gguf"),
                            ("GET", "/org/tiny-GGUF/resolve/main/tiny.gguf")]
    hub.clear_requests()
    again = hf_hub_download("org/tiny-GGUF", "tiny.gguf", endpoint=hub.url, cache_dir=cache, token=False)
    assert again == path
    assert [method for method, _ in hub.requests] == ["HEAD"]  # revalidated, not downloaded
    hub.clear_requests()
    assert try_to_load_from_cache("org/tiny-GGUF", "tiny.gguf", cache_dir=cache) == path
    assert hf_hub_download("org/tiny-GGUF", "tiny.gguf", cache_dir=cache, local_files_only=True) == path
    assert hub.requests == []


def test_error_types(hub: FakeHub, tmp_path: Path) -> None:
    def download(repo_id: str, filename: str, token):
        return hf_hub_download(repo_id, filename, endpoint=hub.url, cache_dir=tmp_path, token=token)

    with pytest.raises(RepositoryNotFoundError):
        download("org/missing", "tiny.gguf", False)
    with pytest.raises(RemoteEntryNotFoundError):
        download("org/tiny-GGUF", "missing.gguf", False)
    with pytest.raises(GatedRepoError):
        download("org/gated-GGUF", "m.gguf", False)
    with pytest.raises(GatedRepoError):
        download("org/gated-GGUF", "m.gguf", "hf_wrong")
    assert Path(download("org/gated-GGUF", "m.gguf", "hf_right")).read_bytes() == b"secret"
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.url, token=False).model_info("org/missing")


def test_range_requests(hub: FakeHub) -> None:
    url = f"{hub.url}/org/tiny-GGUF/resolve/main/tiny.gguf"
    partial = httpx.get(url, headers={"Range": "bytes=5-"})
    assert partial.status_code == 206
    assert partial.headers["Content-Range"] == "bytes 5-9/10"
    assert partial.content == b"bytes"
    head = httpx.head(url)
    assert head.headers["X-Repo-Commit"] == FAKE_COMMIT
    assert head.headers["Accept-Ranges"] == "bytes"
    assert not any(name.lower().startswith("x-xet") for name in head.headers)


def test_hf_endpoint_in_a_subprocess(hub: FakeHub, tmp_path: Path) -> None:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "cache")}
    script = "from huggingface_hub import hf_hub_download; print(hf_hub_download('org/tiny-GGUF', 'README.md'))"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).read_bytes() == b"# tiny\n"
