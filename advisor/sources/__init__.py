"""Sources: fetch and parse SGLang's observables (metrics, server info, logs) into plain dataclasses."""
