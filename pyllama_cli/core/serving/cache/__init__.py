"""The prompt cache across slots: what a slot computed, kept for the next request that starts with it.

settings (the flags), key (what an entry depends on: model file, context settings, template),
native (a sequence's state to bytes and back, and copies between sequences), ram (the host-memory
tier, one LRU budget for every model of a server), disk (the folder tier, versioned and bounded),
prompt_cache (one engine's routes: own slot, another slot, RAM, disk; and their counters), reuse
(--cache-reuse: a slot's chunks that the prompt repeats later on, shifted into place).
"""
