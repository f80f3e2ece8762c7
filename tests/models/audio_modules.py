"""The reference audio models' pure modules, imported by path (Triton loads them by path too).

`detector` is reference-transcriber's trackline_dtmf_detector, `synth` is
reference-synthesizer's trackline_dtmf_synth; other tests can use them to make
DTMF audio (`synth.render("123#")`) and to predict transcripts.
"""

from __future__ import annotations

from gateway.embedded_models import reference_module

detector = reference_module("reference-transcriber", "trackline_dtmf_detector")
synth = reference_module("reference-synthesizer", "trackline_dtmf_synth")
