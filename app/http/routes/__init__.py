"""HTTP routes: predict (plain Starlette, the hot path), the model descriptions, probes and metrics."""
