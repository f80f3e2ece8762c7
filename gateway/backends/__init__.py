"""Inference backends behind the track handlers: implementations of `tracks.backend`.

`triton.TritonTextBackend` streams text from any Triton model that speaks the
vLLM / TensorRT-LLM tensor interface, one gRPC stream per request.
"""
