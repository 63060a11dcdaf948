"""Where a model's layers go, with llama.cpp's flags: `--rpc`, `-dev/--device`, `-ts/--tensor-split`, `--list-devices`.

Declared once here and added to every command that loads a model (`load.py`'s load flags, and
bench's). Their values are read by core/model/settings.py (bench's own parameters read them too); the
devices themselves are looked up by the core when the model loads (after the RPC servers are added),
so `--help` needs no library.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ...core.model.settings import parse_devices, parse_rpc, parse_tensor_split

__all__ = ["parse_devices", "parse_rpc", "parse_tensor_split"]  # the commands read the flags through here

DEVICE_PANEL = "Devices"

RpcOpt = Annotated[str | None, typer.Option(
    "--rpc", metavar="HOST:PORT,...", help="RPC servers (`pyllama rpc-server` or llama.cpp's rpc-server) whose "
    "devices hold part of the model, comma-separated.", rich_help_panel=DEVICE_PANEL, show_default=False)]
DeviceOpt = Annotated[str | None, typer.Option(
    "-dev", "--device", metavar="DEV,...", help="Devices to offload to, comma-separated (none = no offload; "
    "default: every GPU and RPC server). --list-devices names them.", rich_help_panel=DEVICE_PANEL,
    show_default=False)]
TensorSplitOpt = Annotated[str | None, typer.Option(
    "-ts", "--tensor-split", metavar="N0,N1,...", help="Each device's share of the layers, e.g. 3,1 "
    "(default: in proportion to free memory).", rich_help_panel=DEVICE_PANEL, show_default=False)]
ListDevicesOpt = Annotated[bool, typer.Option(
    "--list-devices", help="Print the devices (local, and the --rpc servers') with their memory and exit.",
    rich_help_panel=DEVICE_PANEL)]

# bench's, as llama-bench's: configurations separated by commas (a sweep), the items of one by /.
BenchDeviceOpt = Annotated[list[str] | None, typer.Option(
    "-dev", "--device", metavar="DEV/...,...", help="Devices to offload to: DEV/DEV... per configuration, "
    "configurations separated by commas (none = no offload; default: every GPU and RPC server).",
    rich_help_panel=DEVICE_PANEL, show_default=False)]
BenchTensorSplitOpt = Annotated[list[str] | None, typer.Option(
    "-ts", "--tensor-split", metavar="N0/N1/...,...", help="Each device's share of the layers, e.g. 3/1; "
    "configurations separated by commas.", rich_help_panel=DEVICE_PANEL, show_default=False)]

def list_devices(rpc: tuple[str, ...]) -> None:
    """Print every device (after adding the RPC servers) with its memory, as llama.cpp's --list-devices."""
    from ...core.model.rpc import add_servers, devices

    add_servers(rpc)
    lines = ["Available devices:"] + [f"  {dev.line()}" for dev in devices()]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    raise typer.Exit(0)
