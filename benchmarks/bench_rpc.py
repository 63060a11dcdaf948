"""`pyllama bench --rpc` vs llama.cpp's `llama-bench --rpc`: pp and tg over 2 loopback RPC servers.

Two of llama.cpp's RPC servers (`ggml-rpc-server`, or `rpc-server` in older builds; `--servers pyllama`
starts `pyllama rpc-server` instead) listen on 127.0.0.1 with free ports. Both tools then measure
the realistic-shape model with its layers split over the two servers in the same way (`-ngl 99 -ts
1/1`, `-p 256 -n 64 -r 5` by default), each writing `-o json`; runs are interleaved A,B,B,A. Both
clients talk to the very same server processes (one client at a time, as an RPC server serves them),
so the comparison is of the clients alone. Target: pyllama's pp and tg t/s each at least 0.97x
llama-bench's. The table also checks that both put the same backend (RPC) and split in their rows.

On a 2-core machine the servers and the client share the cores: the absolute t/s say nothing about
RPC across machines, only the ratio counts.

    python benchmarks/bench_rpc.py [--llama-cpp-bin DIR] [-m MODEL] [-t THREADS] [--repeat 3]
        [-p 256] [-n 64] [-r 5] [--server-threads 1] [--servers llama.cpp|pyllama]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _common import (
    base_parser,
    bench_model,
    free_port,
    llama_cpp_bin,
    print_pp_tg_report,
    pyllama_cmd,
    run_timed,
    start_rpc_server,
    turn_order,
)


def rpc_server_cmd(kind: str, bin_dir: Path, threads: int) -> list[str]:
    if kind == "pyllama":
        return [*pyllama_cmd(), "rpc-server", "-t", str(threads)]
    for name in ("ggml-rpc-server", "rpc-server"):
        if (bin_dir / name).exists():
            return [str(bin_dir / name), "-t", str(threads)]
    sys.exit(f"no ggml-rpc-server (or rpc-server) in {bin_dir}: build llama.cpp with -DGGML_RPC=ON "
             "(shared/tools/build-llamacpp-ref.sh does)")


def rows_of(stdout: bytes) -> dict[str, dict]:
    return {("pp" if r["n_gen"] == 0 else "tg"): r for r in json.loads(stdout)}


def check_same(ref: dict[str, dict], ours: dict[str, dict]) -> None:
    keys = ("model_type", "model_n_params", "n_threads", "n_prompt", "n_gen", "backends", "n_gpu_layers",
            "tensor_split")
    a = {kind: {k: r[k] for k in keys} for kind, r in ref.items()}
    b = {kind: {k: r[k] for k in keys} for kind, r in ours.items()}
    if a != b:
        sys.exit(f"the two tools measured different things:\n  llama-bench {a}\n  pyllama     {b}")
    if any(r["backends"] != "RPC" for r in ref.values()):
        sys.exit(f"llama-bench did not run on the RPC backend: {[r['backends'] for r in ref.values()]}")


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("-p", "--n-prompt", type=int, default=256)
    p.add_argument("-n", "--n-gen", type=int, default=64)
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("--server-threads", type=int, default=1, help="threads of each RPC server's CPU device")
    p.add_argument("--servers", choices=("llama.cpp", "pyllama"), default="llama.cpp",
                   help="whose RPC server to start (the clients compared are the same either way)")
    args = p.parse_args()
    bin_dir = llama_cpp_bin(args.llama_cpp_bin)
    model = str(args.model or bench_model("Q4_0"))
    ports = [free_port(), free_port()]
    servers = [start_rpc_server(rpc_server_cmd(args.servers, bin_dir, args.server_threads), port) for port in ports]
    rpc = ",".join(f"127.0.0.1:{port}" for port in ports)
    common = ["-m", model, "-t", str(args.threads), "-p", str(args.n_prompt), "-n", str(args.n_gen),
              "-r", str(args.repetitions), "-ngl", "99", "-ts", "1/1", "--rpc", rpc, "-o", "json"]
    runs: dict[str, dict[str, list[float]]] = {"ref": {"pp": [], "tg": []}, "ours": {"pp": [], "tg": []}}
    try:
        for i in range(args.repeat):
            order = [("ref", [str(bin_dir / "llama-bench"), *common]), ("ours", [*pyllama_cmd(), "bench", *common])]
            outputs = {}
            for name, cmd in turn_order(i, order):
                _, proc = run_timed(cmd)
                outputs[name] = rows_of(proc.stdout)
                for kind, row in outputs[name].items():
                    runs[name][kind].append(float(row["avg_ts"]))
            check_same(outputs["ref"], outputs["ours"])
            print(f"round {i + 1}: llama-bench pp {runs['ref']['pp'][-1]:.2f} tg {runs['ref']['tg'][-1]:.2f} | "
                  f"pyllama pp {runs['ours']['pp'][-1]:.2f} tg {runs['ours']['tg'][-1]:.2f} t/s", file=sys.stderr)
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)
    print(f"2 RPC servers ({args.servers}) on {rpc}, -ngl 99 -ts 1/1, backend RPC in both tools' rows")
    print_pp_tg_report(runs, (f"pp{args.n_prompt} t/s over RPC", f"tg{args.n_gen} t/s over RPC"))


if __name__ == "__main__":
    main()
