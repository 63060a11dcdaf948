"""Where a model runs, as flags: devices.py (-dev, -ts, --rpc, --list-devices), cpu.py (the thread
pools' -t/-tb, -C, --prio, --poll, --cpu-strict) and placement.py (-ot, --cpu-moe, -sm, -mg)."""
