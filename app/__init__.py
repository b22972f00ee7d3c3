"""cudagraph-serve: CNNs over HTTP, one CUDA graph per batch size."""

__version__ = "0.2.0"
